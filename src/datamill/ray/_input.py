"""The Ray engine's input: a file, a folder of files, a glob, a URI or an in-memory table, read with
Ray Data.

Columns are read as the local engine reads them (CSV/TSV with :func:`datamill.core.io.csv_options`
and the same column types; Parquet and JSONL as stored, cast per block by ``prepare``), so every
block's values are the local engine's. A missing column is a SchemaError before any task runs; a
CSV number that does not parse is located (file, line or row, column) by re-reading as strings.
"""

from __future__ import annotations

import glob as globlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from datamill.core.errors import DataFileError, DataFileNotFoundError, DatamillError, SchemaError
from datamill.core.io import csv_options, detect_format, display_name
from datamill.preprocessing.plans import Origin
from datamill.preprocessing.reading import cast_column, read_types
from datamill.ray._runtime import MAX_RETRIES, ray_module, unwrap

__all__ = ["Input", "read", "resolve_input"]

_EXTENSIONS = {
    "csv": (".csv",),
    "tsv": (".tsv",),
    "parquet": (".parquet", ".pq"),
    "jsonl": (".jsonl", ".json"),
}


@dataclass(frozen=True)
class Input:
    """What to read: the files (or URIs) in order, their format, and where their rows come from."""

    files: list[str]
    kind: str
    origin: Origin
    table: pa.Table | None = None  # an in-memory input

    @property
    def single_file(self) -> bool:
        return self.table is None and len(self.files) == 1


def resolve_input(dataset: Any) -> Input:
    """A path, folder, glob or URI (or a table / DataFrame) → :class:`Input`.

    Raises:
        DataFileNotFoundError: nothing matches. DataFileError: a folder mixes formats.
    """
    if isinstance(dataset, pa.Table):
        return Input([], "arrow", Origin(None, None, None), dataset)
    if type(dataset).__name__ == "DataFrame" and hasattr(dataset, "to_numpy"):
        table = pa.Table.from_pandas(dataset, preserve_index=False)
        return Input([], "arrow", Origin(None, None, None), table)
    text = os.fspath(dataset)
    if "://" in text:
        kind = detect_format(text)
        return Input([text], kind, Origin(text, None, _first_line(kind)))
    path = Path(text)
    if path.is_dir() or any(c in text for c in "*?["):
        files, base = _listed(path, text)
        origin = Origin(display_name(text), base.resolve(), None)
        return Input(files, _one_format(files, text), origin)
    if path.is_file():
        kind = detect_format(path)
        return Input([str(path)], kind, Origin(display_name(path), path.parent, _first_line(kind)))
    raise DataFileNotFoundError("no such file or folder", path=text)


def _listed(path: Path, text: str) -> tuple[list[str], Path]:
    """The data files of a folder (hidden and ``_`` files left out) or a glob, and the folder they
    are in.

    Raises:
        DataFileNotFoundError: no file.
    """
    if path.is_dir():
        files = sorted(
            str(f) for f in path.iterdir() if f.is_file() and not f.name.startswith((".", "_"))
        )
        base = path
    else:
        files = sorted(f for f in globlib.glob(text) if Path(f).is_file())
        base = Path(os.path.commonpath(files)) if files else path.parent
        base = base if base.is_dir() else base.parent
    if not files:
        raise DataFileNotFoundError(
            "no data files here", path=text, hint="give a file, a folder of files or a glob"
        )
    return files, base


def _first_line(kind: str) -> int | None:
    """The line of a file's first row: 2 in a CSV/TSV (after the header), 1 in JSONL, None in a
    binary format (rows are counted instead)."""
    return 2 if kind in ("csv", "tsv") else 1 if kind == "jsonl" else None


def _one_format(files: list[str], text: str) -> str:
    """The one format of ``files`` (matched by ``text``).

    Raises:
        DataFileError: the files have different formats.
    """
    kinds = {detect_format(f) for f in files}
    if len(kinds) > 1:
        raise DataFileError(
            f"the files have different formats ({', '.join(sorted(kinds))})",
            path=text,
            hint="put one format per folder, or select the files with a glob",
        )
    return kinds.pop()


def _check_columns(inp: Input, wanted: list[str], optional: tuple[str, ...] = ()) -> list[str]:
    """The columns to read: ``wanted`` less the ``optional`` ones the (first local) file lacks."""
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    absent: set[str] = set()
    for i, f in enumerate(inp.files):
        if "://" in f:
            continue
        if inp.kind in ("csv", "tsv"):
            opts = csv_options(inp.kind)
            with pcsv.open_csv(
                f,
                read_options=pcsv.ReadOptions(block_size=1 << 16),
                parse_options=opts["parse_options"],
            ) as reader:
                names = reader.schema.names
        elif inp.kind == "parquet":
            names = pq.read_schema(f).names
        else:
            continue
        if i == 0:
            absent = {c for c in optional if c not in names}
        for c in wanted:
            if c not in names and c not in absent:
                raise SchemaError(
                    "the config names this column but the dataset has no such column",
                    path=display_name(f),
                    column=c,
                    hint=f"available columns: {', '.join(names[:30])}",
                )
    return [c for c in wanted if c not in absent]


def read(
    inp: Input, wanted: dict[str, str], *, extra: list[str], optional: tuple[str, ...] = ()
) -> Any:
    """The Ray Dataset of the ``wanted`` columns (plus ``extra`` raw columns), materialized in
    order.

    Columns in ``optional`` (output columns when metadata is applied) may be absent: they are left
    out.
    """
    ray = ray_module()
    columns = list(dict.fromkeys([*wanted, *extra]))
    if inp.table is not None:
        return ray.data.from_arrow(_selected(inp.table, columns, optional)).materialize()
    columns = _check_columns(inp, columns, optional)
    if inp.kind in ("csv", "tsv"):
        types = {c: t for c, t in read_types(wanted).items() if c in columns}
        try:
            # one task per file with pyarrow's whole-file reader (on one thread in a Ray worker): a
            # CSV cannot be cut at byte offsets (quoted newlines), so Ray Data's read_csv also reads
            # a file in one task, but streaming it into ~300 small blocks that slow every later task
            # (1M rows:
            # read 4.9 s and the run 15-17 s there; 1.4 s and 6 s here)
            task = ray.remote(max_retries=MAX_RETRIES)(_read_csv)
            return ray.data.from_arrow_refs(
                [task.remote(f, inp.kind, columns, types) for f in inp.files]
            ).materialize()
        except Exception as exc:
            raise _locate_csv_error(inp, wanted, columns, exc) from exc
    try:
        if inp.kind == "parquet":
            # one task per file (pyarrow reads local paths and URIs): ray 2.60's read_parquet fails
            # where fsspec is installed without aiohttp (its HTTP filesystem probe raises
            # ImportError)
            task = ray.remote(_read_parquet)
            ds = ray.data.from_arrow_refs([task.remote(f, columns) for f in inp.files])
        elif inp.kind == "jsonl":
            ds = ray.data.read_json(inp.files, lines=True, file_extensions=None).select_columns(
                columns
            )
        else:
            raise DataFileError(
                f"the Ray engine reads CSV, TSV, Parquet and JSONL, not {inp.kind!r}",
                path=inp.origin.path,
            )
        return ds.materialize()
    except DatamillError:
        raise
    except Exception as exc:
        err = unwrap(exc, what="reading")
        if isinstance(err, DatamillError) and not type(err) is DatamillError:
            raise err from exc
        raise DataFileError(f"cannot read the input ({err})", path=inp.origin.path) from exc


def _selected(table: pa.Table, columns: list[str], optional: tuple[str, ...]) -> pa.Table:
    """The ``columns`` of an in-memory table, the absent ``optional`` ones left out.

    Raises:
        SchemaError: another column is absent.
    """
    columns = [c for c in columns if c not in optional or c in table.column_names]
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise SchemaError(
            "the config names this column but the dataset has no such column",
            column=missing[0],
            hint=f"available columns: {', '.join(table.column_names[:30])}",
        )
    return table.select(columns)


def _read_csv(path: str, kind: str, columns: list[str], types: dict[str, pa.DataType]) -> pa.Table:
    import pyarrow.csv as pcsv

    return pcsv.read_csv(path, **csv_options(kind, columns=columns, column_types=types))


def _read_parquet(path: str, columns: list[str]) -> pa.Table:
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=columns)


def _locate_csv_error(
    inp: Input, wanted: dict[str, str], columns: list[str], exc: BaseException
) -> BaseException:
    """Re-read as strings to name the first value that is not a number; else one DataFileError."""
    ray = ray_module()
    err = unwrap(exc, what="reading")
    if isinstance(err, DatamillError) and type(err) is not DatamillError:
        return err
    numeric = [c for c, t in wanted.items() if t == "float64"]
    if numeric:
        try:
            ds = ray.data.read_csv(
                inp.files,
                file_extensions=None,
                include_paths=True,
                **csv_options(
                    inp.kind, columns=columns, column_types={c: pa.string() for c in columns}
                ),
            ).materialize()
            seen: dict[str, int] = {}
            for table in ray.get(ds.to_arrow_refs()):
                name = table.column("path")[0].as_py() if table.num_rows else ""
                for c in numeric:
                    cast_column(
                        table[c],
                        "float64",
                        name=display_name(name),
                        column=c,
                        line_offset=2,
                        row_offset=seen.get(name, 0),
                    )
                seen[name] = seen.get(name, 0) + table.num_rows
        except DataFileError as located:
            return located
        except Exception:  # noqa: BLE001, S110 - the original error is reported below
            pass
    return DataFileError(
        f"cannot read the input ({' '.join(str(err).split())[:300]})", path=inp.origin.path
    )
