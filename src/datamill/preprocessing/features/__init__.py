"""Registry of feature types: type name → module defining ``Handler`` (imported lazily).

Adding a type: one module with a ``Handler`` (a
:class:`~datamill.preprocessing.features.base.FeatureHandler` declaring every name in
:data:`~datamill.preprocessing.features.base.REQUIRED_ATTRIBUTES`) plus one line here. A handler
class that misses an attribute fails loudly when it is loaded (:func:`handler_class`).
"""

from __future__ import annotations

import importlib
from functools import cache

from datamill.core.errors import ConfigError
from datamill.preprocessing.features.base import (
    CSR,
    REQUIRED_ATTRIBUTES,
    FeatureContext,
    FeatureHandler,
)

__all__ = [
    "CSR",
    "FEATURE_TYPES",
    "FeatureContext",
    "FeatureHandler",
    "get_handler",
    "handler_class",
    "handler_classes",
]

FEATURE_TYPES: dict[str, str] = {
    "audio": "datamill.preprocessing.features.audio",
    "bag": "datamill.preprocessing.features.bag",
    "binary": "datamill.preprocessing.features.binary",
    "category": "datamill.preprocessing.features.category",
    "date": "datamill.preprocessing.features.date",
    "h3": "datamill.preprocessing.features.h3",
    "image": "datamill.preprocessing.features.image",
    "number": "datamill.preprocessing.features.number",
    "sequence": "datamill.preprocessing.features.sequence",
    "set": "datamill.preprocessing.features.set_",
    "text": "datamill.preprocessing.features.text",
    "timeseries": "datamill.preprocessing.features.timeseries",
    "vector": "datamill.preprocessing.features.vector",
}


def _check(type_name: str, cls: type[FeatureHandler]) -> None:
    concrete = [k for k in cls.__mro__ if issubclass(k, FeatureHandler) and k is not FeatureHandler]
    missing = [a for a in REQUIRED_ATTRIBUTES if not any(a in vars(k) for k in concrete)]
    if missing:
        raise TypeError(
            f"feature type {type_name!r}: {cls.__module__}.Handler does not define "
            f"{', '.join(missing)}"
        )
    if cls.type_name != type_name:
        raise TypeError(
            f"feature type {type_name!r}: {cls.__module__}.Handler.type_name is {cls.type_name!r}"
        )


@cache
def handler_class(type_name: str) -> type[FeatureHandler]:
    """The ``Handler`` class of ``type_name``.

    Raises:
        ConfigError: unknown or not implemented type.
        TypeError: the handler class misses a required attribute (a programming error).

    Examples:
        >>> handler_class("number").input_type, handler_class("binary").missing_value_strategy
        ('float64', 'fill_with_false')
    """
    if type_name not in FEATURE_TYPES:
        raise ConfigError(
            f"unknown feature type {type_name!r}; valid types: {', '.join(sorted(FEATURE_TYPES))}"
        )
    modname = FEATURE_TYPES[type_name]
    try:
        module = importlib.import_module(modname)
    except ModuleNotFoundError as exc:
        if exc.name != modname:
            raise
        raise ConfigError(f"feature type {type_name!r} is not implemented yet") from exc
    cls = getattr(module, "Handler", None)
    if cls is None:
        raise ConfigError(
            f"feature type {type_name!r} is not implemented yet ({modname} has no Handler)"
        )
    _check(type_name, cls)
    return cls  # type: ignore[no-any-return]  # module attribute


def handler_classes() -> dict[str, type[FeatureHandler]]:
    """Every registered type's handler class (imports them all)."""
    return {name: handler_class(name) for name in FEATURE_TYPES}


def get_handler(type_name: str) -> FeatureHandler:
    """A fresh handler instance for ``type_name``."""
    return handler_class(type_name)()
