"""Read the dataset columns a config needs, typed as the handlers want them.

CSV/TSV columns are read as strings (category-like types: ``4`` stays ``"4"``) or float64 (numbers)
directly by the pyarrow reader. When a number column cannot be parsed, the columns are re-read as
strings to name the first bad value's line. In-memory tables and Parquet/JSONL columns are cast.
Line numbers are ``row + 2`` for CSV/TSV (header on line 1) and ``row + 1`` for JSONL; a quoted CSV
value spanning several lines shifts the lines after it (the row is still right).
"""

from __future__ import annotations

import csv
import functools
import io
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.errors import ConfigError, DataFileError, SchemaError
from datamill.core.io import (
    csv_options,
    detect_format,
    display_name,
    open_bytes,
    read_table,
    split_member,
)

__all__ = ["Dataset", "PANDAS_NA_VALUES", "cast_column", "read_dataset", "read_types"]  # noqa: RUF022 - Python sorted() order (house rule)

#: the CSV/TSV cells read as missing: pandas' ``read_csv`` default list (what Ludwig reads CSVs
# with)
PANDAS_NA_VALUES = (
    "",
    "#N/A",
    "#N/A N/A",
    "#NA",
    "-1.#IND",
    "-1.#QNAN",
    "-NaN",
    "-nan",
    "1.#IND",
    "1.#QNAN",
    "<NA>",
    "N/A",
    "NA",
    "NULL",
    "NaN",
    "None",
    "n/a",
    "nan",
    "null",
)

_NUMBER_RE = r"^\s*[-+]?((\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|inf|infinity|nan)\s*$"


@dataclass
class Dataset:
    """A table plus where it came from."""

    table: pa.Table
    name: str | None  # display name for errors (None: in memory)
    base_dir: Path | None
    line_offset: int | None  # line of row 0 (CSV/TSV 2, JSONL 1), None for row-addressed formats
    stem: str | None


def _header(source: Any, kind: str) -> list[str]:
    with open_bytes(source) as f:
        head = f.read(1 << 16)
    first = head.split(b"\n", 1)[0].decode("utf-8", errors="replace").lstrip("\ufeff")
    return next(csv.reader(io.StringIO(first), delimiter="\t" if kind == "tsv" else ","), [])


def _missing(column: str, available: list[str], name: str | None) -> SchemaError:
    close = [c for c in available if c.lower() == column.lower()]
    hint = (
        f"did you mean {close[0]!r}?"
        if close
        else f"available columns: {', '.join(available[:30])}"
    )
    return SchemaError(
        "the config names this column but the dataset has no such column",
        path=name,
        column=column,
        hint=hint,
    )


def _nan_to_null(col: pa.Array) -> pa.Array:
    """NaN is a missing value (as in pandas), so the missing-value strategy applies to it."""
    nan = pc.is_nan(col)
    if not pc.any(nan).as_py():
        return col
    return pc.if_else(nan, pa.scalar(None, pa.float64()), col)


def cast_column(
    col: pa.ChunkedArray | pa.Array,
    target: str,
    *,
    name: str | None,
    column: str,
    line_offset: int | None,
    row_offset: int = 0,
    rows: NDArray[np.int64] | None = None,
) -> pa.Array:
    """Cast a column to ``"string"`` or ``"float64"``; unparsable numbers raise with their location.

    ``"binary"`` (audio: file paths or the files' bytes) keeps a binary or string column as it is.
    The location of local row ``i`` is ``rows[i]`` when given (rows were dropped), else ``row_offset
    + i``.
    """
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    t = col.type
    if target == "binary" and (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        return col.cast(pa.binary())
    target = "string" if target == "binary" else target
    where = functools.partial(_where, rows=rows, row_offset=row_offset, line_offset=line_offset)
    if any(unreadable(t) for unreadable in _UNREADABLE):
        valid = np.flatnonzero(col.is_valid().to_numpy(zero_copy_only=False))
        want = "numbers" if target == "float64" else "strings"
        raise DataFileError(
            f"the column holds {t} values; this feature type reads {want}",
            path=name,
            column=column,
            hint="choose a feature type for this column's values, or convert the "
            "column (e.g. to strings) first",
            **where(int(valid[0]) if len(valid) else 0),
        )
    if target == "float64":
        return _to_float64(col, where, name=name, column=column)
    return _to_string(col)


#: types no feature reads (a column of them is refused, naming its first value's row)
_UNREADABLE = (
    pa.types.is_nested,
    pa.types.is_binary,
    pa.types.is_large_binary,
    pa.types.is_fixed_size_binary,
)
#: types cast to float64 as they are
_NUMERIC = (pa.types.is_floating, pa.types.is_integer, pa.types.is_boolean)


def _where(
    i: int, *, rows: NDArray[np.int64] | None, row_offset: int, line_offset: int | None
) -> dict[str, int]:
    """The location of local row ``i`` (``line`` in a text file, else ``row``)."""
    row = int(rows[i]) if rows is not None else row_offset + i
    return {"line": line_offset + row} if line_offset is not None else {"row": row}


def _to_float64(
    col: pa.Array, where: Callable[[int], dict[str, int]], *, name: str | None, column: str
) -> pa.Array:
    """Numbers as float64 (NaN as null); strings parsed, the first unparsable one raising."""
    if any(numeric(col.type) for numeric in _NUMERIC):
        return _nan_to_null(col.cast(pa.float64()))
    strings = col.cast(pa.string())
    ok = pc.match_substring_regex(strings, _NUMBER_RE, ignore_case=True)
    bad = np.flatnonzero(~pc.fill_null(ok, True).to_numpy(zero_copy_only=False))
    if len(bad):
        i = int(bad[0])
        raise DataFileError(
            f"expected a number, got {strings[i].as_py()!r}",
            path=name,
            column=column,
            hint="fix the value or declare the feature with another type",
            **where(i),
        )
    return _nan_to_null(pc.cast(pc.utf8_trim_whitespace(strings), pa.float64()))


def _to_string(col: pa.Array) -> pa.Array:
    """Any readable column as strings; booleans as ``"true"``/``"false"``."""
    if pa.types.is_string(col.type):
        return col
    if pa.types.is_boolean(col.type):
        return pc.if_else(col, "true", "false")
    # dictionaries, large strings, the rest; floats too: pandas turns an int column with NaN into
    # float, and pyarrow's cast writes 4.0 as "4", keeping identity
    return col.cast(pa.string())


def _fast_csv(
    path: Path, member: str | None, kind: str, columns: list[str], types: dict[str, pa.DataType]
) -> pa.Table | None:
    """Read a plain CSV file straight from disk (no extra copy); ``None`` when the careful path is
    needed."""
    import pyarrow.csv as pcsv

    if member is not None or path.suffix.lower() == ".gz" or path.stat().st_size < 16:
        return None
    try:
        options = csv_options(kind, columns=columns, column_types=types)
        options["convert_options"].null_values = list(PANDAS_NA_VALUES)
        table = pcsv.read_csv(path, **options)
        for col in table.columns:
            if (
                not pa.types.is_string(col.type)
                and not pa.types.is_floating(col.type)
                and not pa.types.is_integer(col.type)
                and not pa.types.is_boolean(col.type)
            ):
                return None
            if pa.types.is_string(col.type):
                col.validate(full=True)
    except (pa.ArrowException, OSError, ValueError):
        return None
    return table


_PANDAS_COLUMN_RE = re.compile(r"[Cc]onversion failed for column (?P<col>.+?) with type")


def as_table(dataset: Any) -> pa.Table:
    """A pyarrow Table or pandas DataFrame as a Table; anything else (but a path) is a ConfigError.

    Raises:
        DataFileError: a DataFrame column of mixed types or nested values (``column`` set).
        ConfigError: ``dataset`` is not a path, a DataFrame or a Table.

    Examples:
        >>> as_table(42)  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: dataset must be a file path, a pandas DataFrame or a
        pyarrow Table, got int
    """
    if isinstance(dataset, pa.Table):
        return dataset
    if type(dataset).__name__ == "DataFrame" and hasattr(dataset, "to_numpy"):
        try:
            return pa.Table.from_pandas(dataset, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            m = _PANDAS_COLUMN_RE.search(str(exc))
            raise DataFileError(
                f"cannot convert the column: {str(exc).splitlines()[0]}",
                path="<DataFrame>",
                column=m.group("col") if m else None,
                hint="give the column one type (e.g. df[col].astype(str)) or drop it",
            ) from exc
    raise ConfigError(
        "dataset must be a file path, a pandas DataFrame or a pyarrow Table, got "
        f"{type(dataset).__name__}"
    )


def read_dataset(
    dataset: Any,
    wanted: dict[str, str],
    *,
    optional: tuple[str, ...] = (),
    fmt: str | None = None,
) -> Dataset:
    """Read ``wanted`` (column → "string"/"float64"/"raw") from a path, DataFrame or Table.

    Columns in ``optional`` may be absent (they are then left out of the table). ``fmt``: the
    file's format (:data:`~datamill.preprocessing.formats.FORMATS`), None: from its extension.
    """
    if isinstance(dataset, (str, os.PathLike)):
        return _read_file(dataset, wanted, optional, fmt)
    table = as_table(dataset)
    name, base, line0, stem = None, None, None, None
    wanted = _present(wanted, optional, table.column_names)
    for c in wanted:
        if c not in table.column_names:
            raise _missing(c, table.column_names, name)
    return Dataset(table.select(list(wanted)), name, base, line0, stem)


def _pandas_nulls(table: pa.Table) -> pa.Table:
    """Every string cell spelled as one of :data:`PANDAS_NA_VALUES` made null."""
    na = pa.array(PANDAS_NA_VALUES, pa.string())
    for i, col in enumerate(table.columns):
        if pa.types.is_string(col.type):
            table = table.set_column(
                i,
                table.field(i),
                pc.if_else(pc.is_in(col, value_set=na), pa.scalar(None, pa.string()), col),
            )
    return table


def _present(
    wanted: dict[str, str], optional: tuple[str, ...], available: list[str]
) -> dict[str, str]:
    return {c: t for c, t in wanted.items() if c not in optional or c in available}


def read_types(wanted: dict[str, str]) -> dict[str, pa.DataType]:
    """The Arrow type a CSV column is read as: float64 or string (a ``"raw"`` one is inferred).

    Examples:
        >>> read_types({"x": "float64", "s": "string", "r": "raw"})
        {'x': DataType(double), 's': DataType(string)}
    """
    return {
        c: pa.float64() if t == "float64" else pa.string() for c, t in wanted.items() if t != "raw"
    }


def _read_csv(
    source: Any, kind: str, wanted: dict[str, str], optional: tuple[str, ...]
) -> pa.Table:
    """The wanted columns of a CSV/TSV file: numbers as float64 on the fast path, else strings.

    Raises:
        SchemaError: a wanted column is not in the header.
    """
    path, member = split_member(source)
    name = display_name(source)
    header = _header(source, kind)
    wanted = _present(wanted, optional, header)
    if header and any(h.strip() for h in header):
        for c in wanted:
            if c not in header:
                raise _missing(c, header, name)
    table = _fast_csv(path, member, kind, list(wanted), read_types(wanted))
    if table is None:  # anything unusual: the foundation reader raises the located error
        table = read_table(
            source,
            fmt=kind,
            columns=list(wanted),
            column_types={c: pa.string() for c, t in wanted.items() if t != "raw"},
        )
        table = _pandas_nulls(table)  # number columns are cast (with located errors) block by block
    return table


def _read_file(
    source: Any, wanted: dict[str, str], optional: tuple[str, ...] = (), fmt: str | None = None
) -> Dataset:
    from datamill.preprocessing.formats import extra_format, read_extra

    path, member = split_member(source)
    extra = extra_format(source, fmt)
    kind = extra or detect_format(source, "jsonl" if fmt == "json" else fmt)
    name = display_name(source)
    base = path.parent
    stem = Path(member).name if member else path.name
    stem = re.sub(
        r"\.(csv|tsv|parquet|jsonl|json|txt|feather|arrow|ipc|orc|xlsx|xls|h5|hdf5|fwf)(\.gz)?$",
        "",
        stem,
        flags=re.IGNORECASE,
    )
    if kind in ("csv", "tsv"):
        return Dataset(_read_csv(source, kind, wanted, optional), name, base, 2, stem)
    table = read_extra(source, kind) if extra else read_table(source, fmt=kind)
    wanted = _present(wanted, optional, table.column_names)
    for c in wanted:
        if c not in table.column_names:
            raise _missing(c, table.column_names, name)
    return Dataset(table.select(list(wanted)), name, base, 1 if kind == "jsonl" else None, stem)
