"""category → ids: 0 = ``<UNK>``, then by descending frequency (ties: token ascending).

The ids' dtype is the smallest signed integer holding the vocabulary (Ludwig's ``int_type``:
int8 up to 128 values, then int16, int32).

Statistics are :class:`~datamill.vocab.TokenCounts` (mergeable); the vocabulary keeps the
``most_common`` most frequent values; anything else (and unseen values) maps to ``<UNK>``.
"""

from __future__ import annotations

import builtins
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray
from pydantic import Field

from datamill.core.constants import UNK
from datamill.preprocess.features.base import CSR, FeatureContext, FeatureHandler, int_type
from datamill.preprocess.features.base import Params as BaseParams
from datamill.vocab import TokenCounts, Vocab, count_tokens

__all__ = ["CategoryParams", "Handler"]


class CategoryParams(BaseParams):
    """``preprocessing:`` of a category feature."""

    most_common: int = Field(default=10000, ge=1)
    lowercase: bool = False
    min_frequency: int = Field(default=1, ge=1)


class Handler(FeatureHandler):
    """Category feature handler."""

    type: ClassVar[str] = "category"
    Params: ClassVar[builtins.type[CategoryParams]] = CategoryParams

    def __init__(self) -> None:
        self._vocab_cache: tuple[int, Vocab] | None = None

    @staticmethod
    def _prep(column: pa.Array, params: CategoryParams) -> pa.Array:
        return pc.utf8_lower(column) if params.lowercase else column

    def fit(self, column: pa.Array, params: CategoryParams, ctx: FeatureContext) -> TokenCounts:
        return count_tokens(self._prep(column, params))

    def merge(self, a: TokenCounts, b: TokenCounts) -> TokenCounts:
        return a.merge(b)

    def finalize(self, stats: TokenCounts, params: CategoryParams, ctx: FeatureContext) -> dict[str, Any]:
        vocab = Vocab.from_counts(stats, min_freq=params.min_frequency, max_size=params.most_common,
                                  specials=[UNK], unk_token=UNK)
        return vocab.to_dict()

    def _vocab(self, meta: dict[str, Any]) -> Vocab:
        if self._vocab_cache is None or self._vocab_cache[0] != id(meta):
            self._vocab_cache = (id(meta), Vocab.from_dict(meta))
        return self._vocab_cache[1]

    def transform(self, column: pa.Array, meta: dict[str, Any], params: CategoryParams,
                  ctx: FeatureContext) -> dict[str, NDArray[Any] | CSR]:
        ids: NDArray[np.int32] = self._vocab(meta).encode(self._prep(column, params))
        return {ctx.name: ids.astype(int_type(int(meta["vocab_size"])), copy=False)}
