"""number → float32 vector with optional normalization; statistics saved in the metadata.

Normalizations (Ludwig's): ``zscore`` is the default of input features and no normalization the
default of output features, as Ludwig's ``NumberPreprocessingConfig`` and
``NumberOutputPreprocessingConfig`` have it; ``none`` (or ``null``); ``zscore`` ``(x - mean) /
std``; ``minmax`` ``(x - min) / (max - min)``; ``iq`` ``(x - median) / (q3 - q1)``; ``log1p``
``log(1 + x)`` (values must be > -1). A zero spread (std or max - min) is replaced by 1; ``iq`` on a
column whose interquartile range is 0 is refused, as Ludwig refuses it.

Outliers (Ludwig's ``outlier_strategy``/``outlier_threshold``): a value farther than ``threshold``
standard deviations from the mean of the fit rows is replaced, before normalization, by that mean
(``fill_with_mean``) or ``fill_value`` (``fill_with_const``); the mean and std are those of the
column after its missing values were filled (Ludwig's mean for ``fill_with_mean`` skips missing
values: the two agree when the column has none or its missing strategy is ``fill_with_mean`` too).
The other Ludwig outlier strategies (mode, bfill/ffill, drop_row) are not offered.

Statistics are mergeable: count, mean and M2 combine exactly (Chan et al.'s parallel variance),
min/max trivially. ``iq`` needs quantiles: fit keeps the block's values (only when
``normalization: iq``) and merge concatenates them, so the quantiles are **exact** at the cost of
holding that column's fit values in memory (8 bytes a row).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray
from pydantic import Field

from datamill.preprocessing.features.base import (
    COMMON_STRATEGIES,
    CSR,
    FeatureContext,
    FeatureHandler,
)
from datamill.preprocessing.features.base import Params as BaseParams

__all__ = ["Handler", "NumberParams", "NumberStats"]


class NumberParams(BaseParams):
    """``preprocessing:`` of a number feature."""

    normalization: Literal["none", "zscore", "minmax", "iq", "log1p"] | None = None
    #: Ludwig's outlier replacement: a value more than ``outlier_threshold`` (sample) standard
    # deviations : from the mean is replaced by the mean (``fill_with_mean``) or ``fill_value``
    # (``fill_with_const``)
    outlier_strategy: Literal["fill_with_const", "fill_with_mean"] | None = None
    outlier_threshold: float = Field(default=3.0, gt=0)


@dataclass(frozen=True)
class NumberStats:
    """Mergeable statistics of a number column."""

    count: int
    mean: float
    m2: float
    min: float
    max: float
    values: NDArray[np.float64] | None = None

    def merge(self, other: NumberStats) -> NumberStats:
        """Chan et al.'s pairwise combination (exact)."""
        n = self.count + other.count
        if n == 0:
            return self
        delta = other.mean - self.mean
        mean = self.mean + delta * other.count / n
        m2 = self.m2 + other.m2 + delta * delta * self.count * other.count / n
        values = None
        if self.values is not None and other.values is not None:
            values = np.concatenate([self.values, other.values])
        return NumberStats(n, mean, m2, min(self.min, other.min), max(self.max, other.max), values)


def _as_float(column: pa.Array) -> NDArray[np.float64]:
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)


class Handler(FeatureHandler):
    """Number feature handler."""

    type_name: ClassVar[str] = "number"
    Params: ClassVar[builtins.type[NumberParams]] = NumberParams
    input_type: ClassVar[str] = "float64"
    missing_value_strategy: ClassVar[str] = "fill_with_const"
    fill_value: ClassVar[Any] = 0.0
    strategies: ClassVar[tuple[str, ...]] = (*COMMON_STRATEGIES, "fill_with_mean")
    defaults_key: ClassVar[str] = "number"

    @classmethod
    def role_defaults(cls, role: str) -> dict[str, Any]:
        """Ludwig's schema: number inputs default to ``zscore``, outputs to no normalization."""
        return {"normalization": "zscore"} if role == "input" else {}

    def fit(self, column: pa.Array, params: NumberParams, ctx: FeatureContext) -> NumberStats:
        x = _as_float(column)
        x = x[np.isfinite(x)]
        if len(x) == 0:
            return NumberStats(
                0,
                0.0,
                0.0,
                float("inf"),
                float("-inf"),
                np.zeros(0) if params.normalization == "iq" else None,
            )
        mean = float(x.mean())
        return NumberStats(
            len(x),
            mean,
            float(((x - mean) ** 2).sum()),
            float(x.min()),
            float(x.max()),
            x.copy() if params.normalization == "iq" else None,
        )

    def merge(self, a: NumberStats, b: NumberStats) -> NumberStats:
        return a.merge(b)

    def finalize(
        self, stats: NumberStats, params: NumberParams, ctx: FeatureContext
    ) -> dict[str, Any]:
        n = stats.count
        meta: dict[str, Any] = {
            "count": n,
            "mean": stats.mean if n else 0.0,
            "std": float(np.sqrt(stats.m2 / (n - 1)))
            if n > 1
            else 0.0,  # sample std, as pandas/Ludwig
            "min": stats.min if n else 0.0,
            "max": stats.max if n else 0.0,
            "normalization": params.normalization or "none",
        }
        if params.outlier_strategy is not None:
            meta["computed_outlier_fill_value"] = (
                meta["mean"]
                if params.outlier_strategy == "fill_with_mean"
                else float(params.fill_value if params.fill_value is not None else self.fill_value)
            )
        if stats.values is not None:
            q1, median, q3 = (
                np.quantile(stats.values, [0.25, 0.5, 0.75]).tolist() if n else [0.0] * 3
            )
            if n and q3 == q1:
                raise ctx.error(
                    "cannot apply iq normalization: the interquartile range is 0 "
                    f"(q1 = q3 = {q1:g}), so every value would be divided by zero",
                    hint="use normalization zscore or minmax for this column "
                    "(Ludwig 0.17 refuses it too)",
                )
            meta.update(q1=q1, median=median, q3=q3)
        return meta

    def transform(
        self, column: pa.Array, meta: dict[str, Any], params: NumberParams, ctx: FeatureContext
    ) -> dict[str, NDArray[Any] | CSR]:
        x = _as_float(column)
        if meta.get("computed_outlier_fill_value") is not None:
            outlier = np.abs(x - meta["mean"]) > params.outlier_threshold * (meta["std"] or np.inf)
            x = np.where(outlier, meta["computed_outlier_fill_value"], x)
        norm = meta.get("normalization", "none")
        if norm == "zscore":
            x = (x - meta["mean"]) / (meta["std"] or 1.0)
        elif norm == "minmax":
            x = (x - meta["min"]) / ((meta["max"] - meta["min"]) or 1.0)
        elif norm == "iq":
            x = (x - meta["median"]) / ((meta["q3"] - meta["q1"]) or 1.0)
        elif norm == "log1p":
            bad = np.flatnonzero(x <= -1)
            if len(bad):
                raise ctx.error(
                    f"log1p normalization needs values > -1, got {x[bad[0]]!r}",
                    index=int(bad[0]),
                    hint="use another normalization or shift the column",
                )
            x = np.log1p(x)
        return {ctx.name: x.astype(np.float32)}
