"""Registry of feature types: type name → module defining ``Handler`` (imported lazily)."""

from __future__ import annotations

import importlib
from functools import cache

from datamill.core.errors import ConfigError
from datamill.preprocess.features.base import CSR, FeatureContext, FeatureHandler

__all__ = ["CSR", "FEATURE_TYPES", "FeatureContext", "FeatureHandler", "get_handler"]

FEATURE_TYPES: dict[str, str] = {
    "bag": "datamill.preprocess.features.bag",
    "binary": "datamill.preprocess.features.binary",
    "category": "datamill.preprocess.features.category",
    "image": "datamill.preprocess.features.image",
    "number": "datamill.preprocess.features.number",
    "sequence": "datamill.preprocess.features.sequence",
    "set": "datamill.preprocess.features.set_",
    "text": "datamill.preprocess.features.text",
    "timeseries": "datamill.preprocess.features.timeseries",
}


@cache
def handler_class(type_name: str) -> type[FeatureHandler]:
    """The ``Handler`` class of ``type_name`` (ConfigError for unknown / not implemented types)."""
    if type_name not in FEATURE_TYPES:
        raise ConfigError(f"unknown feature type {type_name!r}; valid types: {', '.join(sorted(FEATURE_TYPES))}")
    modname = FEATURE_TYPES[type_name]
    try:
        module = importlib.import_module(modname)
    except ModuleNotFoundError as exc:
        if exc.name != modname:
            raise
        raise ConfigError(f"feature type {type_name!r} is not implemented yet") from exc
    cls = getattr(module, "Handler", None)
    if cls is None:
        raise ConfigError(f"feature type {type_name!r} is not implemented yet ({modname} has no Handler)")
    return cls  # type: ignore[no-any-return]  # module attribute


def get_handler(type_name: str) -> FeatureHandler:
    """A fresh handler instance for ``type_name``."""
    return handler_class(type_name)()
