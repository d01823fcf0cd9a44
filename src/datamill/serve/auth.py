"""API keys: ``dmk_<id>.<secret>``, the secret from ``secrets.token_urlsafe(32)``; only its sha256 is stored.

Keys are checked against an in-memory table (compared with :func:`hmac.compare_digest`); nothing is
written per request. The table is reloaded when the database changes (``PRAGMA data_version``), so
``datamill serve keys revoke`` takes effect on a running server at its next request.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
from typing import Any

from datamill.core.errors import ConfigError
from datamill.serve.journal import Journal

__all__ = ["KEY_PREFIX", "ROLES", "KeyStore", "create_key", "parse_key"]

KEY_PREFIX = "dmk_"
ROLES = ("admin", "read")
_KEY_RE = re.compile(r"^dmk_([A-Za-z0-9]{8,32})\.([A-Za-z0-9_-]{16,128})$")


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def parse_key(key: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a well-formed key, else ``None``.

    Examples:
        >>> parse_key("dmk_abcdefgh." + "x" * 43)[0]
        'abcdefgh'
        >>> parse_key("../etc/passwd") is None
        True
    """
    m = _KEY_RE.match(key)
    return (m.group(1), m.group(2)) if m else None


def create_key(journal: Journal, *, role: str = "read", note: str = "") -> tuple[str, str]:
    """Create a key; returns ``(key id, full key)``: the full key is shown once and never stored.

    Raises:
        ConfigError: an unknown role.

    Examples:
        >>> import tempfile
        >>> key_id, key = create_key(Journal(tempfile.mkdtemp()), role="admin")
        >>> key.startswith("dmk_" + key_id + ".")
        True
    """
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    journal.add_key(key_id, _digest(secret), role, note)
    return key_id, f"{KEY_PREFIX}{key_id}.{secret}"


class KeyStore:
    """The server's view of the keys (see the module docstring).

    Examples:
        >>> import tempfile
        >>> j = Journal(tempfile.mkdtemp()); _, key = create_key(j, role="read")
        >>> store = KeyStore(j)
        >>> store.check(key), store.check(key[:-1] + "A" if key[-1] != "A" else key[:-1] + "B")
        ('read', None)
    """

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._lock = threading.Lock()
        self._version = -1
        self._keys: dict[str, tuple[str, str]] = {}

    def _refresh(self) -> None:
        version = self.journal.data_version()
        with self._lock:
            if version == self._version and self._keys is not None:
                return
        keys = {k["id"]: (k["hash"], k["role"]) for k in self.journal.list_keys() if k["revoked"] is None}
        with self._lock:
            self._keys, self._version = keys, version

    def reload(self) -> None:
        """Reload now (after this process changed the keys)."""
        with self._lock:
            self._version = -1
        self._refresh()

    def check(self, key: str) -> str | None:
        """The role of a valid, unrevoked key, else ``None`` (constant-time digest comparison)."""
        parsed = parse_key(key)
        self._refresh()
        if parsed is None:
            return None
        entry = self._keys.get(parsed[0])
        candidate = _digest(parsed[1])
        expected = entry[0] if entry else "0" * 64
        ok = hmac.compare_digest(candidate, expected)
        return entry[1] if ok and entry else None

    def count(self) -> int:
        """Keys that can still be used."""
        self._refresh()
        return len(self._keys)

    def listing(self) -> list[dict[str, Any]]:
        """Every key without its digest."""
        return [{k: v for k, v in row.items() if k != "hash"} for row in self.journal.list_keys()]
