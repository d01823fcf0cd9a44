"""``GET /metrics``: Prometheus text format (a ``metrics`` or ``admin`` key; public with
``--metrics-no-auth``)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from datamill.serve.http.access import State, requires
from datamill.serve.observe.metrics import registry_for

__all__ = ["metrics_router"]


def metrics_router(*, public: bool = False) -> APIRouter:
    """The router of ``GET /metrics``; ``public`` (``--metrics-no-auth``, loopback only) drops the
    key check."""
    router = APIRouter()

    @router.get(
        "/metrics",
        dependencies=[requires("public" if public else "metrics")],
        include_in_schema=False,
    )
    def metrics(state: State) -> Response:
        """Every ``datamill_*`` metric, computed now (see :mod:`datamill.serve.observe.metrics`)."""
        return Response(generate_latest(registry_for(state)), media_type=CONTENT_TYPE_LATEST)

    return router
