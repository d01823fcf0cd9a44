"""binary → bool vector; which strings mean true/false is configurable.

Ludwig's rules: values are compared case-insensitively after stripping against ``true_strings`` /
``false_strings`` first; a value in neither list is true only when it equals
``fallback_true_label``. Without ``fallback_true_label``, a column of two distinct values, neither
conventional (``human``/``bot``), gets one automatically as Ludwig does: the first sorted value is
true, the other false (with a warning naming them and the option to set). Any other unconventional
value is an error naming the file, line and column.
``fill_with_false``/``fill_with_true`` store the column's own label (``"N"`` for a Y/N column,
Ludwig's ``computed_fill_value``). Statistics: distinct value counts (mergeable).

As Ludwig 0.17 (``precompute_fill_value`` and ``BinaryFeatureMixin.get_feature_meta``): a column
holding more than two distinct raw values is refused ("expects 2 distinct values") when its
missing values are filled with ``fill_with_false``/``fill_with_true`` (the default) or its values
are not all numbers and not all ``true``/``false`` (what pandas reads as an object column); and
its metadata's ``fallback_true_label`` is the configured label or else the first sorted value, as
Ludwig stores it (for a Y/N column ``"N"``, unused since both are conventional). The rows are
still read with the rules above.
"""

from __future__ import annotations

import builtins
import warnings
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.errors import ConfigError
from datamill.preprocessing.features.base import (
    COMMON_STRATEGIES,
    CSR,
    FeatureContext,
    FeatureHandler,
)
from datamill.preprocessing.features.base import Params as BaseParams
from datamill.preprocessing.missing import NEIGHBOURS, MissingStats
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
    strategies: ClassVar[tuple[str, ...]] = (
        *COMMON_STRATEGIES,
        "fill_with_false",
        "fill_with_true",
    )
    defaults_key: ClassVar[str] = "binary"

    def finalize_missing(
        self, stats: MissingStats, strategy: str, fill_value: Any, params: BinaryParams
    ) -> Any:
        """``fill_with_false``/``fill_with_true``: the column's own label of that truth (Ludwig's
        choice).

        Ludwig scans the distinct fit values in reverse sorted order and takes the first that reads
        as the wanted truth; with none, the first of ``false_strings``/``true_strings``. Other
        strategies as every type.
        """
        if strategy not in ("fill_with_false", "fill_with_true"):
            return super().finalize_missing(stats, strategy, fill_value, params)
        wanted = strategy == "fill_with_true"
        values = (
            [] if stats.values is None else [v for v in stats.values.to_pylist() if v is not None]
        )
        if len(values) > 2:  # Ludwig's precompute_fill_value refuses the column
            raise ConfigError(
                f"missing_value_strategy {strategy} expects 2 distinct values, found "
                f"{len(values)}: {sorted(values)[:10]}",
                hint="declare the feature as category, or map the values to two labels first "
                "(Ludwig 0.17 refuses this column too)",
            )
        fallback = (
            params.fallback_true_label
            if params.fallback_true_label is not None
            else self._auto_label(values, params)
        )
        for v in sorted(values, reverse=True):
            if self._read(v, params, fallback) is wanted:
                return v
        if wanted:
            return params.fallback_true_label or params.true_strings[0]
        return params.false_strings[0]

    @staticmethod
    def _read(value: str, params: BinaryParams, fallback: str | None) -> bool | None:
        """One value's truth under Ludwig's ``str2bool`` (``None``: unknown and no fallback
        label)."""
        norm = value.strip().lower()
        if norm in {s.lower() for s in params.true_strings}:
            return True
        if norm in {s.lower() for s in params.false_strings}:
            return False
        return None if fallback is None else value.strip() == fallback

    @classmethod
    def _auto_label(cls, values: list[str], params: BinaryParams) -> str | None:
        """Ludwig's automatic ``fallback_true_label`` for a column of at most two values, none
        conventional.

        (Ludwig also picks one when only one of two values is unconventional, which can read both as
        false, e.g. ``N``/``maybe``; datamill refuses that column with a located error instead.)
        """
        if (
            not values
            or len(values) > 2
            or any(cls._read(v, params, None) is not None for v in values)
        ):
            return None
        return min(values)

    @staticmethod
    def _pandas_object(values: list[str]) -> bool:
        """Ludwig's test: the values are neither all numbers nor all ``true``/``false``."""
        if all(v.strip().lower() in ("true", "false") for v in values):
            return False
        try:
            for v in values:
                float(v)
        except ValueError:
            return True
        return False

    @classmethod
    def _ludwig_label(
        cls, values: list[str], params: BinaryParams, ctx: FeatureContext
    ) -> str | None:
        """The ``fallback_true_label`` Ludwig stores; refuses an object column of > 2 values."""
        if not values or not cls._pandas_object(values):
            return params.fallback_true_label
        edge = cls.edge_fill(
            params
        )  # bfill/ffill's fill at the dataset's ends (Ludwig: a neighbour)
        seen = (
            [v for v in values if v != edge]
            if params.missing_value_strategy in NEIGHBOURS
            else values
        )
        if len(seen) > 2:
            raise ctx.error(
                f"a binary feature expects 2 distinct values, found {sorted(values)[:10]} "
                f"({len(values)} values)",
                hint="declare the feature as category, or map the values to two labels first "
                "(Ludwig 0.17 refuses this column too)",
            )
        return params.fallback_true_label or min(values)

    def fit(self, column: pa.Array, params: BinaryParams, ctx: FeatureContext) -> TokenCounts:
        return count_tokens(column)

    def merge(self, a: TokenCounts, b: TokenCounts) -> TokenCounts:
        return a.merge(b)

    def finalize(
        self, stats: TokenCounts, params: BinaryParams, ctx: FeatureContext
    ) -> dict[str, Any]:
        counts = stats.as_dict()
        stored = self._ludwig_label(list(counts), params, ctx)
        fallback = params.fallback_true_label
        if fallback is None:
            fallback = self._auto_label(list(counts), params)
        str2bool = {v: self._read(v, params, fallback) for v in counts}
        if fallback is not None and params.fallback_true_label is None:
            warnings.warn(
                f'{ctx.path or "<table>"}, column "{ctx.column}": binary values '
                f"{sorted(counts)} are not all "
                f"conventional true/false strings; read as {dict(sorted(str2bool.items()))} "
                "(Ludwig's "
                f"automatic fallback_true_label {fallback!r}); set "
                "preprocessing.fallback_true_label "
                "to choose",
                UserWarning,
                stacklevel=2,
            )
        labels: dict[bool, str | None] = {
            True: None,
            False: None,
        }  # most frequent raw string (ties: smallest)
        for value, n in counts.items():
            t = str2bool[value]
            if t is None:
                continue
            best = labels[t]
            if best is None or (-n, value) < (-counts[best], best):
                labels[t] = value
        return {
            "str2freq": counts,
            "str2bool": {v: t for v, t in str2bool.items() if t is not None},
            "bool2str": [labels[False] or "false", labels[True] or "true"],
            "fallback_true_label": stored,
            "preprocessing": {"fallback_true_label": stored},
            "vocab_size": 2,
        }

    @classmethod
    def edge_fill(cls, params: Any = None) -> Any:
        """Edge nulls left by ``bfill``/``ffill`` become false (the first of ``false_strings``)."""
        return params.false_strings[0] if isinstance(params, BinaryParams) else "false"

    @staticmethod
    def _truth(
        column: pa.Array, params: BinaryParams, ctx: FeatureContext, *, fallback: str | None
    ) -> pa.Array:
        trimmed = pc.utf8_trim_whitespace(column)
        norm = pc.utf8_lower(trimmed)
        is_true = pc.is_in(
            norm, value_set=pa.array([s.lower() for s in params.true_strings], pa.string())
        )
        is_false = pc.is_in(
            norm, value_set=pa.array([s.lower() for s in params.false_strings], pa.string())
        )
        known = pc.or_(is_true, is_false)
        if fallback is not None:
            return pc.if_else(known, is_true, pc.equal(trimmed, fallback))
        if len(known) and not pc.all(known).as_py():  # (all() of nothing is null)
            bad = int(np.flatnonzero(~known.to_numpy(zero_copy_only=False))[0])
            raise ctx.error(
                f"expected a binary value ({'/'.join(params.true_strings[:4])} or "
                f"{'/'.join(params.false_strings[:4])}), got {column[bad].as_py()!r}",
                index=bad,
                hint="set preprocessing.true_strings/false_strings or fallback_true_label",
            )
        return is_true

    def transform(
        self, column: pa.Array, meta: dict[str, Any], params: BinaryParams, ctx: FeatureContext
    ) -> dict[str, NDArray[Any] | CSR]:
        fallback = params.fallback_true_label
        if fallback is None and "str2freq" in meta:  # the label the fit values were read with
            fallback = self._auto_label(list(meta["str2freq"]), params)
        elif fallback is None:  # metadata written before str2freq was stored
            fallback = meta.get("fallback_true_label")
        truth = self._truth(column, params, ctx, fallback=fallback)
        return {ctx.name: truth.to_numpy(zero_copy_only=False).astype(np.bool_)}
