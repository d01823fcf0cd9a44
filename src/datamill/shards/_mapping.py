"""The sample→shard mapping (``samples.parquet``) and a UID index for point look-ups."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.arrow import to_numpy
from datamill.core.errors import SchemaError

__all__ = ["Mapping", "UidIndex", "schema_from_b64", "schema_to_b64"]

SHARD_COLUMN = "shard"


def schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.remove_metadata().serialize().to_pybytes()).decode("ascii")


def schema_from_b64(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


class UidIndex:
    """UID → position: a sorted numpy array for integer UIDs, a dict otherwise (built once)."""

    def __init__(self, uids: pa.Array | pa.ChunkedArray) -> None:
        self.numeric = pa.types.is_integer(uids.type)
        if self.numeric:
            values = np.asarray(uids.to_numpy(zero_copy_only=False))
            self.order = np.argsort(values, kind="stable")
            self.sorted = values[self.order]
        else:
            self.table = {u: i for i, u in enumerate(uids.to_pylist())}

    def find(self, uid: Any) -> int | None:
        if not self.numeric:
            return self.table.get(uid)
        if isinstance(uid, bool) or not isinstance(uid, (int, np.integer)):
            return None
        i = int(np.searchsorted(self.sorted, uid))
        if i < len(self.sorted) and self.sorted[i] == uid:
            return int(self.order[i])
        return None


class Mapping:
    """UIDs in mapping order (sorted by shard, then by their row in the first shardset)."""

    def __init__(self, uids: pa.Array, shard: NDArray[np.int64], num_shards: int) -> None:
        self.uids = uids
        self.shard = shard
        self.num_shards = num_shards
        self.sizes = (
            np.bincount(shard, minlength=num_shards).astype(np.int64)
            if len(shard)
            else np.zeros(num_shards, np.int64)
        )
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self._index: UidIndex | None = None

    @classmethod
    def from_table(cls, table: pa.Table, uid_column: str, num_shards: int) -> Mapping:
        uids = table.column(uid_column).combine_chunks()
        # from the column's buffer: pyarrow's to_numpy() imports pandas first (0.17 s of an open)
        shard = to_numpy(table.column(SHARD_COLUMN)).astype(np.int64)
        return cls(uids, shard, num_shards)

    def to_table(self, uid_column: str) -> pa.Table:
        return pa.table(
            {uid_column: self.uids, SHARD_COLUMN: pa.array(self.shard.astype(np.int32))}
        )

    def shard_uids(self, k: int) -> pa.Array:
        return self.uids.slice(int(self.offsets[k]), int(self.sizes[k]))

    def cast_uids(
        self, uids: pa.Array | pa.ChunkedArray, *, display: str
    ) -> pa.Array | pa.ChunkedArray:
        """``uids`` cast to the mapping's UID type (SchemaError naming ``display`` when
        impossible)."""
        if uids.type == self.uids.type:
            return uids
        try:
            return uids.cast(self.uids.type)
        except (pa.ArrowException, ValueError) as exc:
            raise SchemaError(
                f"UIDs of type {uids.type} do not match the mapping's {self.uids.type}: {exc}",
                path=display,
                hint="give the UID column the type it has in samples.parquet",
            ) from exc

    def positions(self, uids: pa.Array | pa.ChunkedArray, *, display: str = "<table>") -> pa.Array:
        """Mapping position of each UID (null when unknown), vectorised."""
        return pc.index_in(self.cast_uids(uids, display=display), value_set=self.uids)

    def positions_near(
        self, uids: pa.Array | pa.ChunkedArray, k: int, *, display: str = "<table>"
    ) -> pa.Array:
        """Like :meth:`positions`, looking in shard ``k`` first (a small hash table) and in the
        whole mapping only for the UIDs not found there."""
        uids = self.cast_uids(uids, display=display)
        if isinstance(uids, pa.ChunkedArray):
            uids = uids.combine_chunks()
        local = pc.index_in(uids, value_set=self.shard_uids(k))
        pos = pc.add(local.cast(pa.int64()), pa.scalar(int(self.offsets[k]), pa.int64()))
        if not local.null_count:
            return pos
        missing = np.flatnonzero(np.asarray(local.is_null()))
        far = np.asarray(
            pc.index_in(uids.take(pa.array(missing)), value_set=self.uids)
            .cast(pa.int64())
            .fill_null(-1)
            .to_numpy()
        )
        out = np.asarray(pos.fill_null(-1).to_numpy()).copy()
        out[missing] = far
        return pa.array(out, mask=out < 0)

    @property
    def index(self) -> UidIndex:
        if self._index is None:
            self._index = UidIndex(self.uids)
        return self._index
