"""The JSON API of ``datamill serve`` as one FastAPI router per resource (imports fastapi).

Routes (under ``/api/v1``; every route declares its role with
:func:`datamill.serve.http.access.requires`):

* ``GET /health`` (public) | ``GET/POST /datasets`` | ``GET/POST /keys``, ``DELETE /keys/{id}``
  (admin)
* ``POST /iterations`` (idempotent by name or config) | ``GET /iterations/{id}`` | ``.../progress``
  | ``.../done``
* ``GET /iterations/{id}/next``, ``POST .../ack``, ``POST .../heartbeat``: leases, per-batch acks
  and reclaims, bound to the client's session (:mod:`datamill.serve.http.delivery` has the protocol)
* ``GET /iterations/{id}/trace``: the iteration's run record (``datamill trace``); ``GET
  /runs/{name}/trace``: the records of a run's iterations (one per epoch)
* ``POST /iterations/{id}/rewind`` | ``POST /iterations/{id}/cancel``
  (admin; afterwards ``next`` answers ``410``)
"""

from __future__ import annotations

__all__: list[str] = []  # the routers are mounted by :func:`datamill.serve.http.app.create_app`
