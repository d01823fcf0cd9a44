"""The fit step of the preprocessing pipeline (:mod:`datamill.preprocessing.pipeline`): two passes
over the prepared blocks through an :class:`~datamill.preprocessing.executors.Executor`, the
missing-value statistics (mean, mode, the ``bfill``/``ffill`` edge values), then with the blocks
filled, every feature handler's mergeable ``fit``; results are merged in block order into
:class:`~datamill.preprocessing.plans.Stats`. Every per-block function is a picklable pure function
of (plan, block, explicit carried state).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial, reduce
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.errors import ConfigError
from datamill.preprocessing.config import (
    ResolvedFeature,
)
from datamill.preprocessing.executors import Executor
from datamill.preprocessing.features import FeatureHandler, handler_class
from datamill.preprocessing.missing import (
    FITTED,
    NEIGHBOURS,
    Carry,
    MissingStats,
    apply_fill,
    carries,
    fit_missing,
)
from datamill.preprocessing.plans import Block, Plan, Stats
from datamill.preprocessing.split import (
    SPLIT_NAMES,
)

__all__ = ["fit"]


def _missing_features(p: Plan) -> list[ResolvedFeature]:
    """The features whose fill needs statistics of the blocks (fitted fills; bfill/ffill
    carries)."""
    fitted = FITTED if p.applied is None else ()
    return [f for f in p.features if f.missing_value_strategy in (*fitted, *NEIGHBOURS)]


def _missing_block(p: Plan, block: Block) -> dict[str, MissingStats]:
    return {
        f.name: fit_missing(block.columns[f.name], f.missing_value_strategy, block.fit_mask)
        for f in _missing_features(p)
    }


def _filled(
    f: ResolvedFeature, h: FeatureHandler, block: Block, fill: Any, carry: Carry | None
) -> pa.Array:
    return apply_fill(
        block.columns[f.name],
        f.missing_value_strategy,
        fill,
        carry=carry,
        edge_fill=h.edge_fill(f.params),
    )


def _fit_block(
    p: Plan, fills: dict[str, Any], item: tuple[Block, dict[str, Carry]], *, keep_tokens: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One block's handler statistics (on its fit rows) and, when ``keep_tokens``, its tokens (all
    rows)."""
    block, carry = item
    mask = block.fit_mask
    subset = mask is not None and not mask.all()
    rows = None
    if mask is not None and subset:
        rows = (block.rows if block.rows is not None else block.lo + np.arange(block.num_rows))[
            mask
        ]
    stats: dict[str, Any] = {}
    tokens: dict[str, Any] = {}
    for f in p.features:
        h = handler_class(f.type)()
        col = _filled(f, h, block, fills[f.name], carry.get(f.name))
        ctx = block.context(f)
        t = h.tokens(col, f.params, ctx)
        fit_ctx = replace(ctx, rows=rows) if subset else ctx
        stats[f.name] = h.fit(
            h.take_rows(t, mask) if mask is not None and subset else t, f.params, fit_ctx
        )
        if keep_tokens and t is not col:
            tokens[f.name] = h.compact_tokens(t)
    return stats, tokens


def _fill_value(p: Plan, f: ResolvedFeature, h: FeatureHandler, merged: MissingStats) -> Any:
    """The fill of ``f``'s missing values: the applied metadata's, else fitted (``merged``).

    Raises:
        ConfigError: the strategy cannot fill (the feature named).
    """
    if p.applied is not None:
        return p.applied[f.name].get("preprocessing", {}).get("computed_fill_value")
    try:
        return h.finalize_missing(merged, f.missing_value_strategy, f.fill_value, f.params)
    except ConfigError as exc:
        if exc.column is not None:
            raise
        raise ConfigError(
            f"{f.where}: {exc.msg}",
            path=p.config_source,
            column=f.name,
            hint=exc.hint or f"set {f.where}.preprocessing.fill_value",
        ) from exc


def _split_counts(blocks: list[Block]) -> NDArray[np.int64]:
    """Rows of each split in the blocks."""
    counts = np.zeros(len(SPLIT_NAMES), np.int64)
    for b in blocks:
        counts += np.bincount(b.split, minlength=len(SPLIT_NAMES))[: len(SPLIT_NAMES)]  # type: ignore[arg-type]
    return counts


def fit(p: Plan, blocks: list[Block], *, executor: Executor, keep_tokens: bool = True) -> Stats:
    """Fit every feature on the blocks' fit rows (nothing but the missing-value pass when metadata
    is applied).

    ``keep_tokens``: keep each block's tokens for its :func:`transform` (the local executor does;
    an executor whose blocks live elsewhere passes ``False`` and ``transform`` tokenises again).

    Examples:
        >>> from datamill.preprocessing.executors import LocalExecutor
        >>> from datamill.preprocessing.pipeline import Origin, plan, prepare
        >>> p = plan({"input_features": [{"name": "x", "type": "number",
        ...           "preprocessing": {"missing_value_strategy": "fill_with_mean"}}],
        ...           "preprocessing": {"split": {"type": "none"}}}, pa.table({}))
        >>> blocks = [prepare(p, Origin(None, None, None), (i, lo, pa.table({"x": v})))
        ...           for i, (lo, v) in enumerate([(0, [1.0, None]), (2, [5.0])])]
        >>> st = fit(p, blocks, executor=LocalExecutor(threads=1))
        >>> st.num_rows, st.fills, st.features["x"].count
        (3, {'x': 3.0}, 3)
    """
    per_block = (
        list(executor.map_ordered(partial(_missing_block, p), blocks))
        if _missing_features(p)
        else [{} for _ in blocks]
    )  # (no pass over the blocks when no fill needs one: a task per block on Ray)
    fills: dict[str, Any] = {}
    block_carries: list[dict[str, Carry]] = [{} for _ in blocks]
    for f in p.features:
        h = handler_class(f.type)()
        parts = [b.get(f.name, MissingStats()) for b in per_block]
        fills[f.name] = _fill_value(p, f, h, reduce(MissingStats.merge, parts))
        if f.missing_value_strategy in ("bfill", "ffill"):
            for i, c in enumerate(carries(parts)):
                block_carries[i][f.name] = c
    counts = _split_counts(blocks) if p.split is not None else None
    stats = Stats(
        sum(b.num_rows for b in blocks),
        blocks[0].origin,
        fills,
        block_carries,
        {},
        None if counts is None else counts.tolist(),
    )
    if p.applied is not None:
        return stats
    fitted = executor.map_ordered(
        partial(_fit_block, p, fills, keep_tokens=keep_tokens), list(zip(blocks, block_carries))
    )
    for block_stats, tokens in fitted:  # mergeable statistics, merged in block order
        stats.tokens.append(tokens)
        for f in p.features:
            s = block_stats[f.name]
            stats.features[f.name] = (
                s
                if f.name not in stats.features
                else handler_class(f.type)().merge(stats.features[f.name], s)
            )
    return stats
