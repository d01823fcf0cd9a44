"""Who is asking: the API key from the ``datamill_key`` cookie (HttpOnly, SameSite=Strict) or a Bearer header.

A browser logs in once (``POST /ui/login``); the key then lives in a cookie that scripts cannot read
and that other sites' pages cannot send. Every state-changing form also carries a CSRF token: an
HMAC of the key under a per-process secret, so a forged form from elsewhere (which knows neither)
is refused with 403. A request authenticated by an ``Authorization: Bearer`` header needs no token
(a browser never adds that header on its own).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, Request

__all__ = ["COOKIE", "CSRF_FIELD", "Viewer", "check_csrf", "csrf_token", "viewer"]

COOKIE = "datamill_key"
CSRF_FIELD = "csrf"
_NO_AUTH = "no-auth"


@dataclass(frozen=True)
class Viewer:
    """An authenticated caller: ``role`` (``"read"`` or ``"admin"``), how it came, its CSRF token."""

    role: str
    via: str  # "cookie", "bearer" or "none" (a --no-auth server)
    csrf: str

    @property
    def admin(self) -> bool:
        """Whether the caller may manage keys, register datasets and rewind iterations."""
        return self.role == "admin"


def _secret(request: Request) -> bytes:
    app_state = request.app.state
    secret: bytes | None = getattr(app_state, "ui_secret", None)
    if secret is None:
        secret = app_state.ui_secret = secrets.token_bytes(32)
    return secret


def csrf_token(request: Request, key: str) -> str:
    """The CSRF token of ``key`` under this server process's secret.

    Examples:
        >>> from types import SimpleNamespace
        >>> req = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(ui_secret=b"s" * 32)))
        >>> csrf_token(req, "dmk_a.b") == csrf_token(req, "dmk_a.b") != csrf_token(req, "dmk_a.c")
        True
    """
    return hmac.new(_secret(request), key.encode("utf-8"), hashlib.sha256).hexdigest()[:40]


def viewer(request: Request) -> Viewer | None:
    """The caller of ``request``, or ``None`` without a valid, unrevoked key."""
    state: Any = request.app.state.serve
    if not state.auth:
        return Viewer("admin", "none", csrf_token(request, _NO_AUTH))
    header = request.headers.get("authorization", "")
    if header.startswith("Bearer "):
        role = state.keys.check(header[len("Bearer "):].strip())
        return None if role is None else Viewer(role, "bearer", "")
    key = request.cookies.get(COOKIE)
    if not key:
        return None
    role = state.keys.check(key)
    return None if role is None else Viewer(role, "cookie", csrf_token(request, key))


def check_csrf(who: Viewer, form: dict[str, str]) -> None:
    """Refuse (403) a cookie- or no-auth-session form without the right token.

    Examples:
        >>> check_csrf(Viewer("admin", "cookie", "t0k"), {"csrf": "t0k"})
        >>> check_csrf(Viewer("admin", "cookie", "t0k"), {})
        Traceback (most recent call last):
        ...
        fastapi.exceptions.HTTPException: 403: missing or wrong CSRF token: reload the page and submit the form again
    """
    if who.via == "bearer":
        return
    sent = form.get(CSRF_FIELD, "")
    if not sent or not hmac.compare_digest(sent, who.csrf):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and submit the form again")
