"""Lineage: trace a run's samples and steps (``datamill trace``; the API is
:func:`datamill.loader.trace.trace`)."""

from __future__ import annotations

__all__: list[str] = []
