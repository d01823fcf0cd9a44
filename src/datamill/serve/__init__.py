"""``datamill serve``: one server feeding many training processes over HTTP, exactly once.

:func:`serve` (``datamill serve ROOT``) and :func:`~datamill.serve.http.app.create_app` (the
FastAPI app; needs the ``serve`` extra), state in SQLite under its state folder, in folders by
layer: ``protocol/`` (the lease state machine), ``journal/``, ``http/`` (routes, auth, bounds),
``data/`` (build workers, direct mode), ``observe/`` and ``ui/``.

The client side (:class:`~datamill.client.Client`, :class:`~datamill.client.RemoteLoader`, the
torch adapter) is the package :mod:`datamill.client`.

Importing this package imports neither fastapi nor torch.
"""

from __future__ import annotations

from typing import Any

from datamill.serve.http.run import serve

__all__ = ["create_app", "serve"]
assert sorted(__all__) == __all__


def __getattr__(name: str) -> Any:
    """``create_app`` is loaded on first use (it imports fastapi)."""
    if name == "create_app":
        from datamill.serve.http.app import create_app

        return create_app
    raise AttributeError(f"module 'datamill.serve' has no attribute {name!r}")
