"""binary → bool vector; which strings mean true/false is configurable.

Values are compared case-insensitively after stripping. A value that is in neither list is an
error naming the file, line and column, unless ``fallback_true_label`` is set (Ludwig's option:
that label is true, every other value false). Statistics: distinct value counts (mergeable).
"""

from __future__ import annotations

import builtins
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.errors import DataFileError
from datamill.preprocessing.features.base import (
    COMMON_STRATEGIES,
    CSR,
    FeatureContext,
    FeatureHandler,
)
from datamill.preprocessing.features.base import Params as BaseParams
from datamill.preprocessing.missing import MissingStats
from datamill.vocab import TokenCounts, count_tokens

__all__ = ["BinaryParams", "Handler"]

TRUE_STRINGS = ("1", "1.0", "t", "true", "y", "yes", "on", "positive", "pos", "+")
FALSE_STRINGS = ("0", "0.0", "f", "false", "n", "no", "off", "negative", "neg", "-", "-1", "-1.0")


class BinaryParams(BaseParams):
    """``preprocessing:`` of a binary feature."""

    true_strings: tuple[str, ...] = TRUE_STRINGS
    false_strings: tuple[str, ...] = FALSE_STRINGS
    fallback_true_label: str | None = None


class Handler(FeatureHandler):
    """Binary feature handler."""

    type_name: ClassVar[str] = "binary"
    Params: ClassVar[builtins.type[BinaryParams]] = BinaryParams
    input_type: ClassVar[str] = "string"
    missing_value_strategy: ClassVar[str] = "fill_with_false"
    fill_value: ClassVar[Any] = None
    strategies: ClassVar[tuple[str, ...]] = (*COMMON_STRATEGIES, "fill_with_false", "fill_with_true")
    defaults_key: ClassVar[str] = "binary"

    def finalize_missing(self, stats: MissingStats, strategy: str, fill_value: Any, params: BinaryParams) -> Any:
        """``fill_with_false`` fills with the first of ``false_strings``; other strategies as every type."""
        if strategy == "fill_with_false":
            return params.false_strings[0]
        if strategy == "fill_with_true":
            return params.fallback_true_label or params.true_strings[0]
        return super().finalize_missing(stats, strategy, fill_value, params)

    def fit(self, column: pa.Array, params: BinaryParams, ctx: FeatureContext) -> TokenCounts:
        return count_tokens(column)

    def merge(self, a: TokenCounts, b: TokenCounts) -> TokenCounts:
        return a.merge(b)

    def finalize(self, stats: TokenCounts, params: BinaryParams, ctx: FeatureContext) -> dict[str, Any]:
        counts = stats.as_dict()
        truth = self._truth(pa.array(list(counts), pa.string()), params, ctx, check=False)
        labels: dict[bool, str | None] = {True: None, False: None}  # most frequent raw string (ties: smallest)
        for (value, n), t in zip(counts.items(), truth.to_pylist()):
            if t is None:
                continue
            best = labels[t]
            if best is None or (-n, value) < (-counts[best], best):
                labels[t] = value
        return {"str2freq": counts, "bool2str": [labels[False] or "false", labels[True] or "true"],
                "vocab_size": 2}

    @classmethod
    def edge_fill(cls, params: Any = None) -> Any:
        """Edge nulls left by ``bfill``/``ffill`` become false (the first of ``false_strings``)."""
        return params.false_strings[0] if isinstance(params, BinaryParams) else "false"

    @staticmethod
    def _truth(column: pa.Array, params: BinaryParams, ctx: FeatureContext, *, check: bool) -> pa.Array:
        norm = pc.utf8_lower(pc.utf8_trim_whitespace(column))
        if params.fallback_true_label is not None:
            return pc.equal(column, params.fallback_true_label)
        is_true = pc.is_in(norm, value_set=pa.array([s.lower() for s in params.true_strings], pa.string()))
        is_false = pc.is_in(norm, value_set=pa.array([s.lower() for s in params.false_strings], pa.string()))
        known = pc.or_(is_true, is_false)
        if check and len(known) and not pc.all(known).as_py():  # (all() of nothing is null)
            bad = int(np.flatnonzero(~known.to_numpy(zero_copy_only=False))[0])
            raise DataFileError(
                f"expected a binary value ({'/'.join(params.true_strings[:4])} or "
                f"{'/'.join(params.false_strings[:4])}), got {column[bad].as_py()!r}",
                path=ctx.path, column=ctx.column, **ctx.location(bad),
                hint="set preprocessing.true_strings/false_strings or fallback_true_label")
        return pc.if_else(known, is_true, pa.scalar(None, pa.bool_()))

    def transform(self, column: pa.Array, meta: dict[str, Any], params: BinaryParams,
                  ctx: FeatureContext) -> dict[str, NDArray[Any] | CSR]:
        truth = self._truth(column, params, ctx, check=True)
        return {ctx.name: truth.to_numpy(zero_copy_only=False).astype(np.bool_)}
