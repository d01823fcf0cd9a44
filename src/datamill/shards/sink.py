"""The picklable half of a shardset writer: :class:`ShardSink` writes shards into the writer's
hidden temporary folder, in this process or in workers (``multiprocessing``, Ray tasks), each with a
receipt the writer's commit checks (:class:`~datamill.shards.writer.ShardsetWriter`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from datamill.core.constants import SHARD_PATTERN
from datamill.core.errors import ConfigError, SchemaError, ShardsetError
from datamill.core.faults import fault_point
from datamill.shards._fs import Location, write_any
from datamill.shards._mapping import Mapping, schema_to_b64
from datamill.shards._tables import conform
from datamill.shards.check import shard_problems
from datamill.shards.dataset import ShardsetDataset

__all__ = ["KEEP_META", "ShardSink", "receipt_name"]

KEEP_META = b"datamill"
"""Schema metadata key of shard 0 kept in the manifest (``source_metadata``), e.g. a BERT Parquet's
vocab."""


def receipt_name(k: int, fmt: str) -> str:
    return "." + SHARD_PATTERN.format(index=k, ext=fmt) + ".json"


@dataclass
class _Written:
    """What the writing process knows about a shard it wrote (saves commit re-reading it)."""

    token: str
    uids: pa.Array


class ShardSink:
    """The picklable part of a :class:`ShardsetWriter`: writes shards into its hidden temp folder.

    Get it from :attr:`ShardsetWriter.sink`; send it to worker processes (``multiprocessing``, Ray
    tasks) and call :meth:`write_shard` there. Shards written through a pickled copy are validated
    again by :meth:`ShardsetWriter.commit`.
    """

    def __init__(
        self,
        loc: Location,
        tmp: str,
        *,
        uid: str,
        shardset: str,
        fmt: str,
        mapping_of: ShardsetDataset | None,
    ) -> None:
        if not isinstance(loc, Location):
            raise TypeError(
                f"ShardSink writes to a Location (see ShardsetWriter), got {type(loc).__name__}"
            )
        self.loc, self.tmp, self.uid, self.shardset, self.fmt = loc, tmp, uid, shardset, fmt
        self.adding = mapping_of is not None
        self.num_shards = mapping_of.num_shards if mapping_of is not None else None
        self.existing = (
            [c for c in mapping_of.columns if c != uid] if mapping_of is not None else []
        )
        first = mapping_of.manifest["shardsets"][0] if mapping_of is not None else None
        self.reference = (first["name"], first["format"]) if first is not None else ("", fmt)
        self._mapping = mapping_of.mapping if mapping_of is not None else None
        self._schema: pa.Schema | None = None
        self.written: dict[int, _Written] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_mapping=None, _schema=None, written={})  # a worker reloads the mapping once
        return state

    @property
    def mapping(self) -> Mapping:
        """The dataset's mapping (add mode), read from ``samples.parquet`` once per process."""
        if self._mapping is None:
            self._mapping = ShardsetDataset(self.loc).mapping
        return self._mapping

    def shard_name(self, k: int) -> str:
        return SHARD_PATTERN.format(index=k, ext=self.fmt)

    def _prepare(self, k: int, table: pa.Table, display: str) -> pa.Table:
        uid = self.uid
        if uid not in table.column_names:
            raise SchemaError(
                f"the UID column {uid!r} is missing (columns: {table.column_names})",
                path=display,
                column=uid,
                shard=k,
                hint="every shard file needs the UID column",
            )
        if self.adding:
            clash = [c for c in table.column_names if c != uid and c in self.existing]
            if clash:
                raise SchemaError(
                    f"columns {clash} already exist in the dataset",
                    path=display,
                    column=clash[0],
                    hint="rename them; a column lives in exactly one shardset",
                )
            problems = list(
                shard_problems(
                    table,
                    display=display,
                    k=k,
                    uid_column=uid,
                    mapping=self.mapping,
                    columns=None,
                    reference=self.reference,
                )
            )
            if problems:
                if len(problems) > 1:
                    problems[0].add_note(f"{len(problems) - 1} more violations in this file")
                raise problems[0]
            table = table.set_column(
                table.column_names.index(uid),
                uid,
                self.mapping.cast_uids(table.column(uid), display=display),
            )
            pos = np.asarray(
                self.mapping.positions_near(table.column(uid), k).to_numpy(), dtype=np.int64
            )
            if len(pos) > 1 and np.any(np.diff(pos) < 0):  # store rows in mapping order
                table = table.take(pa.array(np.argsort(pos, kind="stable")))
        table = conform(table, self._schema, display=display, k=k)
        if not self.adding:
            u = table.column(uid)
            if u.null_count:
                row = int(np.flatnonzero(np.asarray(u.is_null()))[0])
                raise ShardsetError("a UID is null", path=display, row=row, column=uid, shard=k)
        return table

    def write_shard(self, k: int, table: pa.Table, /, *, source: str | None = None) -> int:
        """Validate ``table`` as shard ``k`` and write it atomically into the temp folder; returns
        its rows.

        Args:
            k: the shard index (``0 <= k < num_shards`` when adding to a dataset).
            table: the shard's rows, with the UID column.
            source: the name shown in errors (an input file). Defaults to ``None`` (the shard file).

        Raises:
            ConfigError: a bad shard index.
            SchemaError: a missing UID column, a column the dataset already has, columns or types
                differing from the first shard this process wrote.
            ShardsetError: a null UID; when adding, a UID unknown to the mapping, in another shard
                or duplicated.
        """
        if (
            isinstance(k, bool)
            or not isinstance(k, (int, np.integer))
            or k < 0
            or (self.num_shards is not None and k >= self.num_shards)
        ):
            bound = f"[0, {self.num_shards})" if self.num_shards is not None else ">= 0"
            raise ConfigError(
                f"shard index must be in {bound}, got {k!r}", path=self.loc.display, shard=str(k)
            )
        k = int(k)
        display = source if source is not None else self.loc.show(self.shardset, self.shard_name(k))
        meta = table.schema.metadata or {}
        table = self._prepare(k, table, display)
        if self._schema is None:
            self._schema = table.schema
        token = os.urandom(8).hex()
        part = self.loc.tmp_name(self.shard_name(k))
        write_any(
            self.loc.fs, self.loc.join(self.tmp, part), table, self.fmt, local=not self.loc.remote
        )
        self.loc.fs.move(self.loc.join(self.tmp, part), self.loc.join(self.tmp, self.shard_name(k)))
        receipt = {
            "shard": k,
            "rows": table.num_rows,
            "schema": schema_to_b64(table.schema),
            "source": display,
            "token": token,
            "source_metadata": meta[KEEP_META].decode("utf-8", "replace")
            if KEEP_META in meta
            else None,
        }
        tmp_loc = self.loc.child(self.tmp)
        tmp_loc.write_json_atomic(
            receipt_name(k, self.fmt), receipt, durable=False
        )  # scratch: no fsync
        fault_point("shards.shard_written")
        self.written[k] = _Written(token, table.column(self.uid).combine_chunks())
        return int(table.num_rows)
