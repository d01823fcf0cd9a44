"""Browser sessions of the web UI: a random session id in a cookie (the journal keeps its sha256),
CSRF tokens on every form, the login form's bound to a short-lived cookie; ``docs/serving.md``
(*Browser security*) states the rules.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from typing import Any

from fastapi import HTTPException, Request, Response

from datamill.serve.http.viewer import Viewer

__all__ = [
    "COOKIE",
    "CSRF_FIELD",
    "LOGIN_COOKIE",
    "SESSION_TTL",
    "check_csrf",
    "check_login_csrf",
    "csrf_token",
    "end_session",
    "login_form_token",
    "session_viewer",
    "set_login_cookie",
    "start_session",
]

COOKIE = "datamill_session"
LOGIN_COOKIE = "datamill_login"
CSRF_FIELD = "csrf"
SESSION_TTL = 12 * 3600.0
"""Seconds a UI session lives (less when its key expires sooner)."""
_NO_AUTH = b"no-auth"


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "replace")).hexdigest()


def csrf_token(secret: str | bytes, purpose: str = "csrf") -> str:
    """The CSRF token of a session id (or of another secret) for ``purpose``.

    Examples:
        >>> csrf_token("s1") == csrf_token("s1") != csrf_token("s2")
        True
    """
    raw = secret if isinstance(secret, bytes) else secret.encode("utf-8", "replace")
    return hmac.new(raw, purpose.encode(), hashlib.sha256).hexdigest()[:40]


def _cookie(res: Response, request: Request, name: str, value: str, age: int, path: str) -> None:
    secure = request.url.scheme == "https"
    res.set_cookie(name, value, age, path=path, secure=secure, httponly=True, samesite="strict")


def session_viewer(request: Request, state: Any) -> Viewer | None:
    """The caller of a browser request (its session), or the admin of a ``--no-auth`` server.

    ``state`` is the :class:`~datamill.serve.server.ServeState`, ``None`` on a ``--no-auth`` server.
    """
    if state is None:  # the same viewer for every request (computed once: the lease path's cost)
        viewer: Viewer | None = getattr(request.app.state, "no_auth_viewer", None)
        if viewer is None:
            viewer = Viewer("admin", "none", csrf_token(request.app.state.ui_secret + _NO_AUTH))
            request.app.state.no_auth_viewer = viewer
        return viewer
    sid = request.cookies.get(COOKIE)
    if not sid or len(sid) > 128:
        return None
    key_id = state.journal.session_key(_digest(sid))
    info = None if key_id is None else state.keys.by_id(key_id)
    if info is None:
        return None
    return Viewer(info.role, "cookie", csrf_token(sid), info.id, info.datasets)


def start_session(request: Request, res: Response, state: Any, key: str) -> bool:
    """Check ``key``; when valid, store a new session and set its cookie on ``res``."""
    info = state.keys.check(key)
    if info is None:
        return False
    expires = float("inf") if info.expires is None else info.expires
    ttl = max(1.0, min(SESSION_TTL, expires - time.time()))
    sid = secrets.token_urlsafe(32)
    state.journal.add_session(_digest(sid), info.id, expires=time.time() + ttl)
    _cookie(res, request, COOKIE, sid, int(ttl), "/")
    res.delete_cookie(LOGIN_COOKIE, path="/ui/login")
    return True


def end_session(request: Request, res: Response, state: Any) -> None:
    """Revoke the request's session (if any) and clear its cookie."""
    sid = request.cookies.get(COOKIE)
    if sid and state is not None:
        state.journal.end_session(_digest(sid))
    res.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")


def login_form_token(request: Request) -> tuple[str, str]:
    """``(cookie value, form token)`` of a login form: the current ``datamill_login`` cookie or a
    new one."""
    seed = request.cookies.get(LOGIN_COOKIE)
    if not seed or len(seed) > 128:
        seed = secrets.token_urlsafe(24)
    return seed, csrf_token(seed, "login")


def set_login_cookie(request: Request, res: Response, seed: str) -> None:
    """Bind a login form to this browser (the cookie its token is derived from)."""
    _cookie(res, request, LOGIN_COOKIE, seed, 3600, "/ui/login")


def _same(sent: str, expected: str) -> bool:
    # bytes: compare_digest refuses a non-ASCII str with a TypeError (a 500 before this)
    return hmac.compare_digest(sent.encode("utf-8", "replace"), expected.encode("utf-8", "replace"))


def check_login_csrf(request: Request, form: dict[str, str]) -> None:
    """Refuse (403) a login form that did not come from this server's login page."""
    seed = request.cookies.get(LOGIN_COOKIE, "")
    sent = form.get(CSRF_FIELD, "")
    if not seed or not sent or not _same(sent, csrf_token(seed, "login")):
        msg = "missing or wrong CSRF token on the login form: reload the login page and try again"
        raise HTTPException(403, msg)


def check_csrf(who: Viewer, form: dict[str, str]) -> None:
    """Refuse (403) a cookie- or no-auth-session form without the right token.

    Examples:
        >>> check_csrf(Viewer("admin", "cookie", "t0k"), {"csrf": "t0k"})
        >>> check_csrf(Viewer("admin", "cookie", "t0k"), {})  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        fastapi.exceptions.HTTPException: 403: missing or wrong CSRF token: reload the page and
        submit the form again
    """
    if who.via == "bearer":
        return
    sent = form.get(CSRF_FIELD, "")
    if not sent or not _same(sent, who.csrf):
        msg = "missing or wrong CSRF token: reload the page and submit the form again"
        raise HTTPException(403, msg)
