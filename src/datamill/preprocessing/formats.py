"""The input formats Ludwig reads beyond CSV, TSV, Parquet and JSON lines (those are
:func:`datamill.core.io.read_table`'s).

By extension, or by ``preprocessing: {format: ...}`` in the config:

========== ===================================== ==========================================
format     extensions                            read with
========== ===================================== ==========================================
json       ``.json`` holding an array of records the ``json`` module → Arrow (a ``.json`` file
                                                 of one object per line stays JSON lines)
feather    ``.feather``, ``.arrow``, ``.ipc``    pyarrow (Arrow IPC file or stream)
orc        ``.orc``                              pyarrow
excel      ``.xlsx``                             pandas + openpyxl (the first sheet)
hdf5       ``.h5``, ``.hdf5``                    pandas + PyTables (a table written by
                                                 ``DataFrame.to_hdf``; its only key)
fwf        ``.fwf``                              pandas ``read_fwf`` (column widths inferred)
========== ===================================== ==========================================

A file that cannot be parsed is a :class:`~datamill.core.errors.DataFileError` naming the file (and
the line for JSON); a missing optional library is a
:class:`~datamill.core.errors.MissingExtraError` naming the extra to install.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from datamill.core.errors import DataFileError, MissingExtraError
from datamill.core.io import display_name, is_blank, read_bytes, read_table, split_member

__all__ = ["EXTRA_FORMATS", "FORMATS", "extra_format", "read_any", "read_extra"]

#: extension → format read here
EXTRA_FORMATS = {
    ".arrow": "feather",
    ".feather": "feather",
    ".fwf": "fwf",
    ".h5": "hdf5",
    ".hdf5": "hdf5",
    ".ipc": "feather",
    ".json": "json",
    ".orc": "orc",
    ".xls": "excel",
    ".xlsx": "excel",
}
#: every format preprocessing reads (``preprocessing.format``)
FORMATS = ("csv", "excel", "feather", "fwf", "hdf5", "json", "jsonl", "orc", "parquet", "tsv")


def _is_json_array(source: Any) -> bool:
    data = read_bytes(source)
    return data.lstrip()[:1] == b"["


def extra_format(source: Any, fmt: str | None = None) -> str | None:
    """The format of ``source`` when this module reads it (None: :func:`read_table`'s formats).

    Examples:
        >>> extra_format("sales.xlsx"), extra_format("t.csv"), extra_format("t.txt", "fwf")
        ('excel', None, 'fwf')
    """
    path, member = split_member(source)
    kind = fmt if fmt is not None else EXTRA_FORMATS.get(Path(member or path.name).suffix.lower())
    if kind == "json":  # an array of records; one object per line is JSON lines
        return "json" if _is_json_array(source) else None
    return kind if kind in set(EXTRA_FORMATS.values()) else None


def _error(source: Any, kind: str, exc: BaseException, hint: str) -> DataFileError:
    msg = " ".join(str(exc).split()) or type(exc).__name__
    return DataFileError(
        f"cannot read as {kind}: {msg[:300]}", path=display_name(source), hint=hint
    )


def _need(module: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MissingExtraError(
            f"reading this format needs {module}: pip install 'datamill[{extra}]'"
        )


def _from_pandas(df: Any, source: Any) -> pa.Table:
    try:
        return pa.Table.from_pandas(df, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise DataFileError(
            f"a column mixes types: {str(exc).splitlines()[0]}",
            path=display_name(source),
            hint="give each column one type in the file",
        ) from exc


def _json_records(source: Any) -> pa.Table:
    text = read_bytes(source).decode("utf-8", errors="strict")
    try:
        records = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFileError(
            f"not valid JSON: {exc.msg}",
            path=display_name(source),
            line=exc.lineno,
            hint="a JSON dataset is an array of objects, one per row",
        ) from exc
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise DataFileError(
            "expected an array of objects (one per row)",
            path=display_name(source),
            hint="write the rows as [{...}, {...}] (or one object per line, JSON lines)",
        )
    try:
        return pa.Table.from_pylist(records)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise _error(source, "json", exc, "give each key one type in every record") from exc


def _pandas_file(source: Any, kind: str) -> pa.Table:
    import pandas as pd

    path, member = split_member(source)
    if kind == "excel":
        _need("openpyxl", "formats")
        df = pd.read_excel(io.BytesIO(read_bytes(source)), engine="openpyxl")
    elif kind == "hdf5":
        _need("tables", "formats")
        if member is not None or not path.is_file():
            raise DataFileError("an HDF5 table is read from a file", path=display_name(source))
        df = pd.read_hdf(path)
    else:
        df = pd.read_fwf(io.BytesIO(read_bytes(source)))
    return _from_pandas(df, source)


_HINTS = {
    "feather": "write it again with pyarrow.feather.write_feather or DataFrame.to_feather",
    "orc": "write it again with pyarrow.orc.write_table or DataFrame.to_orc",
    "excel": "open and save it again as .xlsx",
    "hdf5": "write it with DataFrame.to_hdf(path, key='data', format='table')",
    "fwf": "a fixed-width file has a header line and aligned columns",
}


def read_extra(source: Any, kind: str) -> pa.Table:
    """Read ``source`` in format ``kind`` (one of this module's) as an Arrow table.

    Raises:
        DataFileNotFoundError: no such file.
        DataFileError: the file cannot be parsed (the file named; JSON: the line).
        MissingExtraError: openpyxl or PyTables is not installed.
    """
    name = display_name(source)
    if is_blank(read_bytes(source)):
        raise DataFileError(f"the file is empty; expected {kind}", path=name)
    if kind == "json":
        return _json_records(source)
    try:
        if kind == "feather":
            from pyarrow import feather

            data = read_bytes(source)
            try:
                return feather.read_table(pa.BufferReader(data))
            except pa.ArrowInvalid:  # an IPC stream rather than a file
                return pa.ipc.open_stream(pa.BufferReader(data)).read_all()
        if kind == "orc":
            from pyarrow import orc

            return orc.read_table(pa.BufferReader(read_bytes(source)))
        return _pandas_file(source, kind)
    except (DataFileError, MissingExtraError):
        raise
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError, ImportError) as exc:
        raise _error(source, kind, exc, _HINTS[kind]) from exc
    except Exception as exc:  # openpyxl/PyTables raise their own classes on damaged files
        raise _error(source, kind, exc, _HINTS[kind]) from exc


def read_any(
    source: str | os.PathLike[str], *, fmt: str | None = None, columns: list[str] | None = None
) -> pa.Table:
    """Any input format: this module's, else :func:`datamill.core.io.read_table`'s."""
    kind = extra_format(source, fmt)
    if kind is None:
        return read_table(source, fmt="jsonl" if fmt == "json" else fmt, columns=columns)
    table = read_extra(source, kind)
    return table.select([c for c in columns if c in table.column_names]) if columns else table
