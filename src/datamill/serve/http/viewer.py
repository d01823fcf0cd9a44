"""The authenticated caller of a request (:class:`Viewer`), shared by the API's access checks and
the UI's sessions."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Viewer"]


@dataclass(frozen=True)
class Viewer:
    """An authenticated caller.

    ``role`` is ``"read"`` or ``"admin"``; ``via`` is ``"bearer"``, ``"cookie"`` or ``"none"`` (a
    ``--no-auth`` server); ``key_id`` names the key (``None`` without auth); ``datasets`` the
    dataset ids and names it may use (``None``: all); ``csrf`` the token its forms carry (empty for
    bearer).
    """

    role: str
    via: str
    csrf: str = ""
    key_id: str | None = None
    datasets: frozenset[str] | None = None

    @property
    def admin(self) -> bool:
        """Whether the caller may manage keys, register datasets, rewind and cancel iterations."""
        return self.role == "admin"
