"""``ShardsetWriter``: write one shardset's shards (from any process) and commit them atomically.

The writer is the one place a shardset dataset is written; :func:`datamill.shards.create.create` and
:func:`datamill.shards.create.add` are thin wrappers around it, and a Ray job uses it as its sink::

    with ShardsetWriter(root, uid="uid", shardset="features") as w:    # on the driver
        sink = w.sink                                                  # picklable
        ...  # workers (processes, Ray tasks) call sink.write_shard(k, table)
    # __exit__: commit() (validate, rename, manifest last), or discard on an exception

* The first shardset of a new dataset (no ``dataset.json`` at ``root`` yet) fixes the UID → shard
  mapping (``samples.parquet``): shard ``k`` is what was written as ``k``, rows in their order.
* A later shardset must follow the mapping: every shard ``0 .. num_shards-1`` is written, each UID
  must be mapped to the shard it is written to (checked in :meth:`ShardSink.write_shard`, before
  anything is written; rows are stored in mapping order).

Each :meth:`ShardSink.write_shard` writes ``shard.{k:05d}.{fmt}`` into a hidden ``.tmp-…`` folder of
the dataset (temp name + rename, so a retried task simply replaces it) and then a small hidden
receipt (row count, schema, source name). :meth:`ShardsetWriter.commit` checks that every shard has
a receipt, that row counts match the files and schemas match across shards, validates the UIDs of
shards written by other processes (read from their UID column only), builds the mapping for a new
dataset, renames the folder to the shardset name and writes ``dataset.json`` last. Nothing is
visible to readers before that last write.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any, Self

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datamill.core.constants import DATASET_MANIFEST, SAMPLES_FILE, SHARDS_FORMAT
from datamill.core.errors import ConfigError, DataFileError, SchemaError, ShardsetError
from datamill.core.faults import fault_point
from datamill.core.io import as_output_error, find_litter
from datamill.shards._fs import Location, read_any, resolve
from datamill.shards._mapping import Mapping, schema_from_b64, schema_to_b64
from datamill.shards._remote import discard_stage, is_remote_location, stage, upload
from datamill.shards.check import shard_problems
from datamill.shards.dataset import ShardsetDataset
from datamill.shards.sink import KEEP_META, ShardSink

__all__ = ["KEEP_META", "ShardSink", "ShardsetWriter", "UNCOMMITTED", "remove_interrupted"]  # noqa: RUF022 - Python sorted() order (house rule)

_RESERVED = {DATASET_MANIFEST, SAMPLES_FILE}
UNCOMMITTED = ".uncommitted"
"""Marker inside a shardset folder between its rename and the manifest write (a kill there leaves
it)."""
_FORMATS = ("parquet", "csv")


def _check_shardset_name(loc: Location, name: str, existing: Sequence[str]) -> None:
    """Refuse an invalid shardset name, an existing one, or a folder left by an interrupted
    write."""
    if not name or "/" in name or "\\" in name or name.startswith(".") or name in _RESERVED:
        raise ConfigError(
            f"invalid shardset name {name!r}", path=loc.display, hint="use a plain folder name"
        )
    if name in existing:
        raise ShardsetError(f"the shardset {name!r} already exists", path=loc.show(name))
    if loc.exists(name):
        raise ShardsetError(
            "a folder with this name exists but is not in the manifest (left by an interrupted "
            "add?)",
            path=loc.show(name),
            hint="remove the folder, then add again",
        )


class ShardsetWriter:
    """Write one shardset (the first of a new dataset, or one more) and commit it atomically.

    Args:
        root: the dataset folder (path or pyarrow filesystem URI; on ``s3://`` the shardset is
            written to a local stage and uploaded on commit, ``dataset.json`` last). Without
            ``dataset.json`` a new dataset is created and this shardset fixes its UID → shard
            mapping; with one, a shardset is added and must follow the mapping.
        uid: the UID column (for an existing dataset it must be the dataset's).
        shardset: the shardset's name (a plain folder name, new in the dataset).
        fmt: ``"parquet"`` or ``"csv"`` shard files. Defaults to ``"parquet"``.
        name: the dataset name in the manifest of a new dataset. Defaults to ``None`` (the folder
            name).

    Raises:
        ConfigError: a bad ``fmt``, shardset name or ``uid``; ``name`` for an existing dataset.
        ShardsetError: the shardset exists already.

    Examples:
        >>> import tempfile, pyarrow as pa
        >>> root = tempfile.mkdtemp() + "/ds"
        >>> with ShardsetWriter(root, uid="id", shardset="a") as w:
        ...     w.write_shard(1, pa.table({"id": [3], "x": [30]}))
        ...     w.write_shard(0, pa.table({"id": [1, 2], "x": [10, 20]}))
        1
        2
        >>> with ShardsetWriter(root, uid="id", shardset="b") as w:
        ...     _ = [
        ...         w.write_shard(k, t)
        ...         for k, t in enumerate(
        ...             [pa.table({"id": [2], "y": ["b"]}), pa.table({"id": [3], "y": ["c"]})]
        ...         )
        ...     ]
        >>> w.dataset.read_shard(0).to_pydict()
        {'id': [1, 2], 'x': [10, 20], 'y': [None, 'b']}
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | Location,
        *,
        uid: str,
        shardset: str,
        fmt: str = "parquet",
        name: str | None = None,
    ) -> None:
        if fmt not in _FORMATS:
            raise ConfigError(f"fmt must be 'parquet' or 'csv', got {fmt!r}")
        self.loc = root if isinstance(root, Location) else resolve(root)
        if not self.loc.remote and Path(self.loc.path).is_file():
            raise DataFileError(
                "the dataset root is a file, not a folder",
                path=self.loc.display,
                hint="name a new folder (or an existing dataset) as the root",
            )
        self.remote: Location | None = (
            None  # an object store: write to a local stage, upload on commit
        )
        if is_remote_location(self.loc):
            self.remote, self.loc = self.loc, stage(self.loc)
            if name is None and not self.loc.exists(DATASET_MANIFEST):
                name = PurePosixPath(self.remote.path).name  # not the stage's folder name
        try:
            self.shardset, self.fmt, self.name = shardset, fmt, name
            self.base: ShardsetDataset | None = None
            if self.loc.exists(DATASET_MANIFEST):
                self.base = self._base(uid, name)
            self._made_root = not self.loc.exists()
            listed = self.base.shardsets if self.base is not None else []
            if not self.loc.remote and self.loc.exists():
                remove_interrupted(self.loc, listed)
            _check_shardset_name(self.loc, shardset, listed)
            self.loc.fs.create_dir(self.loc.path, recursive=True)
            self.tmp = self.loc.tmp_name(shardset)
            self.loc.fs.create_dir(self.loc.join(self.tmp))
            self.sink = ShardSink(
                self.loc, self.tmp, uid=uid, shardset=shardset, fmt=fmt, mapping_of=self.base
            )
        except BaseException:
            if self.remote is not None:  # (a refused name or uid: the stage goes)
                discard_stage(self.loc)
            raise
        self.dataset: ShardsetDataset | None = None
        self._open = True

    def _base(self, uid: str, name: str | None) -> ShardsetDataset:
        """The dataset a shardset is added to, which must fit the writer's ``uid`` (and no
        ``name``)."""
        base = ShardsetDataset(self.loc)
        if uid != base.uid_column:
            raise ConfigError(
                f"the dataset's UID column is {base.uid_column!r}, got uid={uid!r}",
                path=self.loc.show(DATASET_MANIFEST),
            )
        if name is not None:
            raise ConfigError(
                "name applies to a new dataset only", path=self.loc.show(DATASET_MANIFEST)
            )
        if self.remote is None and base.manifest.get("data_dir"):  # (a remote add's stage maps it)
            raise ShardsetError(
                f"this dataset keeps its files in {base.manifest['data_dir']}/ (an overwrite on "
                "object storage wrote it), which a local add does not write to",
                path=self.loc.display,
                hint="add the shardset where the dataset was written (s3://...), or recreate it "
                "here with `datamill shards create`",
            )
        return base

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self.discard()
            err = as_output_error(exc, self.loc.display)
            if err is not None and err is not exc:
                raise err from exc
        elif self._open:
            self.commit()

    def write_shard(self, k: int, table: pa.Table, /, *, source: str | None = None) -> int:
        """Write shard ``k`` (see :meth:`ShardSink.write_shard`); returns its rows."""
        if not self._open:
            raise ShardsetError(
                "this writer is closed (committed or discarded)", path=self.loc.display
            )
        return self.sink.write_shard(k, table, source=source)

    def discard(self) -> None:
        """Remove the temp folder (and the dataset folder if this writer made it and it is
        empty)."""
        self._open = False
        self.loc.remove_tree(self.tmp)
        if self.remote is not None:
            discard_stage(self.loc)
        elif self._made_root and self.loc.exists() and not self.loc.listdir():
            self.loc.fs.delete_dir(self.loc.path)

    def commit(self) -> ShardsetDataset:
        """Validate every shard, rename the folder into place and write ``dataset.json`` last.

        On any error the temp folder is removed and the dataset is left as it was.

        Raises:
            ShardsetError: a shard was not written, a row count differs from its file, a UID is
                duplicated / null / not in the mapping, or the manifest changed meanwhile.
            SchemaError: shards have different columns or types.
        """
        if not self._open:
            raise ShardsetError(
                "this writer is closed (committed or discarded)", path=self.loc.display
            )
        try:
            self.dataset = self._commit()
            if self.remote is not None:  # the new files, then dataset.json last
                upload(
                    self.loc,
                    self.remote,
                    self.shardset,
                    base=None if self.base is None else self.base.manifest,
                )
                discard_stage(self.loc)
                self.dataset = ShardsetDataset(self.remote)
        except BaseException as exc:
            self.discard()
            err = as_output_error(exc, self.loc.display)
            if err is not None and err is not exc:
                raise err from exc
            raise
        self._open = False
        return self.dataset

    def _receipts(self) -> dict[int, dict[str, Any]]:
        tmp = self.loc.child(self.tmp)
        out: dict[int, dict[str, Any]] = {}
        for entry in tmp.listdir():
            if entry.startswith(".shard.") and entry.endswith(".json") and ".tmp-" not in entry:
                r = tmp.read_json(entry)
                out[int(r["shard"])] = r
        return out

    def _commit(self) -> ShardsetDataset:
        loc, fmt, uid, sink = self.loc, self.fmt, self.sink.uid, self.sink
        receipts = self._receipts()
        n = self.base.num_shards if self.base is not None else len(receipts)
        self._check_complete(receipts, n)
        schema = schema_from_b64(receipts[0]["schema"])
        for k in range(n):
            self._check_written(k, receipts[k], schema)
        uids = [self._shard_uids(k, receipts[k], schema) for k in range(n)]
        rows = [int(receipts[k]["rows"]) for k in range(n)]
        entry = {
            "name": self.shardset,
            "format": fmt,
            "columns": [c for c in schema.names if c != uid],
            "schema": schema_to_b64(schema),
            "num_shards": n,
            "shard_rows": rows,
        }
        if receipts[0].get("source_metadata") is not None:
            entry["source_metadata"] = receipts[0]["source_metadata"]
        keep = {sink.shard_name(k) for k in range(n)}
        for name in loc.listdir(self.tmp):  # receipts, and parts left by killed workers
            if name not in keep:
                loc.fs.delete_file(loc.join(self.tmp, name))
        with loc.fs.open_output_stream(loc.join(self.tmp, UNCOMMITTED)) as f:
            f.write(str(os.getpid()).encode())
        fault_point("shards.before_commit")
        if self.base is None:
            return self._commit_new(uids, rows, entry, receipts)
        return self._commit_added(entry)

    def _check_complete(self, receipts: dict[int, Any], n: int) -> None:
        """Every shard index 0..n-1 written once."""
        if not receipts:
            raise ConfigError("no shards were written", path=self.loc.show(self.tmp))
        missing = sorted(set(range(n)) - set(receipts))
        if missing or len(receipts) != n:
            raise ShardsetError(
                f"shards {missing or sorted(set(receipts) - set(range(n)))} were not written; "
                f"expected shards 0..{n - 1}",
                path=self.loc.show(self.tmp),
                hint="write every shard index once (an empty table for an empty shard)",
            )

    def _check_written(self, k: int, r: dict[str, Any], schema: pa.Schema) -> None:
        """Shard ``k`` as written: shard 0's schema, and the rows its receipt says."""
        if not schema_from_b64(r["schema"]).equals(schema):
            raise SchemaError(
                f"columns/types {schema_from_b64(r['schema'])} differ from shard 0's {schema}",
                path=r["source"],
                shard=k,
                hint="cast every shard to the same schema",
            )
        loc = self.loc
        path = loc.join(self.tmp, self.sink.shard_name(k))
        got = (
            pq.read_metadata(path, filesystem=loc.fs).num_rows
            if self.fmt == "parquet"
            else read_any(loc.fs, path, display=r["source"], schema=schema).num_rows
        )
        if got != int(r["rows"]):
            raise ShardsetError(
                f"written shard has {got} rows, expected {r['rows']}", path=r["source"], shard=k
            )

    def _unmove(self) -> None:
        """Remove the shardset folder renamed into place when the manifest was not written (not
        listed)."""
        listed = self.loc.exists(DATASET_MANIFEST) and any(
            ss.get("name") == self.shardset
            for ss in self.loc.read_json(DATASET_MANIFEST).get("shardsets", [])
        )
        if not listed:
            self.loc.remove_tree(self.shardset)
            if (
                self.base is None
                and self.loc.exists(SAMPLES_FILE)
                and not self.loc.exists(DATASET_MANIFEST)
            ):
                self.loc.fs.delete_file(self.loc.join(SAMPLES_FILE))

    def _shard_uids(self, k: int, receipt: dict[str, Any], schema: pa.Schema) -> pa.Array:
        """Shard ``k``'s UIDs; shards written by another process are re-validated from their
        file."""
        known = self.sink.written.get(k)
        if known is not None and known.token == receipt["token"]:
            return known.uids
        uid = self.sink.uid
        path = self.loc.join(self.tmp, self.sink.shard_name(k))
        t = read_any(self.loc.fs, path, display=receipt["source"], columns=[uid], schema=schema)
        u = t.column(uid).combine_chunks()
        if self.base is None and u.null_count:
            row = int(np.flatnonzero(np.asarray(u.is_null()))[0])
            raise ShardsetError(
                "a UID is null", path=receipt["source"], row=row, column=uid, shard=k
            )
        if self.base is not None:
            problems = list(
                shard_problems(
                    t,
                    display=receipt["source"],
                    k=k,
                    uid_column=uid,
                    mapping=self.sink.mapping,
                    columns=None,
                    reference=self.sink.reference,
                )
            )
            if problems:
                raise problems[0]
        return u

    def _commit_new(
        self,
        uids: list[pa.Array],
        rows: list[int],
        entry: dict[str, Any],
        receipts: dict[int, dict[str, Any]],
    ) -> ShardsetDataset:
        loc, uid = self.loc, self.sink.uid
        all_uids = pa.concat_arrays(uids) if uids else pa.array([], pa.int64())
        sizes = np.asarray(rows, dtype=np.int64)
        _check_unique(all_uids, sizes, [receipts[k]["source"] for k in range(len(rows))])
        mapping = Mapping(
            all_uids, np.repeat(np.arange(len(sizes), dtype=np.int64), sizes), len(sizes)
        )
        loc.fs.move(loc.join(self.tmp), loc.join(self.shardset))
        try:
            mtmp = loc.tmp_name(SAMPLES_FILE)
            pq.write_table(mapping.to_table(uid), loc.join(mtmp), filesystem=loc.fs)
            loc.fs.move(loc.join(mtmp), loc.join(SAMPLES_FILE))
            fault_point("shards.before_manifest")
            manifest = {
                "format": SHARDS_FORMAT,
                "name": self.name or PurePosixPath(loc.path).name,
                "uid_column": uid,
                "num_shards": len(sizes),
                "num_samples": len(all_uids),
                "shardsets": [entry],
            }
            loc.write_json_atomic(DATASET_MANIFEST, manifest)
        except BaseException:
            self._unmove()
            raise
        loc.fs.delete_file(loc.join(self.shardset, UNCOMMITTED))
        return ShardsetDataset(loc)

    def _commit_added(self, entry: dict[str, Any]) -> ShardsetDataset:
        loc, base = self.loc, self.base
        assert base is not None
        if loc.read_json(DATASET_MANIFEST) != base.manifest:
            raise ShardsetError(
                "the manifest changed while this shardset was written (a concurrent add?)",
                path=loc.show(DATASET_MANIFEST),
                hint="add again",
            )
        loc.fs.move(loc.join(self.tmp), loc.join(self.shardset))
        try:
            if loc.read_json(DATASET_MANIFEST) != base.manifest:
                raise ShardsetError(
                    "the manifest changed while this shardset was written (a concurrent add?)",
                    path=loc.show(DATASET_MANIFEST),
                    hint="add again",
                )
            fault_point("shards.before_manifest")
            manifest = dict(base.manifest)
            manifest["shardsets"] = [*base.manifest["shardsets"], entry]
            loc.write_json_atomic(DATASET_MANIFEST, manifest)
        except BaseException:
            self._unmove()
            raise
        loc.fs.delete_file(loc.join(self.shardset, UNCOMMITTED))
        return ShardsetDataset(loc)


def remove_interrupted(loc: Location, listed: Sequence[str]) -> list[str]:
    """Remove what killed writers left in a local dataset folder; returns the names removed.

    That is: temporaries of dead processes, shardset folders renamed into place but never entered in
    the manifest (they hold :data:`UNCOMMITTED`), and that marker inside listed shardsets.
    """
    removed = [p.name for p in find_litter(loc.path, remove=True)]
    for entry in loc.listdir():
        if entry.startswith(".") or not loc.exists(entry, UNCOMMITTED):
            continue
        if entry in listed:
            loc.fs.delete_file(loc.join(entry, UNCOMMITTED))
            continue
        try:
            with loc.fs.open_input_stream(loc.join(entry, UNCOMMITTED)) as f:
                pid = int(f.read().decode() or "0")
        except (OSError, ValueError):
            pid = 0
        if pid and pid != os.getpid() and _alive(pid):
            continue  # a writer is committing it right now
        loc.remove_tree(entry)
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _check_unique(
    uids: pa.Array, sizes: np.ndarray[Any, np.dtype[np.int64]], displays: list[str]
) -> None:
    if pa.types.is_integer(uids.type) and uids.null_count == 0:
        # integers: a sort (or none when already increasing, as row indices are) in 2 x 8 bytes per
        # UID; Arrow's count_distinct hash table took 2 GB for 10M UIDs (the Ray engine's driver)
        u = np.asarray(uids.to_numpy(zero_copy_only=False))
        if len(u) < 2 or bool(np.all(u[1:] > u[:-1])):
            return
        s = np.sort(u, kind="stable")
        if not bool(np.any(s[1:] == s[:-1])):
            return
    elif pc.count_distinct(uids).as_py() == len(uids):
        return
    counts = pc.value_counts(uids)
    dup = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"]
    rows = np.flatnonzero(np.asarray(pc.equal(uids, dup).fill_null(False)))
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    shards = np.searchsorted(offsets, rows, side="right") - 1
    k = int(shards[1])
    raise ShardsetError(
        f"duplicate uid (also in shard {int(shards[0])}, {displays[int(shards[0])]})",
        path=displays[k],
        uid=dup.as_py(),
        row=int(rows[1] - offsets[k]),
        shard=k,
        hint="UIDs must be unique within a shardset",
    )
