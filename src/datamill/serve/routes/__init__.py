"""The JSON API of ``datamill serve`` as one FastAPI router per resource (imports fastapi).

Routes (under ``/api/v1``; every route declares its role with :func:`datamill.serve.access.requires`):

* ``GET /health`` (public) | ``GET/POST /datasets`` | ``GET/POST /keys``, ``DELETE /keys/{id}`` (admin)
* ``POST /iterations`` (idempotent by name or config) | ``GET /iterations/{id}`` | ``.../progress`` | ``.../done``
* ``GET /iterations/{id}/next?client=&rank=&slot=&slots=&ack=<lease>:<fence>`` -> ``200`` Arrow IPC stream
  (one record batch per batch; headers ``X-Datamill-Lease``, ``-Fence``, ``-Units``, ``-Positions``,
  ``-Epoch``, ``-Acks``), ``204`` nothing left for this client, ``409`` wait (others hold the rest)
* ``POST /iterations/{id}/ack`` (``410`` for a lease of an earlier server run, ``409`` when fenced)
* ``POST /iterations/{id}/heartbeat`` | ``POST /iterations/{id}/rewind`` | ``POST /iterations/{id}/cancel``
  (admin; afterwards ``next`` answers ``410``)
"""

from __future__ import annotations

from fastapi import APIRouter

__all__ = ["routers"]


def routers() -> list[APIRouter]:
    """Every router of the server, the web UI's included, in the order they are mounted."""
    from datamill.serve.routes import datasets, health, iterations, keys, leases
    from datamill.serve.ui.pages import root, router
    from datamill.serve.views import router as views

    return [health.router, datasets.router, views, keys.router, iterations.router, leases.router,
            router, root]
