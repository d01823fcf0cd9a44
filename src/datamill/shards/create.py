"""``create`` and ``add``: thin wrappers around :class:`~datamill.shards.writer.ShardsetWriter`.

* :func:`create` takes existing shard files (their order is the shard index) or one table/file cut
  into ``shard_size`` rows. The first shardset defines the sample→shard mapping.
* :func:`add` takes one shard file per shard that must respect the mapping, or (``route=True``) any
  UID-keyed table whose rows datamill routes to their shards. **UIDs unknown to the mapping are an
  error naming them**: the mapping is fixed by the first shardset, so new samples would change what
  shard ``k`` means for every existing shardset and for saved loader states; build a new dataset for
  new samples instead (appending new shards in a new mapping version is not implemented).

``ShardsetDataset.create(...)`` and ``ds.add(...)`` call these functions through the registry of
:mod:`datamill.shards._verbs`, filled at the end of this module (this module imports the dataset
module, so the dataset module cannot import this one).

Atomicity (see :mod:`datamill.shards.writer`): shard files are written into a hidden ``.tmp-…``
folder inside the dataset, checked, the folder is renamed to the shardset name, and ``dataset.json``
is replaced last (temp file + rename). A failed ``add`` never touches existing files; a killed one
leaves at most a hidden ``.tmp-…`` folder (ignored by readers and ``check``). The renames are atomic
on local/POSIX filesystems; on object stores (``s3://``) a "move" is copy + delete, but the manifest
is still the commit marker: a shardset missing from ``dataset.json`` is never read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pyarrow as pa

from datamill.core.checks import SHARD_SIZE
from datamill.core.constants import DATASET_MANIFEST, SAMPLES_FILE
from datamill.core.errors import (
    ConfigError,
    DataFileError,
    DatamillError,
    SchemaError,
    ShardsetError,
)
from datamill.core.io import atomic_dir, check_output, find_litter, is_datamill_output
from datamill.core.objstore import store_error
from datamill.core.storage import new_generation
from datamill.shards._fs import Location, resolve
from datamill.shards._remote import switch_remote
from datamill.shards._tables import ShardInput, TableInput, load_table
from datamill.shards._verbs import register_verbs
from datamill.shards.dataset import ShardsetDataset
from datamill.shards.writer import UNCOMMITTED, ShardsetWriter, remove_interrupted

__all__ = ["add", "create", "load_table"]


def _pieces(
    source: ShardInput, *, uid: str, shard_size: int | None, add_uid: bool
) -> Iterator[tuple[str, pa.Table]]:
    if isinstance(source, (str, os.PathLike, pa.Table)):
        if shard_size is None and isinstance(source, pa.Table):
            raise ConfigError(
                "a single table needs shard_size", hint="pass shard_size=N (--shard-size N)"
            )
        table = load_table(source, uid=uid, add_uid=add_uid)
        name = "<table>" if isinstance(source, pa.Table) else os.fspath(source)
        if table.num_rows == 0:
            raise DataFileError(
                "the table has no rows (a header only?); a dataset needs samples",
                path=name,
                hint="add rows, or check that you passed the right file",
            )
        if shard_size is None:
            yield name, table
            return
        SHARD_SIZE(shard_size)
        for start in range(0, max(table.num_rows, 1), shard_size):
            yield name, table.slice(start, shard_size)
        return
    if shard_size is not None:
        raise ConfigError("shard_size applies to one table/file, not to a list of shard files")
    for f in source:
        yield os.fspath(f), load_table(f, uid=uid, add_uid=add_uid)


def create(
    root: str | os.PathLike[str],
    source: ShardInput,
    /,
    *,
    uid: str,
    shardset: str,
    shard_size: int | None = None,
    fmt: str = "parquet",
    name: str | None = None,
    add_uid: bool = False,
    overwrite: bool = False,
) -> ShardsetDataset:
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
        add_uid: add ``uid`` = row number when the column is absent (BERT Parquet). Defaults to
            ``False``.
        overwrite: replace an existing dataset (or another datamill output) at ``root``: the new
            dataset is built beside it and switched in as a whole, so an interrupted run keeps the
            old one. On ``s3://`` the new dataset is uploaded whole to a fresh ``.gen-<hex>`` folder
            and one PUT of ``dataset.json`` switches to it before the old objects are deleted, so an
            interrupted run also keeps the old one. Defaults to ``False``.

    Raises:
        SchemaError: the UID column is missing, or shards have different columns.
        ShardsetError: duplicate or null UIDs, an existing dataset (without ``overwrite``).
        DataFileError: ``root`` is a file, an input, or a folder of yours.

    Examples:
        >>> import tempfile, pyarrow as pa
        >>> ds = create(
        ...     tempfile.mkdtemp() + "/ds",
        ...     pa.table({"id": [5, 6, 7]}),
        ...     uid="id",
        ...     shardset="a",
        ...     shard_size=2,
        ... )
        >>> ds.shard_sizes().tolist()
        [2, 1]
    """
    if fmt not in ("parquet", "csv"):
        raise ConfigError(f"fmt must be 'parquet' or 'csv', got {fmt!r}")
    loc = resolve(root)
    spec = _NewDataset(uid, shardset, shard_size, fmt, name, add_uid)
    if loc.remote:
        try:
            return _create_remote(loc, source, spec, overwrite=overwrite)
        except DatamillError:
            raise
        except OSError as exc:
            raise store_error(exc, loc.display) from exc
    check_output(
        loc.path,
        is_own=lambda p: p.is_dir() and (_leftovers_only(p) or (p / DATASET_MANIFEST).is_file()),
        inputs=_local_inputs(source),
        what="shardset dataset",
        overwrite=overwrite,
    )
    if loc.exists(DATASET_MANIFEST) or (overwrite and is_datamill_output(loc.path)):
        _refuse_existing(loc, overwrite=overwrite)
        with atomic_dir(loc.path) as tmp:
            _write_new(resolve(tmp), source, spec.named(PurePosixPath(loc.path).name))
        return ShardsetDataset(loc)
    if loc.exists():
        remove_interrupted(loc, [])
    return _write_new(loc, source, spec)


@dataclass(frozen=True)
class _NewDataset:
    """What :func:`create` writes (its options, passed whole)."""

    uid: str
    shardset: str
    shard_size: int | None
    fmt: str
    name: str | None
    add_uid: bool

    def named(self, default: str) -> _NewDataset:
        """The same, named ``default`` unless a name was given."""
        return replace(self, name=self.name or default)


def _local_inputs(source: ShardInput) -> list[Any]:
    """The input files of ``source`` (an output may not replace them)."""
    if isinstance(source, (str, os.PathLike)):
        return [source]
    if isinstance(source, pa.Table):
        return []
    return [f for f in source if isinstance(f, (str, os.PathLike))]


def _refuse_existing(loc: Location, *, overwrite: bool) -> None:
    if not overwrite:
        raise ShardsetError(
            "a dataset already exists here",
            path=loc.show(DATASET_MANIFEST),
            hint="use `add` to add a shardset, or --overwrite to replace the dataset",
        )


def _create_remote(
    loc: Location, source: ShardInput, spec: _NewDataset, *, overwrite: bool
) -> ShardsetDataset:
    """``create`` on an object store (the writer stages locally and uploads, ``dataset.json``
    last)."""
    spec = spec.named(PurePosixPath(loc.path).name)
    if not loc.exists(DATASET_MANIFEST):
        return _write_new(loc, source, spec)
    _refuse_existing(loc, overwrite=overwrite)
    # the new dataset goes whole to a fresh folder beside the old one, then one PUT of dataset.json
    # switches readers to it and the old objects are deleted: the previous dataset stays readable
    # until the new one is complete (an object store has no rename)
    generation = new_generation()
    _write_new(loc.child(generation), source, spec)
    switch_remote(loc, generation)
    return ShardsetDataset(loc)


def _write_new(loc: Location, source: ShardInput, spec: _NewDataset) -> ShardsetDataset:
    with ShardsetWriter(
        loc, uid=spec.uid, shardset=spec.shardset, fmt=spec.fmt, name=spec.name
    ) as w:
        pieces = _pieces(source, uid=spec.uid, shard_size=spec.shard_size, add_uid=spec.add_uid)
        for k, (display, t) in enumerate(pieces):
            w.write_shard(k, t, source=display)
    assert w.dataset is not None
    return w.dataset


def _leftovers_only(path: Path) -> bool:
    """A folder holding nothing but what an interrupted ``create`` leaves (mapping, marked
    shardsets, temporaries)."""
    litter = set(find_litter(path))
    return all(
        e.name == SAMPLES_FILE or (e / UNCOMMITTED).is_file() or e in litter for e in path.iterdir()
    )


def _route(ds: ShardsetDataset, table: pa.Table, display: str) -> Iterator[tuple[str, pa.Table]]:
    """Split a UID-keyed table into the dataset's shards (rows in mapping order)."""
    uid = ds.uid_column
    if uid not in table.column_names:
        raise SchemaError(
            f"the UID column {uid!r} is missing (columns: {table.column_names})",
            path=display,
            column=uid,
        )
    u = table.column(uid)
    pos = ds.mapping.positions(u, display=display)
    if pos.null_count:
        bad = np.flatnonzero(np.asarray(pos.is_null()))
        names = [u[int(i)].as_py() for i in bad[:10]]
        raise ShardsetError(
            f"{len(bad)} UIDs are not in the sample mapping: "
            f"{names}{' …' if len(bad) > 10 else ''}",
            path=display,
            uid=names[0],
            row=int(bad[0]),
            column=uid,
            hint="a shardset may only hold samples of the dataset; create a new dataset for new "
            "samples",
        )
    p = np.asarray(pos.to_numpy(), dtype=np.int64)
    order = np.argsort(p, kind="stable")
    sp = p[order]
    if len(sp) > 1 and np.any(sp[1:] == sp[:-1]):
        i = int(np.flatnonzero(sp[1:] == sp[:-1])[0])
        raise ShardsetError(
            "duplicate uid in the routed table",
            path=display,
            uid=ds.mapping.uids[int(sp[i])].as_py(),
            row=int(order[i + 1]),
            column=uid,
            hint="UIDs must be unique within a shardset",
        )
    table = table.take(pa.array(order))
    table = table.set_column(
        table.column_names.index(uid), uid, ds.mapping.cast_uids(table.column(uid), display=display)
    )
    counts = (
        np.bincount(ds.mapping.shard[sp], minlength=ds.num_shards)
        if len(sp)
        else np.zeros(ds.num_shards, int)
    )
    start = 0
    for c in counts:
        yield display, table.slice(start, int(c))
        start += int(c)


def add(
    ds: ShardsetDataset,
    shardset: str,
    source: ShardInput,
    /,
    *,
    route: bool = False,
    fmt: str = "parquet",
) -> ShardsetDataset:
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

    Examples:
        >>> import tempfile, pyarrow as pa
        >>> ds = create(
        ...     tempfile.mkdtemp() + "/ds",
        ...     pa.table({"id": [5, 6, 7]}),
        ...     uid="id",
        ...     shardset="a",
        ...     shard_size=2,
        ... )
        >>> add(ds, "b", pa.table({"id": [7, 5], "y": [1, 2]}), route=True).read_shard(
        ...     1
        ... ).to_pydict()
        {'id': [7], 'y': [1]}
    """
    if fmt not in ("parquet", "csv"):
        raise ConfigError(f"fmt must be 'parquet' or 'csv', got {fmt!r}")
    if (
        ds.loc.read_json(DATASET_MANIFEST) != ds.manifest
    ):  # a stale object: another add happened since
        ds = ShardsetDataset(ds.loc)
    with ShardsetWriter(
        ds.loc, uid=ds.uid_column, shardset=shardset, fmt=fmt
    ) as w:  # checks the name first
        pieces: Iterator[tuple[str, pa.Table]]
        if route:
            if not isinstance(source, (str, os.PathLike, pa.Table)):
                raise ConfigError(
                    "route=True takes one table or file", hint="pass one UID-keyed table"
                )
            one: TableInput = source
            table = load_table(one, uid=ds.uid_column)
            pieces = _route(ds, table, "<table>" if isinstance(one, pa.Table) else os.fspath(one))
        else:
            files = [source] if isinstance(source, (str, os.PathLike, pa.Table)) else list(source)
            if len(files) != ds.num_shards:
                raise ShardsetError(
                    f"got {len(files)} shard files, the dataset has {ds.num_shards} shards",
                    path=ds.loc.display,
                    hint="pass one file per shard in shard order, or use --route with one table",
                )
            pieces = (
                (
                    "<table>" if isinstance(f, pa.Table) else os.fspath(f),
                    load_table(f, uid=ds.uid_column),
                )
                for f in files
            )
        for k, (display, t) in enumerate(pieces):
            w.write_shard(k, t, source=display)
    assert w.dataset is not None
    return w.dataset


register_verbs(create=create, add=add)
