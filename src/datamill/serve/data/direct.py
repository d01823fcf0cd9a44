"""Direct mode: the server coordinates, the clients read (``docs/serving-scale.md``). A direct lease
carries only its runs; the server tells a client the **client location** of a dataset registered
with one (journal table ``client_locations``) and never takes a path from a client.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from datamill.core.errors import ConfigError

if TYPE_CHECKING:
    from datamill.serve.journal.store import Journal

__all__ = ["ClientLocations", "check_location"]

_MAX_LOCATION = 4096


def check_location(location: str) -> str:
    """A client-visible location: an absolute path or an ``s3://bucket/prefix`` URL.

    Examples:
        >>> check_location("s3://bucket/data")
        's3://bucket/data'
        >>> check_location("relative/path")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: client_location must be an absolute path or
        s3://bucket/prefix, got 'relative/path'
    """
    if (
        not isinstance(location, str)
        or not 0 < len(location) <= _MAX_LOCATION
        or "\x00" in location
        or not (
            location.startswith("s3://") and len(location) > 5 or PurePath(location).is_absolute()
        )
    ):
        raise ConfigError(
            "client_location must be an absolute path or s3://bucket/prefix, got "
            f"{str(location)[:80]!r}"
        )
    return location


class ClientLocations:
    """The ``client_locations`` journal table: where clients read a dataset in direct mode; and
    ``client_identities``: the content identity of the data the server registered
    (:func:`~datamill.core.identity.content_identity`), which a direct client checks its copy
    against before it builds a batch from it."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def set(self, dataset: str, location: str) -> None:
        """Record (or replace) the client location of dataset id ``dataset``."""
        self.journal._exec(
            "INSERT OR REPLACE INTO client_locations (dataset, location) VALUES (?, ?)",
            (dataset, check_location(location)),
        )

    def get(self, dataset: str) -> str | None:
        """The client location of dataset id ``dataset``, or ``None``."""
        rows = self.journal._exec(
            "SELECT location FROM client_locations WHERE dataset = ?", (dataset,)
        )
        return str(rows[0][0]) if rows else None

    def set_identity(self, dataset: str, identity: Mapping[str, Any]) -> None:
        """Record (or replace) the content identity of dataset id ``dataset``."""
        self.journal._exec(
            "INSERT OR REPLACE INTO client_identities (dataset, identity) VALUES (?, ?)",
            (dataset, json.dumps(identity, sort_keys=True)),
        )

    def identity(self, dataset: str) -> dict[str, Any] | None:
        """The recorded content identity of dataset id ``dataset``, or ``None``."""
        rows = self.journal._exec(
            "SELECT identity FROM client_identities WHERE dataset = ?", (dataset,)
        )
        return dict(json.loads(rows[0][0])) if rows else None

    def require(self, dataset: str, name: str) -> str:
        """The client location, or a :class:`ConfigError` (HTTP 400) saying how to get one."""
        loc = self.get(dataset)
        if loc is None:
            raise ConfigError(
                f"dataset {name!r} has no client_location, so direct mode is refused",
                hint="register it with client_location= (a path every node sees, or s3://...), "
                "or use transport='built'",
            )
        return loc
