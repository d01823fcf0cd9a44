"""Handlers one CLI command lends another (``datamill iterate --url`` runs the serve extra's
``iterate``).

A command module registers a handler while it registers its subcommands (``datamill.cli`` imports
every module of its ``COMMAND_MODULES`` registry before dispatching), and another command calls it
by name, so no command module imports another one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from datamill.core.errors import ConfigError

__all__ = ["command_handler", "register_handler"]

_HANDLERS: dict[str, Callable[..., Any]] = {}


def register_handler(name: str, fn: Callable[..., Any]) -> None:
    """Register ``fn`` under ``name`` (re-registering replaces it)."""
    _HANDLERS[name] = fn


def command_handler(name: str, *, hint: str) -> Callable[..., Any]:
    """The handler registered as ``name``.

    Raises:
        ConfigError: none is (its command module is not installed), with ``hint``.

    Examples:
        >>> command_handler("nothing-here", hint="install it")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: no handler for 'nothing-here' (its command is not
        available)
          Fix: install it
    """
    if name not in _HANDLERS:
        raise ConfigError(f"no handler for {name!r} (its command is not available)", hint=hint)
    return _HANDLERS[name]
