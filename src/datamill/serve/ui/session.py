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
from typing import Any

from fastapi import HTTPException, Request

from datamill.serve.access import Viewer

__all__ = ["COOKIE", "CSRF_FIELD", "check_csrf", "csrf_token", "session_viewer"]

COOKIE = "datamill_key"
CSRF_FIELD = "csrf"
_NO_AUTH = "no-auth"


def _secret(request: Request) -> bytes:
    secret: bytes = request.app.state.ui_secret
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


def session_viewer(request: Request, state: Any) -> Viewer | None:
    """The caller of a browser request (the key in the cookie), or the admin of a ``--no-auth`` server.

    ``state`` is the :class:`~datamill.serve.server.ServeState`, ``None`` on a ``--no-auth`` server.
    """
    if state is None:
        return Viewer("admin", "none", csrf_token(request, _NO_AUTH))
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
