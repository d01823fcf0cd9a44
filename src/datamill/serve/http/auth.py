"""API keys: ``dmk_<id>.<secret>``; only the secret's sha256 is stored (``docs/serving.md``). Keys
are checked against an in-memory table, reloaded when the journal changes (``PRAGMA
data_version``: a revocation takes effect at the next request); a key's first use of each UTC day
writes an audit row.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from datamill.core.errors import ConfigError
from datamill.core.wire import ID_PATTERN
from datamill.serve.journal.store import Journal

__all__ = [
    "KEY_PREFIX",
    "ROLES",
    "KeyInfo",
    "KeyStore",
    "create_key",
    "parse_duration",
    "parse_key",
]

KEY_PREFIX = "dmk_"
ROLES = ("admin", "metrics", "read")
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


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """Seconds of ``"90s"``, ``"15m"``, ``"12h"``, ``"30d"``, ``"2w"`` (1 s to 10 years).

    Raises:
        ConfigError: anything else.

    Examples:
        >>> parse_duration("30d"), parse_duration("15m")
        (2592000.0, 900.0)
    """
    m = re.fullmatch(r"\s*(\d{1,6})\s*([smhdw])\s*", text)
    seconds = int(m.group(1)) * _UNITS[m.group(2)] if m else 0
    if not 1 <= seconds <= 3650 * 86400:
        raise ConfigError(
            f"expected a duration such as 90s, 15m, 12h, 30d or 2w (at most 10 years), got {text!r}"
        )
    return float(seconds)


@dataclass(frozen=True)
class KeyInfo:
    """A valid key: its id, role, the dataset ids/names it may use (``None``: all) and its
    expiry."""

    id: str
    role: str
    datasets: frozenset[str] | None = None
    expires: float | None = None


def create_key(
    journal: Journal,
    *,
    role: str = "read",
    note: str = "",
    datasets: list[str] | None = None,
    expires_in: float | None = None,
) -> tuple[str, str]:
    """Create a key; returns ``(key id, full key)``: the full key is shown once and never stored.

    Args:
        journal: the server's journal.
        role: ``"read"``, ``"admin"`` or ``"metrics"`` (``GET /metrics`` only). Defaults to
            ``"read"``.
        note: a note shown in listings. Defaults to ``""``.
        datasets: dataset names (or ids) the key may use. Defaults to ``None`` (all).
        expires_in: seconds until the key expires. Defaults to ``None`` (never).

    Raises:
        ConfigError: an unknown role, an empty or malformed dataset list.

    Examples:
        >>> import tempfile
        >>> key_id, key = create_key(Journal(tempfile.mkdtemp()), role="admin")
        >>> key.startswith("dmk_" + key_id + ".")
        True
    """
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    if datasets is not None:
        bad = [d for d in datasets if not re.fullmatch(ID_PATTERN, d)]
        if not datasets or bad:
            raise ConfigError(
                f"expected dataset names such as a,b (letters, digits, _ . -), got {datasets!r}"
            )
    key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    expires = None if expires_in is None else time.time() + float(expires_in)
    scope = sorted(set(datasets)) if datasets else None
    journal.add_key(key_id, _digest(secret), role, note, datasets=scope, expires=expires)
    return key_id, f"{KEY_PREFIX}{key_id}.{secret}"


class KeyStore:
    """The server's view of the keys (see the module docstring).

    Examples:
        >>> import tempfile
        >>> j = Journal(tempfile.mkdtemp()); _, key = create_key(j, role="read")
        >>> store = KeyStore(j)
        >>> store.check(key).role, store.check(key[:-1] + "A" if key[-1] != "A" else key[:-1] + "B")
        ('read', None)
    """

    def __init__(self, journal: Journal) -> None:
        self.journal = journal  # read through its reading connection: never behind a write's fsync
        self._lock = threading.Lock()
        self._version = -1
        self._keys: dict[str, tuple[str, KeyInfo]] = {}
        self._seen: set[tuple[str, int]] = set()

    def _refresh(self) -> None:
        with self._lock:
            version = int(self.journal.read("PRAGMA data_version")[0][0])
            if version == self._version:
                return
            rows = self.journal.read(
                "SELECT id, hash, role, datasets, expires FROM keys WHERE revoked IS NULL"
            )
            self._keys = {
                r[0]: (
                    r[1],
                    KeyInfo(
                        r[0], r[2], None if r[3] is None else frozenset(json.loads(r[3])), r[4]
                    ),
                )
                for r in rows
            }
            self._version = version

    def reload(self) -> None:
        """Reload now (after this process changed the keys)."""
        with self._lock:
            self._version = -1
        self._refresh()

    def check(self, key: str) -> KeyInfo | None:
        """A valid, unrevoked, unexpired key, else ``None`` (constant-time digest comparison)."""
        parsed = parse_key(key)
        self._refresh()
        if parsed is None:
            return None
        entry = self._keys.get(parsed[0])
        # compared even for an unknown id: the time taken does not say which ids exist
        ok = hmac.compare_digest(_digest(parsed[1]), entry[0] if entry else "0" * 64)
        return self.use(entry[1]) if ok and entry else None

    def by_id(self, key_id: str) -> KeyInfo | None:
        """A valid key by its id (the UI's sessions name their key), else ``None``."""
        self._refresh()
        entry = self._keys.get(key_id)
        return self.use(entry[1]) if entry else None

    def use(self, info: KeyInfo) -> KeyInfo | None:
        """``info`` unless it expired; records the key's first use of the day (one audit row)."""
        now = time.time()
        if info.expires is not None and now >= info.expires:
            return None
        day = int(now // 86400)
        if (info.id, day) not in self._seen:
            self.journal.note_use(info.id, day)
            self._seen.add((info.id, day))
        return info

    def count(self) -> int:
        """Keys that can still be used."""
        self._refresh()
        now = time.time()
        return sum(1 for _, i in self._keys.values() if i.expires is None or i.expires > now)

    def listing(self) -> list[dict[str, Any]]:
        """Every key without its digest."""
        return [{k: v for k, v in row.items() if k != "hash"} for row in self.journal.list_keys()]
