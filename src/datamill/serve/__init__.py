"""``datamill serve``: one server feeding many training processes over HTTP, exactly once.

* the server: :func:`serve` (``datamill serve ROOT``), :func:`~datamill.serve.http.app.create_app`
(the
  FastAPI app; needs the ``serve`` extra), state in SQLite under its state folder;
* the client side (stdlib only): :class:`Client` (datasets, iterations, progress, keys) and
  :class:`RemoteLoader` (the Loader's batches over HTTP); the torch adapter is in
  :mod:`datamill.serve.torch`.

Importing this package imports neither fastapi nor torch.
"""

from __future__ import annotations

from typing import Any

from datamill.serve.client import Client, RemoteError
from datamill.serve.http.run import serve
from datamill.serve.remote import RemoteLoader

__all__ = ["Client", "RemoteError", "RemoteLoader", "create_app", "serve"]
assert sorted(__all__) == __all__


def __getattr__(name: str) -> Any:
    """``create_app`` is loaded on first use (it imports fastapi)."""
    if name == "create_app":
        from datamill.serve.http.app import create_app

        return create_app
    raise AttributeError(f"module 'datamill.serve' has no attribute {name!r}")
