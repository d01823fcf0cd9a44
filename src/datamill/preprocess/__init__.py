"""Ludwig-style typed preprocessing: a dataset + config → ``<stem>.hdf5`` + ``<stem>.meta.json``.

``datamill.preprocess`` is both this package and the verb: once the package is imported, Python
binds the name ``datamill.preprocess`` to it, so the package module is made callable and forwards
to :func:`datamill.preprocess.api.preprocess`.
"""

from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["Metadata", "Preprocessed", "load", "preprocess"]
assert sorted(__all__) == __all__


def __getattr__(name: str) -> Any:
    if name in __all__:
        from datamill.preprocess import api

        return getattr(api, name)
    raise AttributeError(name)


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from datamill.preprocess.api import preprocess

        return preprocess(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
