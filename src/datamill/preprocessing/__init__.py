"""Ludwig-style typed preprocessing: a dataset + config → ``<stem>.hdf5`` + ``<stem>.meta.json``.

The verb is :func:`datamill.preprocess` (:func:`datamill.preprocessing.api.preprocess`); this
package holds its parts: ``config`` (the validated config), ``features`` (one handler per type and
the registry), ``pipeline`` (plan → prepare → fit → finalize → transform), ``executors`` (who runs
the per-block functions), ``sinks`` and ``hdf5`` (where the output goes; the one writer and reader
of the HDF5 layout, :class:`~datamill.preprocessing.hdf5.HDF5Source`), ``meta`` (the metadata).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Executor",
    "HDF5Sink",
    "LocalExecutor",
    "Metadata",
    "Plan",
    "Preprocessed",
    "Sink",
    "load",
    "preprocess",
]
assert sorted(__all__) == __all__


def __getattr__(name: str) -> Any:
    """The package's public names, imported on first access (plain imports: the import graph sees
    them)."""
    match name:
        case "Executor":
            from datamill.preprocessing.executors import Executor

            return Executor
        case "HDF5Sink":
            from datamill.preprocessing.sinks import HDF5Sink

            return HDF5Sink
        case "LocalExecutor":
            from datamill.preprocessing.executors import LocalExecutor

            return LocalExecutor
        case "Metadata":
            from datamill.preprocessing.meta import Metadata

            return Metadata
        case "Plan":
            from datamill.preprocessing.plans import Plan

            return Plan
        case "Preprocessed":
            from datamill.preprocessing.api import Preprocessed

            return Preprocessed
        case "Sink":
            from datamill.preprocessing.sinks import Sink

            return Sink
        case "load":
            from datamill.preprocessing.api import load

            return load
        case "preprocess":
            from datamill.preprocessing.api import preprocess

            return preprocess
        case _:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
