"""The engine registry: ``engine="ray"`` -> the module that registers the Ray jobs.

One of the registries whose string module paths the architecture test follows as import edges
(``tests/test_architecture.py``). :func:`engine_job` imports the engine's module on first use (an
optional extra: ``ray`` itself is imported when a run starts), which registers its jobs in
:mod:`datamill.core.engine`; the callers (preprocessing, pretrain) import this module, never the
engine.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from datamill.core.engine import registered_job
from datamill.core.errors import ConfigError

__all__ = ["ENGINE_MODULES", "LOCAL", "check_engine", "engine_job"]

LOCAL = "local"
"""The in-process engine every job has (not in the registry: the caller runs it itself)."""

ENGINE_MODULES = {
    "ray": "datamill.ray",
}
"""Engine name -> the module that registers its jobs
(:func:`datamill.core.engine.register_engine`)."""


def check_engine(engine: str) -> None:
    """Raise a :class:`ConfigError` listing the valid engines unless ``engine`` is one."""
    if engine != LOCAL and engine not in ENGINE_MODULES:
        valid = ", ".join(repr(e) for e in (LOCAL, *ENGINE_MODULES))
        raise ConfigError(f"engine must be one of {valid}, got {engine!r}")


def engine_job(engine: str, job: str) -> Callable[..., Any]:
    """The callable the ``engine`` registered for ``job`` (its module is imported on first use).

    Raises:
        ConfigError: an unknown engine, or one that does not run ``job``.

    Examples:
        >>> engine_job("spark", "preprocess")
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: engine must be one of 'local', 'ray', got 'spark'
    """
    check_engine(engine)
    fn = registered_job(engine, job)
    if fn is None and engine in ENGINE_MODULES:
        importlib.import_module(ENGINE_MODULES[engine])
        fn = registered_job(engine, job)
    if fn is None:
        raise ConfigError(f"engine {engine!r} does not run {job!r}")
    return fn
