"""Where the scale-out engines register the jobs they run (``register_engine("ray",
preprocess=...)``).

An engine package registers its jobs when imported; :mod:`datamill.engines` maps an engine name to
the module that registers it and imports that module on first use, so the packages that offer an
``engine=`` option (preprocessing, pretrain) never import an engine, and the engine imports only
this table, never :mod:`datamill.engines` (that would be a cycle).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["register_engine", "registered_job"]

_JOBS: dict[tuple[str, str], Callable[..., Any]] = {}


def register_engine(name: str, **jobs: Callable[..., Any]) -> None:
    """Register the jobs ``name`` runs (``job name -> callable``); re-registering replaces them.

    Examples:
        >>> register_engine("doc-example", preprocess=len)
        >>> registered_job("doc-example", "preprocess")("abc")
        3
        >>> _ = _JOBS.pop(("doc-example", "preprocess"))
    """
    for job, fn in jobs.items():
        _JOBS[(name, job)] = fn


def registered_job(name: str, job: str) -> Callable[..., Any] | None:
    """The callable registered for ``(engine, job)``, or ``None``."""
    return _JOBS.get((name, job))
