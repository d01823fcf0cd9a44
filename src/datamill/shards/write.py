"""Creating shardset datasets and adding shardsets, atomically.

* :func:`create` takes existing shard files (their order is the shard index) or one table/file cut
  into ``shard_size`` rows. The first shardset defines the sample→shard mapping.
* :func:`add` takes one shard file per shard that must respect the mapping, or (``route=True``) any
  UID-keyed table whose rows datamill routes to their shards. **UIDs unknown to the mapping are an
  error naming them**: the mapping is fixed by the first shardset, so new samples would change what
  shard ``k`` means for every existing shardset and for saved loader states; build a new dataset for
  new samples instead (appending new shards in a new mapping version is not implemented).

Atomicity: shard files are written into a hidden ``.tmp-…`` folder inside the dataset, their row
counts re-read and checked, the folder is renamed to the shardset name, and ``dataset.json`` is
replaced last (temp file + rename). A failed or killed ``add`` never touches existing files; at most
a hidden ``.tmp-…`` folder (ignored by readers and ``check``) or an unlisted shardset folder is left,
which the next ``add`` of that name reports. The renames are atomic on local/POSIX filesystems; on
object stores (``s3://``) a "move" is copy + delete, but the manifest is still the commit marker: a
shardset missing from ``dataset.json`` is never read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datamill.core.constants import DATASET_MANIFEST, SAMPLES_FILE, SHARD_PATTERN, SHARDS_FORMAT
from datamill.core.errors import ConfigError, SchemaError, ShardsetError
from datamill.core.io import read_table
from datamill.shards._fs import Location, read_any, resolve, write_any
from datamill.shards._mapping import Mapping, schema_to_b64
from datamill.shards.check import shard_problems
from datamill.shards.dataset import ShardsetDataset

__all__ = ["add", "create", "load_table"]

_RESERVED = {DATASET_MANIFEST, SAMPLES_FILE}
KEEP_META = b"datamill"  # file metadata key kept in the manifest (``source_metadata``)


def load_table(source: Any, *, uid: str | None = None, add_uid: bool = False) -> pa.Table:
    """A pa.Table, or a Parquet/CSV/HDF5 file (local or URI) read into one; ``add_uid`` adds row numbers."""
    if isinstance(source, pa.Table):
        table = source
    else:
        text = os.fspath(source)
        if text.lower().endswith((".hdf5", ".h5")):
            from datamill.shards.convert import hdf5_to_table

            return hdf5_to_table(text, uid=uid or "uid")
        if "://" in text:
            loc = resolve(text)
            table = read_any(loc.fs, loc.path, display=text)
        else:  # local: the core reader names the line of a bad CSV row, checks UTF-8, reads zip members
            from datamill.shards._fs import file_format

            file_format(text.rsplit(":", 1)[-1] if ".zip:" in text else text)
            table = read_table(text)
    if add_uid and uid is not None and uid not in table.column_names:
        table = table.add_column(0, uid, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    return table


def _check_name(loc: Location, name: str, existing: Sequence[str]) -> None:
    if not name or "/" in name or name.startswith(".") or name in _RESERVED:
        raise ConfigError(f"invalid shardset name {name!r}", path=loc.display, hint="use a plain folder name")
    if name in existing:
        raise ShardsetError(f"the shardset {name!r} already exists", path=loc.show(name))
    if loc.exists(name):
        raise ShardsetError("a folder with this name exists but is not in the manifest (left by an interrupted "
                            "add?)", path=loc.show(name), hint="remove the folder, then add again")


def _pieces(source: Any, *, uid: str, shard_size: int | None, add_uid: bool) -> Iterator[tuple[str, pa.Table]]:
    if isinstance(source, (str, os.PathLike, pa.Table)):
        if shard_size is None and isinstance(source, pa.Table):
            raise ConfigError("a single table needs shard_size", hint="pass shard_size=N (--shard-size N)")
        table = load_table(source, uid=uid, add_uid=add_uid)
        name = "<table>" if isinstance(source, pa.Table) else os.fspath(source)
        if shard_size is None:
            yield name, table
            return
        if shard_size < 1:
            raise ConfigError(f"shard_size must be >= 1, got {shard_size}")
        for start in range(0, max(table.num_rows, 1), shard_size):
            yield name, table.slice(start, shard_size)
        return
    if shard_size is not None:
        raise ConfigError("shard_size applies to one table/file, not to a list of shard files")
    for f in source:
        yield os.fspath(f), load_table(f, uid=uid, add_uid=add_uid)


def _conform(table: pa.Table, schema: pa.Schema | None, *, display: str, k: int) -> pa.Table:
    table = table.replace_schema_metadata(None)
    if schema is None:
        return table
    if sorted(table.column_names) != sorted(schema.names):
        raise SchemaError(f"expected columns {sorted(schema.names)}, got {sorted(table.column_names)}",
                          path=display, shard=k, hint="every shard of a shardset has the same columns")
    table = table.select(schema.names)
    if table.schema.equals(schema):
        return table
    try:
        return table.cast(schema)
    except (pa.ArrowException, ValueError) as exc:
        raise SchemaError(f"column types differ from the first shard: {exc}", path=display, shard=k) from exc


def _entry(name: str, fmt: str, schema: pa.Schema, uid: str, rows: list[int],
           source_meta: dict[bytes, bytes] | None) -> dict[str, Any]:
    entry = {"name": name, "format": fmt, "columns": [c for c in schema.names if c != uid],
             "schema": schema_to_b64(schema), "num_shards": len(rows), "shard_rows": rows}
    if source_meta and KEEP_META in source_meta:  # e.g. a BERT Parquet's tokenizer/vocab description
        entry["source_metadata"] = source_meta[KEEP_META].decode("utf-8", "replace")
    return entry


def _commit(loc: Location, tmp: str, name: str, rows: list[int], fmt: str) -> None:
    """Check the written files' row counts, then move the folder into place."""
    for k, n in enumerate(rows):
        path = loc.join(tmp, SHARD_PATTERN.format(index=k, ext=fmt))
        got = pq.read_metadata(path, filesystem=loc.fs).num_rows if fmt == "parquet" else \
            read_any(loc.fs, path, display=path).num_rows
        if got != n:
            raise ShardsetError(f"written shard has {got} rows, expected {n}", path=loc.show(tmp), shard=k)
    loc.fs.move(loc.join(tmp), loc.join(name))


def create(root: str | os.PathLike[str], source: Any, /, *, uid: str, shardset: str, shard_size: int | None = None,
           fmt: str = "parquet", name: str | None = None, add_uid: bool = False) -> ShardsetDataset:
    """Create a dataset whose first shardset ``shardset`` defines the sample→shard mapping.

    Args:
        root: the new dataset folder (path or URI); it must not hold a dataset yet.
        source: a list of shard files (Parquet/CSV; order = shard index), or one table / file
            (Parquet, CSV, preprocessed HDF5) cut into ``shard_size`` rows.
        uid: the UID column.
        shardset: the first shardset's name.
        shard_size: rows per shard when ``source`` is one table. Defaults to ``None``.
        fmt: ``"parquet"`` or ``"csv"`` shard files. Defaults to ``"parquet"``.
        name: the dataset name in the manifest. Defaults to ``None`` (the folder name).
        add_uid: add ``uid`` = row number when the column is absent (BERT Parquet). Defaults to ``False``.

    Raises:
        SchemaError: the UID column is missing, or shards have different columns.
        ShardsetError: duplicate or null UIDs, an existing dataset.
    """
    if fmt not in ("parquet", "csv"):
        raise ConfigError(f"fmt must be 'parquet' or 'csv', got {fmt!r}")
    loc = resolve(root)
    if loc.exists(DATASET_MANIFEST):
        raise ShardsetError("a dataset already exists here", path=loc.show(DATASET_MANIFEST),
                            hint="use `add` to add a shardset")
    made_root = not loc.exists()
    loc.fs.create_dir(loc.path, recursive=True)
    _check_name(loc, shardset, [])
    tmp = loc.tmp_name(shardset)
    loc.fs.create_dir(loc.join(tmp))
    try:
        schema: pa.Schema | None = None
        meta: dict[bytes, bytes] | None = None
        uids: list[pa.Array] = []
        displays: list[str] = []
        for k, (display, t) in enumerate(_pieces(source, uid=uid, shard_size=shard_size, add_uid=add_uid)):
            if uid not in t.column_names:
                raise SchemaError(f"the UID column {uid!r} is missing (columns: {t.column_names})",
                                  path=display, column=uid, shard=k)
            meta = t.schema.metadata if schema is None else meta
            t = _conform(t, schema, display=display, k=k)
            schema = t.schema if schema is None else schema
            u = t.column(uid).combine_chunks()
            if u.null_count:
                row = int(np.flatnonzero(np.asarray(u.is_null()))[0])
                raise ShardsetError("a UID is null", path=display, row=row, column=uid, shard=k)
            uids.append(u)
            displays.append(display)
            write_any(loc.fs, loc.join(tmp, SHARD_PATTERN.format(index=k, ext=fmt)), t, fmt)
        if schema is None:
            raise ConfigError("no shard files given")
        all_uids = pa.concat_arrays(uids)
        sizes = np.array([len(u) for u in uids], dtype=np.int64)
        _check_unique(all_uids, sizes, displays)
        shard = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
        mapping = Mapping(all_uids, shard, len(sizes))
        _commit(loc, tmp, shardset, sizes.tolist(), fmt)
    except BaseException:
        loc.remove_tree(tmp)
        if made_root and not loc.listdir():
            loc.fs.delete_dir(loc.path)
        raise
    mtmp = loc.tmp_name(SAMPLES_FILE)
    pq.write_table(mapping.to_table(uid), loc.join(mtmp), filesystem=loc.fs)
    loc.fs.move(loc.join(mtmp), loc.join(SAMPLES_FILE))
    manifest = {"format": SHARDS_FORMAT, "name": name or os.path.basename(loc.path), "uid_column": uid,
                "num_shards": len(sizes), "num_samples": len(all_uids),
                "shardsets": [_entry(shardset, fmt, schema, uid, sizes.tolist(), meta)]}
    loc.write_json_atomic(DATASET_MANIFEST, manifest)
    return ShardsetDataset(loc)


def _check_unique(uids: pa.Array, sizes: np.ndarray, displays: list[str]) -> None:
    if pc.count_distinct(uids).as_py() == len(uids):
        return
    counts = pc.value_counts(uids)
    dup = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"]
    rows = np.flatnonzero(np.asarray(pc.equal(uids, dup).fill_null(False)))
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    shards = np.searchsorted(offsets, rows, side="right") - 1
    k = int(shards[1])
    raise ShardsetError(f"duplicate uid (also in shard {int(shards[0])}, {displays[int(shards[0])]})",
                        path=displays[k], uid=dup.as_py(), row=int(rows[1] - offsets[k]), shard=k,
                        hint="UIDs must be unique within a shardset")


def _route(ds: ShardsetDataset, table: pa.Table, display: str) -> Iterator[tuple[str, pa.Table]]:
    """Split a UID-keyed table into the dataset's shards (rows in mapping order)."""
    uid = ds.uid_column
    if uid not in table.column_names:
        raise SchemaError(f"the UID column {uid!r} is missing (columns: {table.column_names})",
                          path=display, column=uid)
    u = table.column(uid)
    pos = ds.mapping.positions(u, display=display)
    if pos.null_count:
        bad = np.flatnonzero(np.asarray(pos.is_null()))
        names = [u[int(i)].as_py() for i in bad[:10]]
        raise ShardsetError(f"{len(bad)} UIDs are not in the sample mapping: {names}{' …' if len(bad) > 10 else ''}",
                            path=display, uid=names[0], row=int(bad[0]), column=uid,
                            hint="a shardset may only hold samples of the dataset; create a new dataset for new samples")
    p = np.asarray(pos.to_numpy(), dtype=np.int64)
    order = np.argsort(p, kind="stable")
    sp = p[order]
    if len(sp) > 1 and np.any(sp[1:] == sp[:-1]):
        i = int(np.flatnonzero(sp[1:] == sp[:-1])[0])
        raise ShardsetError("duplicate uid in the routed table", path=display, uid=ds.mapping.uids[int(sp[i])].as_py(),
                            row=int(order[i + 1]), column=uid, hint="UIDs must be unique within a shardset")
    table = table.take(pa.array(order))
    table = table.set_column(table.column_names.index(uid), uid, ds.mapping.cast_uids(table.column(uid), display=display))
    counts = np.bincount(ds.mapping.shard[sp], minlength=ds.num_shards) if len(sp) else np.zeros(ds.num_shards, int)
    start = 0
    for c in counts:
        yield display, table.slice(start, int(c))
        start += int(c)


def add(ds: ShardsetDataset, shardset: str, source: Any, /, *, route: bool = False,
        fmt: str = "parquet") -> ShardsetDataset:
    """Add the shardset ``shardset`` to ``ds`` atomically; returns the reopened dataset.

    Args:
        ds: the dataset.
        shardset: the new shardset's name.
        source: one shard file per shard (order = shard index; each must respect the mapping), or
            with ``route=True`` one table / file keyed by the UID column.
        route: route rows to their shards by the mapping. Defaults to ``False``.
        fmt: ``"parquet"`` or ``"csv"`` shard files. Defaults to ``"parquet"``.

    Raises:
        ShardsetError: shard count mismatch, a UID unknown to the mapping / in the wrong shard /
            duplicated (``path``, ``uid``, ``shard`` set).
        SchemaError: a missing UID column, a different column set, a column name already used.
        DataFileError: a corrupt or truncated file.
    """
    if fmt not in ("parquet", "csv"):
        raise ConfigError(f"fmt must be 'parquet' or 'csv', got {fmt!r}")
    if ds.loc.read_json(DATASET_MANIFEST) != ds.manifest:  # a stale object: another add happened since
        ds = ShardsetDataset(ds.loc)
    loc, uid, n = ds.loc, ds.uid_column, ds.num_shards
    _check_name(loc, shardset, ds.shardsets)
    if route:
        table = load_table(source, uid=uid)
        pieces = _route(ds, table, "<table>" if isinstance(source, pa.Table) else os.fspath(source))
    else:
        files = [source] if isinstance(source, (str, os.PathLike)) else list(source)
        if len(files) != n:
            raise ShardsetError(f"got {len(files)} shard files, the dataset has {n} shards", path=loc.display,
                                hint="pass one file per shard in shard order, or use --route with one table")
        pieces = ((os.fspath(f), load_table(f, uid=uid)) for f in files)
    first = ds.manifest["shardsets"][0]
    tmp = loc.tmp_name(shardset)
    loc.fs.create_dir(loc.join(tmp))
    try:
        schema: pa.Schema | None = None
        meta: dict[bytes, bytes] | None = None
        rows: list[int] = []
        for k, (display, t) in enumerate(pieces):
            if schema is None and uid in t.column_names:
                clash = [c for c in t.column_names if c != uid and c in ds.columns]
                if clash:
                    raise SchemaError(f"columns {clash} already exist in the dataset", path=display, column=clash[0],
                                      hint="rename them; a column lives in exactly one shardset")
            if not route:
                problems = list(shard_problems(t, display=display, k=k, uid_column=uid, mapping=ds.mapping,
                                               columns=None, reference=(first["name"], first["format"])))
                if problems:
                    if len(problems) > 1:
                        problems[0].add_note(f"{len(problems) - 1} more violations in this file")
                    raise problems[0]
                t = t.set_column(t.column_names.index(uid), uid,
                                 ds.mapping.cast_uids(t.column(uid), display=display))
                pos = np.asarray(ds.mapping.positions_near(t.column(uid), k).to_numpy(), dtype=np.int64)
                if len(pos) > 1 and np.any(np.diff(pos) < 0):  # store rows in mapping order
                    t = t.take(pa.array(np.argsort(pos, kind="stable")))
            meta = t.schema.metadata if schema is None else meta
            t = _conform(t, schema, display=display, k=k)
            schema = t.schema if schema is None else schema
            rows.append(t.num_rows)
            write_any(loc.fs, loc.join(tmp, SHARD_PATTERN.format(index=k, ext=fmt)), t, fmt)
        assert schema is not None and len(rows) == n
        _commit(loc, tmp, shardset, rows, fmt)
    except BaseException:
        loc.remove_tree(tmp)
        raise
    if loc.read_json(DATASET_MANIFEST) != ds.manifest:
        loc.remove_tree(shardset)
        raise ShardsetError("the manifest changed while this shardset was written (a concurrent add?)",
                            path=loc.show(DATASET_MANIFEST), hint="add again")
    manifest = dict(ds.manifest)
    manifest["shardsets"] = [*ds.manifest["shardsets"], _entry(shardset, fmt, schema, uid, rows, meta)]
    loc.write_json_atomic(DATASET_MANIFEST, manifest)
    return ShardsetDataset(loc)
