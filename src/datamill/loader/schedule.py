"""Mixture weights over training: :class:`Schedule`, in global steps, exact per-step quotas.

A schedule is a list of ``(step, {source name: weight})`` points; between points the weights stay
constant (``interpolation="constant"``) or move linearly (``"linear"``); after the last point they
stay. Each point's weights are normalised to sum to 1 (as exact fractions of their decimal text,
so every process computes the same numbers).

Global step ``s`` of ``G`` units gives source ``i`` the target ``x_i(s) = G * w_i(s)`` and the
cumulative target ``C_i(s) = x_i(0) + ... + x_i(s - 1)`` (closed forms, exact rationals).
:meth:`Schedule.quotas` hands out ``floor(x_i)`` or ``ceil(x_i)`` units per source, the extra ones
to the sources furthest below their cumulative target; it needs only the units each source has
had so far (a resume state carries them). So every global batch is within one unit of its target
per source, and with two sources every window of consecutive global batches is within one unit of
its target (each source's deviation from ``C_i`` stays within ``[-1/2, 1/2]``). With three or
more sources every window is within two units (every prefix within one in the tests, 2 to 8
sources). No rounding keeps every window within one unit for every schedule of three sources:
``tests/loader/test_lm.py::test_no_quotas_keep_every_window_within_one_for_three_sources`` holds a
schedule where an exact search over all quotas finds none (docs/lm-batches.md).

A source's own order never depends on the weights: a change only changes how fast each source's
stream is consumed, so no sample is repeated or skipped within its epoch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, Literal

from datamill.core.checks import check_float, check_int
from datamill.core.errors import ConfigError
from datamill.core.fingerprint import fingerprint_obj

__all__ = ["Schedule", "wants_lm"]

Interpolation = Literal["constant", "linear"]


def _frac(value: float, name: str) -> Fraction:
    return Fraction(repr(float(check_float(value, name=name, low=0))))


class Schedule:
    """Piecewise constant or linear mixture weights in the global step.

    Args:
        points: ``[(step, {name: weight, ...}), ...]``, the first at step 0, steps increasing;
            every point names the same sources (a weight may be 0, not all of them).
        interpolation: ``"constant"`` (a point's weights hold until the next point) or
            ``"linear"`` (they move linearly to the next point's). Defaults to ``"constant"``.

    Raises:
        ConfigError: no points, a first step other than 0, steps not increasing, different names
            between points, negative or all-zero weights.

    Examples:
        >>> s = Schedule([(0, {"a": 0.8, "b": 0.2}), (10, {"a": 0.2, "b": 0.8})])
        >>> s.weights(9), s.weights(10)
        ([Fraction(4, 5), Fraction(1, 5)], [Fraction(1, 5), Fraction(4, 5)])
        >>> s.quotas(0, [0, 0], global_batch=8), s.quotas(10, [64, 16], global_batch=8)
        ([6, 2], [2, 6])
        >>> lin = Schedule([(0, {"a": 1, "b": 0}), (4, {"a": 0, "b": 1})], interpolation="linear")
        >>> lin.weights(1)
        [Fraction(3, 4), Fraction(1, 4)]
    """

    def __init__(
        self,
        points: Sequence[tuple[int, Mapping[str, float]]],
        /,
        *,
        interpolation: Interpolation = "constant",
    ) -> None:
        pts = list(points)
        if not pts:
            raise ConfigError("Schedule needs at least one (step, {name: weight}) point")
        if interpolation not in ("constant", "linear"):
            raise ConfigError(
                f"interpolation must be 'constant' or 'linear', got {interpolation!r}"
            )
        self.interpolation: Interpolation = interpolation
        self.names: list[str] = []  # point 0's, once _point has checked its shape
        self.steps: list[int] = []
        self._w: list[list[Fraction]] = []
        for k, item in enumerate(pts):
            step, w = self._point(k, item, pts)
            self.steps.append(step)
            self._w.append([x / sum(w) for x in w])

    def _point(
        self, k: int, item: Any, pts: list[tuple[int, Mapping[str, float]]]
    ) -> tuple[int, list[Fraction]]:
        """Point ``k``'s step and weights (in :attr:`names` order), checked against the points
        before it.

        Raises:
            ConfigError: not ``(step, {name: weight})``, a step out of order, other names, or no
                positive weight.
        """
        if not isinstance(item, tuple) or len(item) != 2 or not isinstance(item[1], Mapping):
            raise ConfigError(f"Schedule point {k} must be (step, {{name: weight}}), got {item!r}")
        if k == 0:
            self.names = [str(n) for n in item[1]]
        step = check_int(item[0], name=f"Schedule point {k}'s step", low=0, high=None)
        if (k == 0 and step != 0) or (self.steps and step <= self.steps[-1]):
            raise ConfigError(
                f"Schedule steps must start at 0 and increase, got {[p[0] for p in pts]}"
            )
        if sorted(map(str, item[1])) != sorted(self.names):
            raise ConfigError(
                f"Schedule point {k} names {sorted(map(str, item[1]))}, the first names "
                f"{sorted(self.names)}; every point must name the same sources"
            )
        w = [_frac(item[1][n], f"Schedule point {k}'s weight of {n!r}") for n in self.names]
        if sum(w) <= 0:
            raise ConfigError(f"Schedule point {k} has no positive weight")
        return step, w

    def as_dict(self) -> dict[str, Any]:
        """The schedule as JSON (normalised weights as ``"p/q"`` strings)."""
        return {
            "interpolation": self.interpolation,
            "names": list(self.names),
            "points": [[s, [str(x) for x in w]] for s, w in zip(self.steps, self._w)],
        }

    def fingerprint(self) -> str:
        """A hash of :meth:`as_dict` (recorded in resume states and run records)."""
        return fingerprint_obj(["datamill.loader.Schedule@1", self.as_dict()])

    def reorder(self, names: Sequence[str]) -> Schedule:
        """The same schedule with its sources in the order of ``names`` (a Mix's)."""
        if sorted(names) != sorted(self.names):
            raise ConfigError(
                f"the schedule names {sorted(self.names)}, the mix {sorted(names)}",
                hint="name every source of the Mix (Mix(..., names=[...])) in every point",
            )
        idx = [self.names.index(n) for n in names]
        out = Schedule.__new__(Schedule)
        out.interpolation, out.names, out.steps = self.interpolation, list(names), list(self.steps)
        out._w = [[w[i] for i in idx] for w in self._w]
        return out

    def _segment(self, step: int) -> int:
        k = 0
        while k + 1 < len(self.steps) and self.steps[k + 1] <= step:
            k += 1
        return k

    def weights(self, step: int) -> list[Fraction]:
        """The normalised weights of global step ``step``."""
        k = self._segment(step)
        a = self._w[k]
        if self.interpolation == "constant" or k + 1 == len(self.steps):
            return list(a)
        b, t = self._w[k + 1], Fraction(step - self.steps[k], self.steps[k + 1] - self.steps[k])
        return [x + (y - x) * t for x, y in zip(a, b)]

    def cumulative(self, step: int) -> list[Fraction]:
        """``sum of weights(s) for s < step`` per source (closed form per segment)."""
        total = [Fraction(0)] * len(self.names)
        for k, s0 in enumerate(self.steps):
            if s0 >= step:
                break
            s1 = self.steps[k + 1] if k + 1 < len(self.steps) else math.inf
            n = int(min(step, s1) - s0)
            a = self._w[k]
            if self.interpolation == "constant" or k + 1 == len(self.steps):
                total = [t + n * x for t, x in zip(total, a)]
            else:
                slope = [(y - x) / (self.steps[k + 1] - s0) for x, y in zip(a, self._w[k + 1])]
                tri = Fraction(n * (n - 1), 2)
                total = [t + n * x + d * tri for t, x, d in zip(total, a, slope)]
        return total

    def quotas(self, step: int, counts: Sequence[int], /, *, global_batch: int) -> list[int]:
        """Units per source in global step ``step``, given the units each had before it.

        Each source gets ``floor(x_i)`` or ``ceil(x_i)`` of its target ``x_i = global_batch *
        w_i(step)``; the extra units go to the sources furthest below their cumulative target
        (ties: the earlier source). The quotas sum to ``global_batch``.
        """
        x = [global_batch * w for w in self.weights(step)]
        goal = [global_batch * c for c in self.cumulative(step + 1)]
        out = [math.floor(v) for v in x]
        extra = global_batch - sum(out)
        behind = sorted(
            (i for i, v in enumerate(x) if v != out[i]),
            key=lambda i: (-(goal[i] - counts[i] - out[i]), i),
        )
        for i in behind[:extra]:
            out[i] += 1
        return out


def wants_lm(source: object, packing: object, balance: object) -> bool:
    """Whether ``Loader(...)`` makes language-model batches: packing, balancing or a scheduled Mix.

    Examples:
        >>> wants_lm(None, None, "tokens"), wants_lm(None, None, None)
        (True, False)
    """
    scheduled = getattr(source, "schedule", None) is not None
    return packing is not None or balance is not None or scheduled
