"""The writing verbs a :class:`~datamill.shards.dataset.ShardsetDataset` offers, registered by the
writer side.

The reader (:mod:`datamill.shards.dataset`) must not import the writer
(:mod:`datamill.shards.create`, :mod:`datamill.shards.writer`), which opens and returns readers; so
``ShardsetDataset.create`` and ``ShardsetDataset.add`` look ``create``/``add`` up here, and
:mod:`datamill.shards.create` registers them when imported. The package ``__init__`` imports it, and
Python imports a package before any of its modules, so the verbs are registered whenever a dataset
exists (the same inversion as the loader's Source registry).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["register_verbs", "verb"]

_VERBS: dict[str, Callable[..., Any]] = {}


def register_verbs(**verbs: Callable[..., Any]) -> None:
    """Register ``name -> function`` (``create``, ``add``)."""
    _VERBS.update(verbs)


def verb(name: str) -> Callable[..., Any]:
    """The registered function ``name`` (``KeyError`` is an internal error: the package registers
    both)."""
    return _VERBS[name]
