"""Ranks balanced by cost: each global step's units dealt so every rank does about the same work.

A global step holds ``world_size * batch_size`` units (packed sequences or documents); every rank
gets exactly ``batch_size`` of them (DDP steps in lockstep). :func:`deal` assigns them so that the
per-rank cost is even:

1. **Greedy by rounds** (vectorised over the steps): units sorted by cost, largest first, are taken
   ``world_size`` at a time; each round's largest goes to the rank with the least cost so far.
2. **Swaps**: then, a few times, the most and least loaded ranks swap the pair of units whose cost
   difference comes closest to halving their gap.
3. **Swaps with the most loaded rank**: then, while a step's max/mean exceeds ``1 + TOLERANCE``
   and its lower bound (:func:`lower_bound`), its most loaded rank swaps a unit with a unit of any
   other rank, the swap that lowers the larger of the two new loads most (at most ``PASSES``
   times; a step stops when no swap lowers its maximum).

The cost of a unit is the sum over its segments (documents) of ``cost(length)``: ``"tokens"``
(``length``: activations, MLP FLOPs), ``"tokens_squared"`` (``length ** 2``: attention with
document masking, the cost torchtitan and verl balance) or a callable of an int64 array of lengths.
Ties are broken by a permutation drawn from the seed and the step, so the deal is a pure function
of ``(seed, step, costs, world_size)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from datamill.core.errors import ConfigError

__all__ = [
    "Balance",
    "cost_function",
    "deal",
    "imbalance",
    "lower_bound",
    "round_robin",
    "unit_costs",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
Balance = str | Callable[[I64], Any]
SWAPS = 8
"""Swap passes of the most and least loaded ranks after the greedy deal."""
PASSES = 64
"""At most this many swaps of each step's most loaded rank with any other."""
TOLERANCE = 0.002
"""A step whose max/mean cost is within this of 1 (or of its lower bound) is left as it is."""


def _tokens(n: I64) -> F64:
    return np.asarray(n, dtype=np.float64)


def _tokens_squared(n: I64) -> F64:
    return np.asarray(n, dtype=np.float64) ** 2


class _Custom:
    """A user's cost callable, checked (a class, not a closure, so a loader pickles)."""

    def __init__(self, fn: Callable[[I64], Any]) -> None:
        self.fn = fn

    def __call__(self, n: I64) -> F64:
        out = np.asarray(self.fn(n), dtype=np.float64)
        if out.shape != np.shape(n):
            raise ConfigError(
                f"the balance callable must return one cost per length, got shape "
                f"{out.shape} for {np.shape(n)}"
            )
        return out


def cost_function(balance: Balance, /) -> Callable[[I64], F64]:
    """The per-segment cost of a ``balance`` setting.

    Examples:
        >>> cost_function("tokens_squared")(np.array([2, 3])).tolist()
        [4.0, 9.0]
    """
    if balance == "tokens":
        return _tokens
    if balance == "tokens_squared":
        return _tokens_squared
    if callable(balance):
        return _Custom(balance)
    raise ConfigError(
        f"balance must be 'tokens', 'tokens_squared' or a callable of the lengths, got {balance!r}"
    )


def unit_costs(unit_ptr: I64, seg_len: I64, cost: Callable[[I64], F64], /) -> F64:
    """Each unit's cost: the sum of ``cost`` over its segments.

    Examples:
        >>> unit_costs(np.array([0, 2, 3]), np.array([2, 3, 4]), cost_function("tokens")).tolist()
        [5.0, 4.0]
    """
    per = cost(np.asarray(seg_len, dtype=np.int64))
    cum = np.concatenate([[0.0], np.cumsum(per)])
    return np.asarray(cum[unit_ptr[1:]] - cum[unit_ptr[:-1]], dtype=np.float64)


def _greedy(costs: F64, world: int) -> I64:
    """Greedy by rounds over ``(steps, world * per)`` costs -> each unit's rank."""
    steps, g = costs.shape
    per = g // world
    order = np.argsort(-costs, axis=1, kind="stable")
    ranks = np.empty((steps, g), dtype=np.int64)
    load = np.zeros((steps, world))
    rows = np.arange(steps)[:, None]
    for j in range(per):
        cols = order[:, j * world : (j + 1) * world]  # this round's units, largest first
        light = np.argsort(load, axis=1, kind="stable")  # ranks, least loaded first
        ranks[rows, cols] = light
        load[rows, light] += costs[rows, cols]
    return ranks


def _swap(costs: F64, ranks: I64, world: int) -> None:
    """Improve each step's deal in place: its most and least loaded ranks swap the best pair."""
    steps, g = costs.shape
    per = g // world
    rows = np.arange(steps)
    for _ in range(SWAPS):
        by_rank = np.argsort(ranks, axis=1, kind="stable").reshape(steps, world, per)
        load = costs[rows[:, None, None], by_rank].sum(axis=2)
        hi, lo = np.argmax(load, axis=1), np.argmin(load, axis=1)
        gap = load[rows, hi] - load[rows, lo]
        a, b = by_rank[rows, hi], by_rank[rows, lo]  # (steps, per) unit indices
        diff = costs[rows[:, None], a][:, :, None] - costs[rows[:, None], b][:, None, :]
        score = np.abs(gap[:, None, None] - 2 * diff)
        score[(diff <= 0) | (diff >= gap[:, None, None])] = np.inf
        flat = score.reshape(steps, per * per)
        k = np.argmin(flat, axis=1)
        ok = np.isfinite(flat[rows, k])
        if not ok.any():
            return
        i, j = np.divmod(k, per)
        r = rows[ok]
        ua, ub = a[r, i[ok]], b[r, j[ok]]
        ranks[r, ua], ranks[r, ub] = lo[ok], hi[ok]


def lower_bound(costs: F64, /, *, world_size: int) -> F64:
    """The max/mean per-rank cost no deal of equal counts beats, per step (a row of ``costs``).

    Of the ``(q - 1) * world_size + 1`` costliest units some rank holds ``q`` (``q = 1 ..
    per``), each costing at least the last of them, and ``per - q`` more, at least the cheapest;
    and the ``j < world_size`` cheapest units touch at most ``j`` ranks, so some rank holds
    ``per`` units of the rest, at least their ``per`` cheapest.

    Examples:
        >>> lower_bound(np.array([[9.0, 1, 1, 1]]), world_size=2).tolist()
        [1.6666666666666667]
    """
    x = np.sort(np.atleast_2d(np.asarray(costs, dtype=np.float64)), axis=1)
    steps, g = x.shape
    per = g // world_size
    mean = x.sum(axis=1) / world_size
    cum = np.concatenate([np.zeros((steps, 1)), np.cumsum(x, axis=1)], axis=1)
    cheap = (cum[:, per : per + world_size] - cum[:, :world_size]).max(axis=1)
    q = np.arange(1, per + 1)
    top = (q * x[:, g - 1 - (q - 1) * world_size] + cum[:, per - q]).max(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.maximum(top, cheap) / mean
    return np.where(mean > 0, np.maximum(out, 1.0), 1.0)


def _rank_loads(costs: F64, ranks: I64, world: int) -> tuple[I64, F64]:
    """Each rank's units ``(steps, world, per)`` and loads ``(steps, world)``."""
    steps, g = costs.shape
    by_rank = np.argsort(ranks, axis=1, kind="stable").reshape(steps, world, g // world)
    return by_rank, costs[np.arange(steps)[:, None, None], by_rank].sum(axis=2)


def _swap_top(costs: F64, ranks: I64, world: int) -> None:
    """Lower each step's maximum in place: its most loaded rank swaps with any other rank."""
    goal = np.maximum(lower_bound(costs, world_size=world), 1.0) * (1 + TOLERANCE)
    active = np.arange(len(costs))
    for _ in range(PASSES):
        c, rk = costs[active], ranks[active]
        rows = np.arange(len(active))
        by_rank, load = _rank_loads(c, rk, world)
        hi = np.argmax(load, axis=1)
        top = load[rows, hi]
        go = top > goal[active] * load.mean(axis=1)
        a = by_rank[rows, hi]  # (steps, per): the top rank's units
        light = np.argsort(load, axis=1, kind="stable")  # every rank (its own: no gain)
        b = by_rank[rows[:, None], light].reshape(len(active), -1)  # their units
        lb = np.repeat(load[rows[:, None], light], a.shape[1], axis=1)  # their ranks' loads
        diff = c[rows[:, None], a][:, :, None] - c[rows[:, None], b][:, None, :]
        new = np.maximum(top[:, None, None] - diff, lb[:, None, :] + diff)
        new[(diff <= 0) | (new >= top[:, None, None])] = np.inf
        flat = new.reshape(len(active), -1)
        k = np.argmin(flat, axis=1)
        go &= np.isfinite(flat[rows, k])
        if not go.any():
            return
        i, j = np.divmod(k[go], b.shape[1])
        r, ua, ub = active[go], a[rows[go], i], b[rows[go], j]
        ranks[r, ua], ranks[r, ub] = ranks[r, ub], hi[go]
        active = r


def deal(costs: F64, /, *, world_size: int, rng: np.random.Generator | None = None) -> I64:
    """The rank of each unit of one step (``costs`` 1-D) or of many (2-D, a row per step).

    Every rank gets ``len / world_size`` units. ``rng`` permutes the units first (tie-breaking).

    Raises:
        ConfigError: the units do not divide evenly over ``world_size``.

    Examples:
        >>> deal(np.array([9.0, 1, 1, 1, 5, 5]), world_size=2).tolist()
        [0, 0, 0, 1, 1, 1]
    """
    c = np.asarray(costs, dtype=np.float64)
    one = c.ndim == 1
    c2 = c[None, :] if one else c
    if c2.shape[1] % world_size:
        raise ConfigError(
            f"{c2.shape[1]} units per step do not divide over world_size={world_size}"
        )
    perm = rng.permutation(c2.shape[1]) if rng is not None else np.arange(c2.shape[1])
    ranks = np.empty(c2.shape, dtype=np.int64)
    ranks[:, perm] = _greedy(c2[:, perm], world_size)
    per = c2.shape[1] // world_size
    if world_size > 1 and per > 0:
        _swap(c2, ranks, world_size)
        _swap_top(c2, ranks, world_size)
    return ranks[0] if one else ranks


def round_robin(num_units: int, /, *, world_size: int) -> I64:
    """Contiguous dealing, the unbalanced baseline: unit ``u`` to rank ``u // (n / world)``.

    Examples:
        >>> round_robin(6, world_size=3).tolist()
        [0, 0, 1, 1, 2, 2]
    """
    return np.arange(num_units, dtype=np.int64) // max(1, num_units // world_size)


def imbalance(costs: F64, ranks: I64, /, *, world_size: int) -> float:
    """``max / mean`` of the per-rank cost (1.0 when perfectly even or all zero).

    Examples:
        >>> imbalance(np.array([3.0, 1.0]), np.array([0, 1]), world_size=2)
        1.5
    """
    load = np.bincount(
        np.asarray(ranks).ravel(), weights=np.asarray(costs).ravel(), minlength=world_size
    )
    mean = float(load.mean())
    return float(load.max() / mean) if mean > 0 else 1.0
