"""The declared options of a :class:`~datamill.loader.mix.Mix`: :class:`MixSpec` states each
field's rule once and checks them all when it is built (the Mix keeps the spec)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from datamill.core.checks import check_float
from datamill.core.errors import ConfigError

__all__ = ["STOPPING", "MixSpec", "Stopping", "quotas"]

Stopping = Literal["first_exhausted", "all_exhausted"]
STOPPING: tuple[Stopping, ...] = ("first_exhausted", "all_exhausted")


def quotas(weights: Sequence[float], /, *, total: int) -> list[int]:
    """Split ``total`` samples by ``weights`` exactly (largest remainder, ties to the lower index).

    Examples:
        >>> quotas([0.5, 0.3, 0.2], total=10), quotas([1, 1, 1], total=10)
        ([5, 3, 2], [4, 3, 3])
    """
    fr = [Fraction(w) for w in weights]
    if not fr or any(w < 0 for w in fr) or sum(fr) <= 0 or total < 0:
        raise ConfigError(
            f"weights must be >= 0 with a positive sum and total >= 0, got {list(weights)}, {total}"
        )
    exact = [total * w / sum(fr) for w in fr]
    out = [int(x) for x in exact]  # floor (non-negative)
    order = sorted(range(len(fr)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


@dataclass(frozen=True)
class MixSpec:
    """What a Mix was asked for, checked: one weight and one distinct name per source, at most one
    of ``epoch_size`` and ``stopping`` (neither: ``"first_exhausted"``).

    Examples:
        >>> MixSpec.declare([0.7, 0.3]).names, MixSpec.declare([1, 1]).stopping
        (('source0', 'source1'), 'first_exhausted')
        >>> MixSpec.declare([1], epoch_size=3, stopping="all_exhausted")
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: give epoch_size or stopping, not both
    """

    weights: tuple[float, ...]
    names: tuple[str, ...]
    epoch_size: int | None
    stopping: Stopping | None
    source_column: str

    @classmethod
    def declare(
        cls,
        weights: Sequence[Any],
        *,
        epoch_size: int | None = None,
        stopping: Stopping | None = None,
        names: Sequence[str] | None = None,
        source_column: str = "source",
    ) -> MixSpec:
        """The spec of ``len(weights)`` sources, checked."""
        if epoch_size is not None and stopping is not None:
            raise ConfigError("give epoch_size or stopping, not both")
        checked = tuple(check_float(w, name=f"weights[{i}]", low=0) for i, w in enumerate(weights))
        quotas(checked, total=0)  # a positive sum
        default = [f"source{i}" for i in range(len(checked))]
        return cls(
            weights=checked,
            names=tuple(default if names is None else (str(n) for n in names)),
            epoch_size=epoch_size,
            stopping=None if epoch_size is not None else (stopping or "first_exhausted"),
            source_column=source_column,
        )

    def __post_init__(self) -> None:
        n = len(self.weights)
        if len(self.names) != n or len(set(self.names)) != n:
            raise ConfigError(f"names must be {n} distinct strings, got {list(self.names)}")
        if self.stopping not in (None, *STOPPING):
            raise ConfigError(
                f"stopping must be 'first_exhausted' or 'all_exhausted', got {self.stopping!r}"
            )
