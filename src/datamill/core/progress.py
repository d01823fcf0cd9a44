"""Progress bars (tqdm) that can be silenced globally (``--quiet``) or per call."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Self, TypeVar

__all__ = ["is_quiet", "progress", "quiet", "set_quiet"]

T = TypeVar("T")
_QUIET = os.environ.get("DATAMILL_QUIET", "") not in ("", "0")


def set_quiet(value: bool) -> None:  # noqa: FBT001 - a setter: the flag is its one argument
    """Silence (``True``) or enable (``False``) every progress bar of this process."""
    global _QUIET
    _QUIET = bool(value)


def is_quiet() -> bool:
    """Whether progress bars are silenced."""
    return _QUIET


@contextmanager
def quiet(value: bool = True) -> Iterator[None]:  # noqa: FBT001, FBT002 - `with quiet():`, or quiet(flag)
    """Context manager silencing progress bars inside the block."""
    global _QUIET
    old, _QUIET = _QUIET, bool(value)
    try:
        yield
    finally:
        _QUIET = old


def progress(
    iterable: Iterable[T] | None = None,
    *,
    desc: str = "",
    total: float | None = None,
    unit: str = "it",
    disable: bool | None = None,
    **kwargs: Any,
) -> Any:
    """A ``tqdm`` bar over ``iterable`` (or a manual bar when ``iterable`` is ``None``).

    Disabled when quiet mode is on or ``disable=True``; then it costs almost nothing.
    """
    off = _QUIET if disable is None else disable
    if off:  # no tqdm import (0.1-0.2 s, most of it package metadata) for a bar nobody sees
        return _NullBar(iterable)
    from tqdm.auto import tqdm

    return tqdm(
        iterable,
        desc=desc,
        total=total,
        unit=unit,
        disable=off,
        leave=False,
        dynamic_ncols=True,
        **kwargs,
    )


class _NullBar:
    """What a disabled bar does: iterate its iterable, ignore updates."""

    def __init__(self, iterable: Iterable[Any] | None) -> None:
        self.iterable = iterable

    def __iter__(self) -> Iterator[Any]:
        return iter(self.iterable if self.iterable is not None else ())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: float = 1) -> None:
        """Nothing to show."""

    def close(self) -> None:
        """Nothing to close."""
