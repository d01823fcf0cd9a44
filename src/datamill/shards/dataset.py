"""``ShardsetDataset``: read a UID-keyed shardset dataset (a :class:`~datamill.core.source.Source`).

A dataset folder holds ``dataset.json`` (the manifest, written last), ``samples.parquet`` (the
sample→shard mapping: UID → shard index, sorted by shard; its order is the row order of every
joined shard) and one folder per shardset with ``shard.00000.parquet`` (or ``.csv``) …. A sample
in shard ``k`` of one shardset is in shard ``k`` of every shardset that has it; shardsets may lack
samples, which read as nulls (``join="left"``, the default) or are dropped and counted
(``join="inner"``).

On object storage (``s3://bucket/prefix``) shard files are downloaded whole into a bounded, checked
local cache (``cache_dir``, ``cache_limit``; see :mod:`datamill.shards._remote`), so the Loader's
plan-ordered shard reads also prefetch the downloads.

This module only reads. Writing lives in :mod:`datamill.shards.writer` (:class:`ShardsetWriter`) and
:mod:`datamill.shards.create` (``create``/``add``), which import this module; the conveniences
:meth:`ShardsetDataset.create` and :meth:`ShardsetDataset.add` find them in a registry
(:mod:`datamill.shards._verbs`) that :mod:`datamill.shards.create` fills when the package is
imported, so the reader never imports the writer that opens and returns readers.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from numpy.typing import NDArray

from datamill.core.constants import DATASET_MANIFEST, ROW_HASHES_KEY, SAMPLES_FILE, SHARD_PATTERN
from datamill.core.errors import (
    ConfigError,
    DataFileError,
    DataFileNotFoundError,
    DatamillError,
    SchemaError,
    ShardsetError,
)
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.objstore import store_error
from datamill.core.parquet import open_parquet
from datamill.core.source import check_read_args, register_source
from datamill.shards._fs import Location, read_any, resolve
from datamill.shards._manifest import validate_manifest
from datamill.shards._mapping import Mapping, UidIndex, schema_from_b64
from datamill.shards._remote import RemoteShards, is_remote_location
from datamill.shards._verbs import verb
from datamill.shards.describe import description, summary

if TYPE_CHECKING:
    from datamill.shards._tables import ShardInput

__all__ = ["ShardsetDataset"]

DROPPED_KEY = b"datamill.dropped"


_POOL: tuple[int, ThreadPoolExecutor] | None = None


def _read_pool() -> ThreadPoolExecutor:
    """Threads reading shard files, shared by every dataset of this process (made anew after a
    fork)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (
            os.getpid(),
            ThreadPoolExecutor(
                max(2, min(4, os.cpu_count() or 1)), thread_name_prefix="datamill-shards"
            ),
        )
    return _POOL[1]


class ShardsetDataset:
    """A shardset dataset opened for reading (:meth:`create` and :meth:`add` call the writer).

    Args:
        root: the dataset folder, a local path or a pyarrow filesystem URI (``file://``, ``s3://``
            …).
        cache_shards: how many opened shard files :meth:`get` keeps (LRU). Defaults to ``16``.
        cache_dir: on an object store (``s3://``), the local folder shard files are downloaded to
            (checked, see :mod:`datamill.shards._remote`). Defaults to ``None``
            (:func:`~datamill.core.objstore.default_cache_dir`).
        cache_limit: bytes that folder keeps at most (least recently used evicted). Defaults to
            ``None`` (no limit).
        filesystem: the filesystem of an ``s3://`` root. Defaults to ``None``
            (:func:`~datamill.core.objstore.s3_filesystem`: endpoint and keys from ``AWS_*``
            variables).

    Raises:
        DataFileNotFoundError: there is no ``dataset.json``.
        ShardsetError: the manifest has another format version or is malformed (the message names
            the field, e.g. ``shardsets[1].num_shards``).

    Examples:
        >>> import tempfile, pyarrow as pa
        >>> root = tempfile.mkdtemp() + "/ds"
        >>> ds = ShardsetDataset.create(root, pa.table({"uid": [1, 2, 3], "x": [10, 20, 30]}),
        ...                             uid="uid", shardset="a", shard_size=2)
        >>> ds = ds.add("b", pa.table({"uid": [3, 1], "y": ["c", "a"]}), route=True)
        >>> len(ds), ds.num_shards, ds.shardsets, ds.columns
        (3, 2, ['a', 'b'], ['uid', 'x', 'y'])
        >>> ds.read_shard(0).to_pydict()
        {'uid': [1, 2], 'x': [10, 20], 'y': ['a', None]}
        >>> ds.get(2)
        {'uid': 2, 'x': 20, 'y': None}
        >>> ds.read_shard(0, join="inner").num_rows, ds.last_dropped
        (1, {'a': 0, 'b': 1})
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | Location,
        *,
        cache_shards: int = 16,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        self.loc = root if isinstance(root, Location) else resolve(root, filesystem=filesystem)
        self.remote: RemoteShards | None = None
        if is_remote_location(self.loc):
            self.remote = RemoteShards(self.loc, cache_dir=cache_dir, cache_limit=cache_limit)
        try:
            manifest = self.loc.read_json(DATASET_MANIFEST)
            validate_manifest(manifest, path=self.loc.show(DATASET_MANIFEST))
            # the data folder: beside dataset.json, or the generation an object-store overwrite made
            self._prefix: str = manifest.get("data_dir") or ""
            table = read_any(
                self.loc.fs,
                self.loc.join(self.samples_path),
                display=self.loc.show(self.samples_path),
            )
        except DatamillError:
            raise
        except OSError as exc:  # an object store's failure (a DatamillError passes unchanged)
            raise store_error(exc, self.loc.display) from exc
        self.manifest: dict[str, Any] = manifest
        self.uid_column: str = manifest["uid_column"]
        self._sets = {ss["name"]: ss for ss in manifest["shardsets"]}
        self._schemas = {ss["name"]: schema_from_b64(ss["schema"]) for ss in manifest["shardsets"]}
        self._owner = {c: ss["name"] for ss in manifest["shardsets"] for c in ss["columns"]}
        try:
            self.mapping = Mapping.from_table(table, self.uid_column, int(manifest["num_shards"]))
        except (KeyError, ValueError, TypeError, pa.ArrowException) as exc:
            raise ShardsetError(
                f"the mapping is unusable (a missing column or a bad shard index?): {exc}",
                path=self.loc.show(self.samples_path),
                hint="run `datamill shards check`",
            ) from exc
        self._cache: OrderedDict[tuple[str, int], tuple[pa.Table, UidIndex]] = OrderedDict()
        self._cache_size = cache_shards
        # parsed Parquet footers by file (the dataset is read as it was when opened, like the
        # manifest):
        # a second pass over a shard skips parsing the footer (a quarter of a small shard's read
        # time)
        self._footers: dict[str, tuple[int, pq.FileMetaData]] = {}
        self.last_dropped: dict[str, int] = {}

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
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
        """Create a dataset from shard files (their order is the shard index) or one table/file.

        A thin wrapper of :func:`datamill.shards.create.create` (see it for the arguments).
        """
        ds: ShardsetDataset = verb("create")(
            root,
            source,
            uid=uid,
            shardset=shardset,
            shard_size=shard_size,
            fmt=fmt,
            name=name,
            add_uid=add_uid,
            overwrite=overwrite,
        )
        return ds

    def add(
        self, shardset: str, source: ShardInput, /, *, route: bool = False, fmt: str = "parquet"
    ) -> ShardsetDataset:
        """Add a shardset atomically and return the reopened dataset.

        A thin wrapper of :func:`datamill.shards.create.add` (see it for the arguments); this object
        itself is read-only and keeps describing the dataset as it was opened.
        """
        ds: ShardsetDataset = verb("add")(self, shardset, source, route=route, fmt=fmt)
        return ds

    # -- Source protocol -----------------------------------------------------------------------
    @property
    def columns(self) -> list[str]:
        """The UID column, then every shardset's columns in manifest order."""
        return [self.uid_column, *self._owner]

    @property
    def num_shards(self) -> int:
        return self.mapping.num_shards

    def shard_sizes(self) -> NDArray[np.int64]:
        """Samples per shard (the mapping's counts: what ``read_shard(k)`` returns with
        ``join="left"``)."""
        return self.mapping.sizes.copy()

    def shard_nbytes(self) -> NDArray[np.int64]:
        """Bytes per shard (every shardset's file; from one listing per shardset, no file read)."""
        out = np.zeros(self.num_shards, dtype=np.int64)
        for name in self._sets:
            folder = self._rel(name)
            try:
                infos = (
                    self.remote.listing(folder)
                    if self.remote is not None
                    else {
                        i.base_name: i
                        for i in self.loc.fs.get_file_info(
                            pafs.FileSelector(self.loc.join(folder), allow_not_found=True)
                        )
                    }
                )
            except DatamillError:
                raise
            except OSError as exc:
                raise store_error(exc, self.loc.show(folder)) from exc
            for k in range(self.num_shards):
                info = infos.get(self.shard_path(name, k).rsplit("/", 1)[1])
                out[k] += int(info.size or 0) if info is not None else 0
        return out

    def fingerprint(self) -> str:
        # (the pointer to cached row hashes, added by `datamill diff`, is not the data)
        return fingerprint_obj({k: v for k, v in self.manifest.items() if k != ROW_HASHES_KEY})

    def __len__(self) -> int:
        return len(self.mapping.uids)

    @property
    def uids(self) -> pa.Array:
        """Every UID, in mapping order (by shard)."""
        return self.mapping.uids

    @property
    def shardsets(self) -> list[str]:
        return list(self._sets)

    # -- reading --------------------------------------------------------------------------------
    def _groups(self, columns: Sequence[str] | str | None) -> list[tuple[str, list[str]]]:
        if columns is None:
            return [(name, list(ss["columns"])) for name, ss in self._sets.items()]
        cols = [columns] if isinstance(columns, str) else list(columns)
        groups: dict[str, list[str]] = {}
        for c in cols:
            if c == self.uid_column:
                continue
            if c not in self._owner:
                raise SchemaError(
                    f"no shardset has column {c!r}; columns: {self.columns}",
                    path=self.loc.display,
                    column=c,
                )
            groups.setdefault(self._owner[c], []).append(c)
        return list(groups.items())

    def _rel(self, *parts: str) -> str:
        """``parts`` inside the data folder, as a path relative to the root."""
        return "/".join([self._prefix, *parts] if self._prefix else parts)

    @property
    def samples_path(self) -> str:
        """Path of the sample mapping relative to the root."""
        return self._rel(SAMPLES_FILE)

    def shard_path(self, shardset: str, k: int) -> str:
        """Path of shard ``k`` of ``shardset`` relative to the root."""
        return self._rel(
            shardset, SHARD_PATTERN.format(index=k, ext=self._sets[shardset]["format"])
        )

    def _read(self, shardset: str, k: int, columns: list[str]) -> pa.Table:
        """Shard ``k`` of ``shardset``, checked against the manifest's row count (its UIDs are
        checked against the mapping by the caller: :meth:`read_shard` while joining, :meth:`_open`
        for ``get``)."""
        t = self._read_file(shardset, k, columns)
        expected = self._sets[shardset]["shard_rows"][k]
        if t.num_rows != expected:
            raise ShardsetError(
                f"the shard file has {t.num_rows} rows, the manifest says {expected} "
                "(truncated, edited or swapped?)",
                path=self.loc.show(self.shard_path(shardset, k)),
                shard=k,
                hint="restore the file, or run `datamill shards check` for details",
            )
        return t

    def _check_uids(self, shardset: str, k: int, t: pa.Table) -> None:
        """Every UID of the shard file is mapped to shard ``k`` (a swapped or edited file is an
        error)."""
        su = t.column(self.uid_column).combine_chunks()
        uids = self.mapping.shard_uids(k)
        if (
            not su.equals(uids)
            and (pc.sum(pc.is_in(su, value_set=uids)).as_py() or 0) != t.num_rows
        ):
            raise ShardsetError(
                f"the shard file holds UIDs that are not mapped to shard {k} (swapped or edited?)",
                path=self.loc.show(self.shard_path(shardset, k)),
                shard=k,
                hint="restore the file, or run `datamill shards check` for the list",
            )

    def _read_file(self, shardset: str, k: int, columns: list[str]) -> pa.Table:
        rel = self.shard_path(shardset, k)
        cols = [self.uid_column, *columns]
        data = None
        if self.remote is not None:  # downloaded whole into the checked local cache
            data = self.remote.fetch(self._sets[shardset], rel, k)
        elif self._sets[shardset]["format"] == "parquet":
            return self._read_parquet(rel, k, cols)
        return read_any(
            self.loc.fs,
            self.loc.join(rel),
            display=self.loc.show(rel),
            columns=cols,
            schema=self._schemas[shardset],
            data=data,
        )

    def _read_parquet(self, rel: str, k: int, cols: list[str]) -> pa.Table:
        """A local Parquet shard, its footer parsed once per file size."""
        try:
            path = self.loc.join(rel)
            with self.loc.fs.open_input_file(path) as f:
                size = f.size()
                known = self._footers.get(path)
                pf = open_parquet(
                    f, metadata=known[1] if known is not None and known[0] == size else None
                )
                if known is None or known[0] != size:
                    self._footers[path] = (size, pf.metadata)
                return pf.read(columns=cols)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise read_error(self.loc.show(rel), k, exc) from exc

    def _read_groups(self, index: int, groups: list[tuple[str, list[str]]]) -> list[pa.Table]:
        """Each shardset's file of shard ``index`` (side by side: Arrow releases the GIL)."""
        if len(groups) > 1:
            return list(_read_pool().map(lambda g: self._read(g[0], index, g[1]), groups))
        return [self._read(ss, index, cols) for ss, cols in groups]

    def _aligned(
        self, ss: str, index: int, t: pa.Table, uids: pa.Array, cols: list[str], *, inner: bool
    ) -> tuple[pa.Table, pa.Array | None]:
        """A shardset's table in the mapping's row order, and (``inner``) which rows it has."""
        su = t.column(self.uid_column).combine_chunks()
        if su.equals(uids):
            return t, None
        idx = pc.index_in(uids, value_set=su)
        if len(idx) - idx.null_count != t.num_rows:
            raise ShardsetError(
                f"{t.num_rows - (len(idx) - idx.null_count)} UIDs of this file are not mapped to "
                f"shard {index} (or are duplicated)",
                path=self.loc.show(self.shard_path(ss, index)),
                shard=index,
                hint="run `datamill shards check` for the list",
            )
        # (not the UID column: the mapping's is used)
        return t.select(cols).take(idx), idx.is_valid() if inner else None

    def read_shard(
        self, index: int, *, columns: Sequence[str] | str | None = None, join: str = "left"
    ) -> pa.Table:
        """Shard ``index`` joined across shardsets, rows in mapping order.

        Args:
            index: the shard index.
            columns: columns to read, in this order (the UID column is included only when listed);
                only shardsets holding them are opened. Defaults to ``None`` (the UID column, then
                every shardset's columns).
            join: ``"left"`` keeps every sample of the shard (nulls where a shardset lacks it);
                ``"inner"`` keeps samples present in every chosen shardset and records the number
                dropped per shardset in :attr:`last_dropped` and in the schema metadata
                ``datamill.dropped``. Defaults to ``"left"``.

        Raises:
            ConfigError: a bad shard index (``shard`` set) or ``join``.
            SchemaError: an unknown column (``column`` set).
            ShardsetError: a shard file holds UIDs that are not mapped to this shard.
        """
        checked = check_read_args(
            self, index, columns, path=self.loc.display
        )  # one contract for every Source
        columns = None if columns is None else checked
        if join not in ("left", "inner"):
            raise ConfigError(
                f"join must be 'left' or 'inner', got {join!r}", path=self.loc.display
            )
        index = int(index)
        uids = self.mapping.shard_uids(index)
        names: list[str] = [self.uid_column]
        arrays: list[Any] = [uids]
        present: dict[str, pa.Array | None] = {}
        groups = list(self._groups(columns))
        for (ss, cols), t in zip(groups, self._read_groups(index, groups)):
            t, present[ss] = self._aligned(ss, index, t, uids, cols, inner=join == "inner")
            for c in cols:
                names.append(c)
                arrays.append(t.column(c))
        out = pa.Table.from_arrays(arrays, names=names)
        if columns is not None:
            out = out.select(list(columns))  # the caller's order; the UID column only if asked for
        if join == "left":
            return out
        dropped = {
            ss: 0 if m is None else int(len(m) - (pc.sum(m).as_py() or 0))
            for ss, m in present.items()
        }
        masks = [m for m in present.values() if m is not None]
        if masks:
            keep = masks[0]
            for m in masks[1:]:
                keep = pc.and_(keep, m)
            out = out.filter(keep)
        self.last_dropped = dropped
        return out.replace_schema_metadata({DROPPED_KEY: json.dumps(dropped).encode()})

    def _open(self, ss: str, k: int) -> tuple[pa.Table, UidIndex]:
        key = (ss, k)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        t = self._read(ss, k, list(self._sets[ss]["columns"]))
        self._check_uids(ss, k, t)
        entry = (t, UidIndex(t.column(self.uid_column)))
        self._cache[key] = entry
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return entry

    def get(self, uid: Any, *, columns: Sequence[str] | str | None = None) -> dict[str, Any]:
        """One sample joined across shardsets (``None`` for the columns of a shardset lacking it).

        Reads at most one shard per chosen shardset; opened shards are kept in an LRU cache.

        Raises:
            ShardsetError: the UID is not in the dataset (``uid`` attribute set).
        """
        pos = self.mapping.index.find(uid)
        if pos is None:
            raise ShardsetError(
                "no such sample in the mapping",
                path=self.loc.show(self.samples_path),
                uid=uid,
                hint="see `datamill shards info` for the UID column and its type",
            )
        k = int(self.mapping.shard[pos])
        out: dict[str, Any] = {self.uid_column: uid}
        for ss, cols in self._groups(columns):
            t, index = self._open(ss, k)
            row = index.find(uid)
            for c in cols:
                out[c] = None if row is None else t.column(c)[row].as_py()
        return out

    def present_counts(self) -> dict[str, int]:
        """Samples held by each shardset (from the manifest)."""
        return {name: int(sum(ss["shard_rows"])) for name, ss in self._sets.items()}

    def info(self) -> str:
        """A short human-readable summary (what ``datamill shards info`` prints)."""
        return summary(self)

    def describe(self) -> dict[str, Any]:
        """The dataset as plain JSON-able data (for the web UI): shardsets, typed columns, counts,
        sizes.

        Counts come from the manifest (each shard's row count, checked against the files when
        written) and sizes from a folder listing: no shard file is read.

        Returns:
            ``{"root", "name", "uid_column", "uid_type", "num_samples", "num_shards", "fingerprint",
            "shardsets": [{"name", "format", "num_shards", "columns": [{"name", "type"}], "rows",
            "missing", "bytes"}], "bytes"}``; ``missing`` counts the samples of the mapping the
            shardset lacks, ``bytes`` are file sizes (the total includes the manifest and mapping).

        Examples:
            >>> import tempfile, pyarrow as pa
            >>> ds = ShardsetDataset.create(
            ...     tempfile.mkdtemp() + "/ds",
            ...     pa.table({"id": [1, 2, 3]}),
            ...     uid="id",
            ...     shardset="a",
            ...     shard_size=2,
            ... )
            >>> ds = ds.add("b", pa.table({"id": [2], "y": [0.5]}), route=True)
            >>> d = ds.describe()
            >>> (
            ...     d["num_samples"],
            ...     d["num_shards"],
            ...     [(s["name"], s["rows"], s["missing"]) for s in d["shardsets"]],
            ... )
            (3, 2, [('a', 3, 0), ('b', 1, 2)])
            >>> d["shardsets"][1]["columns"]
            [{'name': 'y', 'type': 'double'}]
        """
        return description(self)

    def to_table(
        self, *, columns: Sequence[str] | str | None = None, join: str = "left"
    ) -> pa.Table:
        """Every shard joined and concatenated into one table (for export)."""
        parts = [self.read_shard(k, columns=columns, join=join) for k in range(self.num_shards)]
        if not parts:
            raise ShardsetError("the dataset has no shards", path=self.loc.display)
        return pa.concat_tables([p.replace_schema_metadata(None) for p in parts])

    def to_hf(self, *, columns: Sequence[str] | str | None = None, join: str = "left") -> Any:
        """The dataset as a Hugging Face ``datasets.Dataset`` over :meth:`to_table` (no per-row
        conversion).

        See also :func:`datamill.hf.to_dataset` (any datamill output) and
        :func:`datamill.hf.to_iterable_dataset`.

        Raises:
            MissingExtraError: ``datasets`` is not installed (``pip install 'datamill[hf]'``).
        """
        from datamill.core.optional import require

        return require("datasets", extra="hf").Dataset(self.to_table(columns=columns, join=join))


def read_error(display: str, k: int, exc: BaseException) -> DatamillError:
    """A reading failure of shard ``k`` as a located DatamillError."""
    if isinstance(exc, FileNotFoundError):
        return DataFileNotFoundError("shard file is missing", path=display, shard=k)
    return DataFileError(
        f"cannot read this Parquet file (corrupt or truncated?): {exc}",
        path=display,
        shard=k,
        hint="run `datamill shards check`",
    )


register_source(
    "shardset",
    marker=lambda p: p.is_dir() and (p / DATASET_MANIFEST).is_file(),
    opener=ShardsetDataset,
    priority=20,
)
