"""Lazy import of optional heavy dependencies (torch, ray, fastapi)."""

from __future__ import annotations

import importlib
from types import ModuleType

from datamill.core.errors import MissingExtraError

__all__ = ["require"]


def require(module: str, *, extra: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming the extra to install.

    Examples:
        >>> require("json", extra="none").__name__
        'json'
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"this feature needs the optional package {module!r}, which is not installed",
            hint=f'pip install "datamill[{extra}]"',
        ) from exc
