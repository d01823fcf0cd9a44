"""Parameter checks, stated once: integers and floats in a range, finite, of the right type.

Every constructor and CLI option that takes a count, a size or a probability checks it here, so a
limit and its message are written in one place. :func:`check_int` and :func:`check_float` raise
:class:`~datamill.core.errors.ConfigError` (a ``ValueError``) naming the parameter, the range and
the value given. A :class:`Limit` holds one parameter's range and serves both sides:
``limit(value)`` checks an argument of the Python API, ``limit.arg`` is the argparse ``type=`` of
the matching CLI option (a bad value is argparse's one ``error:`` line, exit 2).
"""

from __future__ import annotations

import argparse
import math
import numbers
from dataclasses import dataclass
from typing import Any

from datamill.core.errors import ConfigError, DatamillError

__all__ = [
    "BATCH_SIZE",
    "CACHE_MIB",
    "EPOCHS",
    "MAX_COUNT",
    "MAX_SIZE",
    "MIN_FREQ",
    "NUM_WORKERS",
    "PREFETCH",
    "SEED",
    "SHARD_SIZE",
    "TOKENIZER_VOCAB",
    "WINDOW",
    "WORLD_SIZE",
    "Limit",
    "check_float",
    "check_int",
    "check_path",
    "check_rank",
]

MAX_COUNT = 2**40
"""The largest count any parameter accepts (about 10^12): beyond it a run would never finish."""


def _num(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def _range_text(
    low: float | None, high: float | None, *, low_open: bool = False, high_open: bool = False
) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{_num(low)}, {_num(high)}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {_num(low)}"
    if high is not None:
        return f"{'<' if high_open else '<='} {_num(high)}"
    return "any value"


def check_int(
    value: Any,
    *,
    name: str,
    low: int | None = None,
    high: int | None = MAX_COUNT,
    hint: str | None = None,
    error: type[DatamillError] = ConfigError,
) -> int:
    """Return ``value`` as an ``int`` when it is an integer (not a bool) in ``[low, high]``.

    Args:
        value: the value given.
        name: the parameter's name, as the user spells it.
        low: the smallest allowed value. Defaults to ``None`` (no bound).
        high: the largest allowed value. Defaults to :data:`MAX_COUNT`.
        hint: how to fix it. Defaults to ``None``.
        error: the class raised. Defaults to :class:`ConfigError` (a resume state's field:
            ``ResumeStateError``).

    Raises:
        ConfigError: not an integer, or out of range.

    Examples:
        >>> check_int(3, name="window", low=1)
        3
        >>> check_int(0, name="window", low=1)
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: window must be an int in [1, 1,099,511,627,776], got 0
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{name} must be an int {_range_text(low, high)}, got {value!r}", hint=hint)
    number = int(value)
    if (low is not None and number < low) or (high is not None and number > high):
        raise error(f"{name} must be an int {_range_text(low, high)}, got {value!r}", hint=hint)
    return number


def check_float(
    value: Any,
    *,
    name: str,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    hint: str | None = None,
) -> float:
    """Return ``value`` as a finite ``float`` in ``[low, high]`` (``(low, high]`` with
    ``low_open``).

    NaN and infinities are refused whatever the bounds.

    Raises:
        ConfigError: not a real number, not finite, or out of range.

    Examples:
        >>> check_float(0.15, name="mask_prob", low=0, high=1)
        0.15
        >>> check_float(float("nan"), name="weight", low=0)
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: weight must be a finite number >= 0, got nan
    """
    what = (
        f"{name} must be a finite number "
        f"{_range_text(low, high, low_open=low_open, high_open=high_open)}, got {value!r}"
    )
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(what, hint=hint)
    v = float(value)
    if (
        not math.isfinite(v)
        or (low is not None and (v <= low if low_open else v < low))
        or (high is not None and (v >= high if high_open else v > high))
    ):
        raise ConfigError(what, hint=hint)
    return v


def check_rank(rank: Any, *, world_size: int) -> int:
    """Return ``rank`` when it is an int in ``[0, world_size)``.

    Examples:
        >>> check_rank(1, world_size=2)
        1
        >>> check_rank(2, world_size=2)
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: rank must be in [0, world_size=2), got 2
    """
    if (
        isinstance(rank, bool)
        or not isinstance(rank, numbers.Integral)
        or not 0 <= int(rank) < world_size
    ):
        raise ConfigError(f"rank must be in [0, world_size={world_size}), got {rank!r}")
    return int(rank)


@dataclass(frozen=True)
class Limit:
    """One parameter's range, for the API (``limit(value)``) and the CLI (``type=limit.arg``).

    Args:
        name: the parameter's name in the API (the CLI names its flag itself).
        low: smallest value. Defaults to ``None``.
        high: largest value. Defaults to :data:`MAX_COUNT` for ints, ``None`` for floats.
        kind: ``"int"`` or ``"float"``. Defaults to ``"int"``.
        low_open: ``low`` itself is refused (floats). Defaults to ``False``.
        hint: how to fix a bad value. Defaults to ``None``.

    Examples:
        >>> WINDOW = Limit("window", low=1)
        >>> WINDOW(5), WINDOW.arg("5")
        (5, 5)
        >>> WINDOW.arg("0")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: window must be an int in [1, 1,099,511,627,776], got 0
    """

    name: str
    low: float | None = None
    high: float | None = MAX_COUNT
    kind: str = "int"
    low_open: bool = False
    high_open: bool = False
    hint: str | None = None

    def __call__(self, value: Any) -> Any:  # int or float, by kind
        """Check an API argument; returns it as int/float."""
        if self.kind == "int":
            return check_int(
                value,
                name=self.name,
                low=None if self.low is None else int(self.low),
                high=None if self.high is None else int(self.high),
                hint=self.hint,
            )
        return check_float(
            value,
            name=self.name,
            low=self.low,
            high=self.high,
            low_open=self.low_open,
            high_open=self.high_open,
            hint=self.hint,
        )

    def arg(self, text: str) -> Any:
        """argparse ``type=``: parse and check a command-line string."""
        try:
            value: Any = int(text) if self.kind == "int" else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an int' if self.kind == 'int' else 'a number'}, got {text!r}"
            ) from None
        try:
            return self(value)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(exc.msg) from None


# ---- the limits shared by several capabilities (each states its own beside its code)
SEED = Limit("seed", low=0, high=2**63 - 1)
"""A seed: what ``np.random.SeedSequence`` takes, and fits an int64."""
BATCH_SIZE = Limit("batch_size", low=1)
WORLD_SIZE = Limit(
    "world_size", low=1, high=2**20, hint="the number of ranks (processes) of the run"
)
NUM_WORKERS = Limit("num_workers", low=0, high=1024)
PREFETCH = Limit("prefetch", low=0, high=1024)
EPOCHS = Limit("epochs", low=1, high=100_000)
WINDOW = Limit("window", low=1)
CACHE_MIB = Limit("cache_limit", low=0, high=2.0**40, kind="float")
"""A shard-cache size in MiB (the CLI's unit)."""
MIN_FREQ = Limit("min_freq", low=0)
"""Rarer tokens become unknown (0 and 1 both keep every token)."""
MAX_SIZE = Limit("max_size", low=0)
TOKENIZER_VOCAB = Limit("vocab_size", low=1, high=2**24)
"""A trained (BPE/WordPiece) tokenizer's vocabulary size."""
SHARD_SIZE = Limit("shard_size", low=1)


def check_path(path: Any, *, name: str = "path") -> str:
    """Return ``path`` as a string when the operating system can take it: no NUL byte, names and
    whole path within the system's limits (so a command fails here with the path named, not deep in
    a library).

    Examples:
        >>> check_path("out/data.parquet")
        'out/data.parquet'
        >>> check_path("a" * 300)  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...(300 characters): a name
        in the path is longer than 255 bytes
    """
    import os

    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a str or os.PathLike, got {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str path, got {type(text).__name__}")
    shown = text if len(text) <= 80 else text[:30] + f"...({len(text):,} characters)"
    if not text.strip():
        raise ConfigError(f"{name} is empty", hint="name a file or folder")
    if "\x00" in text:
        raise ConfigError(f"{name} contains a NUL byte", path=shown.replace("\x00", "\\0"))
    encoded = os.fsencode(text)
    if len(encoded) >= 4096:
        raise ConfigError(f"{name} is longer than 4,096 bytes", path=shown)
    if any(len(part) > 255 for part in encoded.split(b"/")):
        raise ConfigError("a name in the path is longer than 255 bytes", path=shown)
    return text
