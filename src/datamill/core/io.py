"""Reading inputs and writing outputs safely.

* :func:`split_member` / :func:`open_bytes` / :func:`read_text` understand ``archive.zip:member``.
* :func:`read_table` reads CSV, TSV, Parquet and JSONL into a pyarrow Table, turning every parse
  failure into a :class:`~datamill.core.errors.DataFileError` that names the file and line.
* The output side (:func:`check_output`, :func:`atomic_write`, :func:`atomic_path`,
  :func:`atomic_dir`, litter cleaning, full disks) lives in :mod:`datamill.core.output` and is
  re-exported here.
"""

from __future__ import annotations

import io
import os
import re
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from datamill.core.errors import DataFileError, DataFileNotFoundError, SchemaError
from datamill.core.output import (
    PathLike,
    as_output_error,
    atomic_dir,
    atomic_path,
    atomic_write,
    check_output,
    clean_stale_temps,
    find_litter,
    is_datamill_output,
)

__all__ = [
    "PathLike",
    "as_output_error",
    "atomic_dir",
    "atomic_path",
    "atomic_write",
    "check_output",
    "check_utf8",
    "clean_stale_temps",
    "detect_format",
    "display_name",
    "find_litter",
    "is_blank",
    "is_datamill_output",
    "open_bytes",
    "read_bytes",
    "read_table",
    "read_text",
    "split_member",
]

_FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".txt": "text",
    ".raw": "text",
    ".tokens": "text",
}


def split_member(source: PathLike) -> tuple[Path, str | None]:
    """Split ``'ptb.zip:ptb/ptb.train.txt'`` into ``(Path('ptb.zip'), 'ptb/ptb.train.txt')``.

    Examples:
        >>> split_member("data/ptb.zip:ptb/ptb.train.txt")
        (PosixPath('data/ptb.zip'), 'ptb/ptb.train.txt')
        >>> split_member("train.csv")
        (PosixPath('train.csv'), None)
    """
    text = os.fspath(source)
    m = re.match(r"^(.*?\.zip):(.+)$", text)
    if m and not Path(text).exists():
        return Path(m.group(1)), m.group(2)
    return Path(text), None


def display_name(source: PathLike) -> str:
    """The name used in messages: the path, or ``archive.zip:member``."""
    return os.fspath(source)


def read_bytes(source: PathLike) -> bytes:
    """Read a file or a zip member completely."""
    with open_bytes(source) as f:
        return f.read()


@contextmanager
def open_bytes(source: PathLike) -> Iterator[IO[bytes]]:
    """Open a file or ``archive.zip:member`` for binary reading, with clear not-found errors."""
    path, member = split_member(source)
    if not path.exists():
        raise DataFileNotFoundError(
            "no such file",
            path=path,
            hint="check the path (relative paths are from the current folder)",
        )
    if path.is_dir():
        raise DataFileError("expected a file, found a folder", path=path)
    if member is None:
        with open(path, "rb") as f:
            yield f
        return
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        raise DataFileError("not a valid zip archive", path=path) from exc
    with zf:
        try:
            info = zf.getinfo(member)
        except KeyError as exc:
            names = [n for n in zf.namelist() if not n.endswith("/")]
            raise DataFileNotFoundError(
                f"no member {member!r} in the archive; it holds {names[:10]}", path=path
            ) from exc
        with zf.open(info) as f:
            try:
                yield f
            except (
                zipfile.BadZipFile,
                zlib.error,
                EOFError,
            ) as exc:  # a bad CRC or corrupt data shows on read
                raise DataFileError(
                    f"the archive member {member!r} is corrupt ({exc})",
                    path=path,
                    hint="re-download or re-create the archive",
                ) from exc


def check_utf8(data: bytes, *, path: PathLike) -> str:
    """Decode ``data`` as UTF-8 or raise a DataFileError naming the line of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataFileError(
            f"not valid UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start:,}",
            path=path,
            line=line,
            hint="re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
        ) from exc


def is_blank(data: bytes) -> bool:
    """True for empty or all-whitespace bytes (``not data.strip()`` without copying the data)."""
    return not data or data.isspace()


def read_text(source: PathLike, *, allow_empty: bool = False) -> str:
    """Read a whole UTF-8 text file or zip member; empty or non-UTF-8 input is a DataFileError."""
    data = read_bytes(source)
    if is_blank(data) and not allow_empty:
        raise DataFileError("the file is empty; expected text", path=display_name(source))
    return check_utf8(data, path=display_name(source))


def detect_format(source: PathLike, fmt: str | None = None) -> str:
    """Return ``csv``, ``tsv``, ``parquet``, ``jsonl`` or ``text`` from ``fmt`` or the suffix."""
    if fmt is not None:
        if fmt not in set(_FORMATS.values()):
            raise DataFileError(
                f"unknown format {fmt!r}; expected one of {sorted(set(_FORMATS.values()))}",
                path=display_name(source),
            )
        return fmt
    path, member = split_member(source)
    suffix = Path(member or path.name).suffix.lower()
    if suffix not in _FORMATS:
        raise DataFileError(
            f"cannot tell the format from the suffix {suffix!r}; expected one of "
            f"{sorted(_FORMATS)}",
            path=display_name(source),
        )
    return _FORMATS[suffix]


_ROW_RE = re.compile(r"Row #(\d+)")
_MISSING_COLUMN_RE = re.compile(
    r"Column '(?P<a>[^']*)' in include_columns does not exist|No match for "
    r"FieldRef\.Name\((?P<b>[^)]*)\)"
)
_JSON_CHANGED_RE = re.compile(
    r"Column\(/(?P<column>[^)]*)\) changed from (?P<was>\w+) to (?P<now>\w+) in row (?P<row>\d+)"
)


def _nth_record_line(data: bytes, row: int) -> int | None:
    """1-based line of the ``row``-th (0-based) non-blank line of a JSONL file (error path only)."""
    seen = 0
    for i, raw in enumerate(data.splitlines(), start=1):
        if raw.strip():
            if seen == row:
                return i
            seen += 1
    return None


_COLUMNS_RE = re.compile(r"Expected (\d+) columns, got (\d+)")

#: CSV cells read as null
CSV_NULL_VALUES = ("", "NA", "N/A", "NaN", "nan", "null", "NULL", "None", "#N/A")


def csv_options(
    kind: str,
    *,
    columns: list[str] | None = None,
    column_types: dict[str, pa.DataType] | None = None,
) -> dict[str, Any]:
    """The ``pyarrow.csv.read_csv`` keyword arguments datamill reads every CSV/TSV with."""
    import pyarrow.csv as pcsv

    return {
        "read_options": pcsv.ReadOptions(block_size=1 << 24),
        "parse_options": pcsv.ParseOptions(
            delimiter="\t" if kind == "tsv" else ",", newlines_in_values=True
        ),
        "convert_options": pcsv.ConvertOptions(
            include_columns=columns,
            column_types=column_types,
            null_values=list(CSV_NULL_VALUES),
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        ),
    }


def _bad_field_count_line(data: bytes, fmt: str) -> int | None:
    """Line (1-based) of the first CSV record whose field count differs from the header's (error
    path only)."""
    import csv

    reader = csv.reader(
        io.StringIO(data.decode("utf-8", errors="replace")), delimiter="\t" if fmt == "tsv" else ","
    )
    width = None
    for record in reader:
        if width is None:
            width = len(record)
        elif record and len(record) != width:
            return reader.line_num
    return None


def _arrow_read_error(exc: Exception, data: bytes, source: PathLike, fmt: str) -> DataFileError:
    """Translate a pyarrow reader failure into a DataFileError with the line when we can find it."""
    name = display_name(source)
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "UTF8" in msg or "utf-8" in msg.lower() or "utf8" in msg.lower():
        check_utf8(data, path=name)  # raises with the exact line
    line = None
    m = _ROW_RE.search(str(exc))
    changed = _JSON_CHANGED_RE.search(msg) if fmt == "jsonl" else None
    if changed:
        column = changed.group("column").replace("~1", "/").replace("~0", "~")
        line = _nth_record_line(data, int(changed.group("row")))
        return DataFileError(
            f"expected a {changed.group('was')} as in the lines before, got a "
            f"{changed.group('now')}",
            path=name,
            line=line,
            column=column,
            hint="give the column one type in every line (quote numbers as strings, or fix the "
            "value)",
        )
    if m:
        line = int(m.group(1))
    elif fmt in ("csv", "tsv") and _COLUMNS_RE.search(msg):
        line = _bad_field_count_line(data, fmt)
    elif fmt == "jsonl":
        for i, raw in enumerate(data.splitlines(), start=1):
            if raw.strip():
                try:
                    import json

                    json.loads(raw)
                except ValueError:
                    line = i
                    break
    return DataFileError(f"cannot parse as {fmt.upper()}: {msg}", path=name, line=line)


def read_table(
    source: PathLike,
    *,
    fmt: str | None = None,
    columns: list[str] | None = None,
    column_types: dict[str, pa.DataType] | None = None,
) -> pa.Table:
    """Read a CSV/TSV/Parquet/JSONL file (or zip member) into a pyarrow Table.

    Args:
        source: a path or ``archive.zip:member``.
        fmt: force a format instead of guessing from the suffix. Defaults to ``None``.
        columns: read only these columns (CSV/TSV/Parquet). Defaults to ``None`` (all).
        column_types: pyarrow types forced on CSV columns. Defaults to ``None``.

    Returns:
        The table. CSV ``""``, ``NA``, ``N/A``, ``NaN``, ``null`` and ``None`` cells become nulls.

    Raises:
        DataFileNotFoundError: the file does not exist.
        DataFileError: empty file, not UTF-8, malformed rows (the line is named).

    Examples:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.csv"
        >>> _ = p.write_text("a,b\\n1,x\\n,y\\n")
        >>> read_table(p).to_pydict()
        {'a': [1, None], 'b': ['x', 'y']}
    """
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson
    import pyarrow.parquet as pq

    kind = detect_format(source, fmt)
    name = display_name(source)
    data = read_bytes(source)
    if is_blank(data):
        raise DataFileError(
            f"the file is empty; expected {kind.upper()} with a header row", path=name
        )
    buf = pa.BufferReader(data)
    try:
        if kind in ("csv", "tsv"):
            table = pcsv.read_csv(
                buf, **csv_options(kind, columns=columns, column_types=column_types)
            )
        elif kind == "parquet":
            table = pq.read_table(buf, columns=columns)
        elif kind == "jsonl":
            table = pjson.read_json(buf, read_options=pjson.ReadOptions(block_size=1 << 24))
        else:
            text = check_utf8(data, path=name)
            table = pa.table({"text": pa.array(text.splitlines(), pa.string())})
    except (pa.ArrowException, OSError, ValueError) as exc:
        absent = _MISSING_COLUMN_RE.search(str(exc)) if columns is not None else None
        if absent:
            col = absent.group("a") or absent.group("b")
            raise SchemaError(
                f"no column {col!r} in the {kind.upper()} file",
                path=name,
                column=col,
                hint="check the column name (case matters)",
            ) from exc
        raise _arrow_read_error(exc, data, source, kind) from exc
    if kind == "jsonl" and columns is not None:
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise SchemaError(
                f"no column {missing[0]!r} in any line; the lines have {table.column_names}",
                path=name,
                column=missing[0],
                hint="check the column name (case matters)",
            )
        table = table.select(columns)
    if kind in ("csv", "tsv", "jsonl"):
        _check_string_columns_utf8(table, data, name)
    return table


def _check_string_columns_utf8(table: pa.Table, data: bytes, name: str) -> None:
    """pyarrow reads a CSV column with invalid UTF-8 as binary (or validates strings lazily)."""
    for col in table.columns:
        if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
            check_utf8(data, path=name)
        elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            try:
                col.validate(full=True)
            except pa.ArrowInvalid:
                check_utf8(data, path=name)
