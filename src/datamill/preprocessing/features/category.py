"""category → ids: 0 = ``<UNK>``, then by descending frequency (ties: token ascending).

The ids' dtype is the smallest signed integer holding the vocabulary (Ludwig's ``int_type``:
int8 up to 128 values, then int16, int32).

Values are whitespace-stripped first, as Ludwig does. Statistics are
:class:`~datamill.vocab.TokenCounts` (mergeable); the vocabulary keeps the
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
from datamill.preprocessing.features._ragged import lower_except
from datamill.preprocessing.features.base import (
    CSR,
    FeatureContext,
    StringFeatureHandler,
    int_type,
)
from datamill.preprocessing.features.base import Params as BaseParams
from datamill.vocab import TokenCounts, Vocab, count_tokens

__all__ = ["CategoryParams", "Handler"]


class CategoryParams(BaseParams):
    """``preprocessing:`` of a category feature."""

    most_common: int = Field(default=10000, ge=1)
    lowercase: bool = False
    min_frequency: int = Field(default=1, ge=1)


class Handler(StringFeatureHandler):
    """Category feature handler."""

    type_name: ClassVar[str] = "category"
    Params: ClassVar[builtins.type[CategoryParams]] = CategoryParams
    fill_value: ClassVar[Any] = UNK
    defaults_key: ClassVar[str] = "category"

    @staticmethod
    def _prep(column: pa.Array, params: CategoryParams) -> pa.Array:
        column = pc.utf8_trim_whitespace(column)  # as Ludwig: " NAmes " is NAmes
        # the missing-value fill <UNK> is not lower-cased: a missing value stays the unknown id 0
        return lower_except(column, (UNK,)) if params.lowercase else column

    def fit(self, column: pa.Array, params: CategoryParams, ctx: FeatureContext) -> TokenCounts:
        return count_tokens(self._prep(column, params))

    def merge(self, a: TokenCounts, b: TokenCounts) -> TokenCounts:
        return a.merge(b)

    def finalize(
        self, stats: TokenCounts, params: CategoryParams, ctx: FeatureContext
    ) -> dict[str, Any]:
        vocab = Vocab.from_counts(
            stats,
            min_freq=params.min_frequency,
            max_size=params.most_common,
            specials=[UNK],
            unk_token=UNK,
        )
        return vocab.to_dict()

    def transform(
        self, column: pa.Array, meta: dict[str, Any], params: CategoryParams, ctx: FeatureContext
    ) -> dict[str, NDArray[Any] | CSR]:
        ids: NDArray[np.int32] = Vocab.from_dict(meta).encode(self._prep(column, params))
        return {ctx.name: ids.astype(int_type(int(meta["vocab_size"])), copy=False)}
