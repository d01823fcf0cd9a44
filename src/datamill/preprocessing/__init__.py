"""Ludwig-style typed preprocessing: a dataset + config → ``<stem>.hdf5`` + ``<stem>.meta.json``.

The verb is :func:`datamill.preprocess` (:func:`datamill.preprocessing.api.preprocess`); this
package holds its parts: ``config`` (the validated config), ``features`` (one handler per type and
the registry), ``pipeline`` (plan → prepare → fit → finalize → transform), ``executors`` (who runs
the per-block functions), ``sinks`` and ``hdf5`` (where the output goes; the one writer and reader
of the HDF5 layout, :class:`~datamill.preprocessing.hdf5.HDF5Source`), ``meta`` (the metadata).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Executor", "HDF5Sink", "LocalExecutor", "Metadata", "Plan", "Preprocessed", "Sink", "load", "preprocess"]
assert sorted(__all__) == __all__

_MODULES = {
    "Executor": "datamill.preprocessing.executors",
    "HDF5Sink": "datamill.preprocessing.sinks",
    "LocalExecutor": "datamill.preprocessing.executors",
    "Metadata": "datamill.preprocessing.meta",
    "Plan": "datamill.preprocessing.plans",
    "Preprocessed": "datamill.preprocessing.api",
    "Sink": "datamill.preprocessing.sinks",
    "load": "datamill.preprocessing.api",
    "preprocess": "datamill.preprocessing.api",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
