"""timeseries → ``n × l`` float32 padded matrix, no vocabulary (Ludwig's timeseries feature).

A value is a string of numbers, e.g. ``"1.0 2.5 3"`` (``tokenizer: space``, default) or
``"1.0,2.5,3"`` (``tokenizer: comma``). ``l = min(longest row, timeseries_length_limit)`` (at
least 1) is fixed at fit time (metadata ``max_timeseries_length``); longer rows keep their first
``l`` values; ``padding`` right (default) or left with ``padding_value`` (default 0). A token that
is not a number is a :class:`~datamill.core.errors.DataFileError` naming the file, line/row and
column.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray
from pydantic import Field

from datamill.core.ragged import pad
from datamill.preprocessing.features._ragged import Ragged, row_selection, split_tokens
from datamill.preprocessing.features.base import (
    CSR,
    FeatureContext,
    StringFeatureHandler,
)
from datamill.preprocessing.features.base import Params as BaseParams

__all__ = ["Handler", "TimeseriesParams", "TimeseriesStats"]

_NUMBER = r"^[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|[iI]nf(inity)?|[nN]a[nN])$"


class TimeseriesParams(BaseParams):
    """``preprocessing:`` of a timeseries feature."""

    tokenizer: Literal["space", "comma"] = "space"
    timeseries_length_limit: int = Field(default=256, ge=1)
    padding: Literal["right", "left"] = "right"
    padding_value: float = 0.0


@dataclass(frozen=True)
class TimeseriesStats:
    """Mergeable statistics: the longest row."""

    max_length: int

    def merge(self, other: TimeseriesStats) -> TimeseriesStats:
        """The longer of the two."""
        return TimeseriesStats(max(self.max_length, other.max_length))


def parse_numbers(
    column: pa.Array, params: TimeseriesParams, ctx: FeatureContext
) -> tuple[NDArray[np.float32], Ragged]:
    """Flat float32 values and their row offsets; DataFileError at the first bad token."""
    rag = split_tokens(column, params.tokenizer, strip=True)
    tokens = rag.values
    assert tokens is not None  # space/comma tokens are strings
    try:
        values = pc.cast(tokens, pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        ok = pc.match_substring_regex(tokens, _NUMBER).to_numpy(zero_copy_only=False)
        bad = int(np.flatnonzero(~ok)[0]) if not ok.all() else 0
        row = int(np.searchsorted(rag.offsets, bad, side="right") - 1)
        raise ctx.error(
            f"expected a {params.tokenizer}-separated list of numbers, got {tokens[bad].as_py()!r}",
            index=row,
            hint="fix the value, or set preprocessing.tokenizer (space/comma) to match the "
            "separator",
        ) from exc
    return values.astype(np.float32), rag


class Handler(StringFeatureHandler):
    """Timeseries feature handler.

    Examples:
        >>> import pyarrow as pa
        >>> from datamill.preprocessing.features import FeatureContext
        >>> h, ctx = Handler(), FeatureContext("ts", "ts", None, None)
        >>> p = h.Params(tokenizer="comma")
        >>> meta = h.finalize(h.fit(pa.array(["1, 2.5", "3"]), p, ctx), p, ctx)
        >>> h.transform(pa.array(["1, 2.5", "3"]), meta, p, ctx)["ts"].tolist()
        [[1.0, 2.5], [3.0, 0.0]]
    """

    type_name: ClassVar[str] = "timeseries"
    Params: ClassVar[builtins.type[TimeseriesParams]] = TimeseriesParams
    fill_value: ClassVar[Any] = ""
    defaults_key: ClassVar[str] = "timeseries"

    def tokens(
        self, column: pa.Array, params: TimeseriesParams, ctx: FeatureContext
    ) -> tuple[NDArray[np.float32], Ragged]:
        return parse_numbers(column, params, ctx)

    def take_rows(
        self, tokens: tuple[NDArray[np.float32], Ragged], mask: NDArray[np.bool_]
    ) -> tuple[NDArray[np.float32], Ragged]:
        values, rag = tokens
        keep, offsets = row_selection(rag.offsets, mask)
        return values[keep], Ragged(None, offsets)

    def _tokens(
        self,
        column: pa.Array | tuple[NDArray[np.float32], Ragged],
        params: TimeseriesParams,
        ctx: FeatureContext,
    ) -> tuple[NDArray[np.float32], Ragged]:
        return column if isinstance(column, tuple) else self.tokens(column, params, ctx)

    def fit(
        self,
        column: pa.Array | tuple[NDArray[np.float32], Ragged],
        params: TimeseriesParams,
        ctx: FeatureContext,
    ) -> TimeseriesStats:
        _, rag = self._tokens(column, params, ctx)
        return TimeseriesStats(int(rag.lengths.max()) if len(rag) else 0)

    def merge(self, a: TimeseriesStats, b: TimeseriesStats) -> TimeseriesStats:
        return a.merge(b)

    def finalize(
        self, stats: TimeseriesStats, params: TimeseriesParams, ctx: FeatureContext
    ) -> dict[str, Any]:
        return {
            "max_timeseries_length": max(1, min(stats.max_length, params.timeseries_length_limit))
        }

    def transform(
        self,
        column: pa.Array | tuple[NDArray[np.float32], Ragged],
        meta: dict[str, Any],
        params: TimeseriesParams,
        ctx: FeatureContext,
    ) -> dict[str, NDArray[Any] | CSR]:
        values, rag = self._tokens(column, params, ctx)
        return {
            ctx.name: pad(
                values,
                rag.offsets,
                int(meta["max_timeseries_length"]),
                side=params.padding,
                fill=params.padding_value,
                dtype=np.float32,
            )[0]
        }
