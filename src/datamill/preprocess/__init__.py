"""Ludwig-style typed preprocessing: a dataset + config → ``<stem>.hdf5`` + ``<stem>.meta.json``."""

from __future__ import annotations

from typing import Any

__all__ = ["load", "preprocess"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from datamill.preprocess import api

        return getattr(api, name)
    raise AttributeError(name)
