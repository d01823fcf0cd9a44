"""vector → fixed-size float vectors: ``(n, vector_size)`` float32 from whitespace-separated
numbers.

``vector_size`` is taken from the data (the largest row, fitted as a mergeable maximum) unless set;
every row must have exactly that many values (an error names the row otherwise), as Ludwig checks.
A missing value filled with the default ``fill_value`` ``""`` becomes a zero vector (Ludwig's
default ``""`` would be rejected by its size check).
"""

from __future__ import annotations

import builtins
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray
from pydantic import Field

from datamill.preprocessing.features.base import (
    CSR,
    FeatureContext,
    StringFeatureHandler,
)
from datamill.preprocessing.features.base import Params as BaseParams

__all__ = ["Handler", "VectorParams"]


class VectorParams(BaseParams):
    """``preprocessing:`` of a vector feature."""

    vector_size: int | None = Field(default=None, ge=1)


def _split(column: pa.Array, ctx: FeatureContext) -> tuple[pa.Array, NDArray[np.int64]]:
    """(flat float64 values, values per row); an empty string is an empty row."""
    strings = pc.utf8_trim_whitespace(column)
    lists = pc.utf8_split_whitespace(strings)
    lengths = np.array(
        pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False), np.int64
    )
    lengths[np.asarray(pc.equal(strings, "").to_numpy(zero_copy_only=False), bool)] = 0
    flat = pc.list_flatten(lists)
    flat = flat.filter(pc.not_equal(flat, ""))
    try:
        values = pc.cast(flat, pa.float64())
    except pa.ArrowInvalid as exc:
        ok = pc.match_substring_regex(
            flat, r"^[-+]?((\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|inf|infinity|nan)$", ignore_case=True
        )
        bad = int(np.flatnonzero(~ok.to_numpy(zero_copy_only=False))[0])
        row = int(np.searchsorted(np.cumsum(lengths), bad, side="right"))
        raise ctx.error(
            f"expected whitespace-separated numbers, got {flat[bad].as_py()!r}",
            index=row,
            hint="a vector is numbers separated by spaces",
        ) from exc
    return values, lengths


class Handler(StringFeatureHandler):
    """Vector feature handler."""

    type_name: ClassVar[str] = "vector"
    Params: ClassVar[builtins.type[VectorParams]] = VectorParams
    fill_value: ClassVar[Any] = ""
    defaults_key: ClassVar[str] = "vector"

    def fit(self, column: pa.Array, params: VectorParams, ctx: FeatureContext) -> int:
        _, lengths = _split(column, ctx)
        return int(lengths.max()) if len(lengths) else 0

    def merge(self, a: int, b: int) -> int:
        return max(a, b)

    def finalize(self, stats: int, params: VectorParams, ctx: FeatureContext) -> dict[str, Any]:
        if params.vector_size is not None and stats and stats != params.vector_size:
            raise ctx.error(
                f"vector_size is {params.vector_size} but rows have {stats} values",
                hint="fix vector_size or the data",
            )
        return {"vector_size": params.vector_size or max(stats, 1)}

    def transform(
        self, column: pa.Array, meta: dict[str, Any], params: VectorParams, ctx: FeatureContext
    ) -> dict[str, NDArray[Any] | CSR]:
        size = int(meta["vector_size"])
        values, lengths = _split(column, ctx)
        bad = np.flatnonzero((lengths != size) & (lengths != 0))
        if len(bad):
            raise ctx.error(
                f"expected {size} values (vector_size), got {int(lengths[bad[0]])}",
                index=int(bad[0]),
                hint="every row of a vector feature has the same number of values",
            )
        out = np.zeros((len(column), size), np.float32)
        full = lengths == size
        out[full] = np.asarray(values.to_numpy(zero_copy_only=False), np.float64).reshape(-1, size)
        return {ctx.name: out}
