"""``/api/v1/health`` and ``/api/v1/openapi.json``: the two routes anyone may call."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from datamill.serve.http.access import State, requires

__all__ = ["router"]

router = APIRouter(prefix="/api/v1")


@router.get("/health", dependencies=[requires("public")])
async def health(state: State) -> dict[str, Any]:
    """Whether the server is up, and whether it wants keys (read from memory: answered in the event
    loop, not handed to a worker thread as a plain function would be)."""
    return {"ok": True, "boot": state.boot, "auth": state.auth}


@router.get("/openapi.json", dependencies=[requires("public")], include_in_schema=False)
def openapi(request: Request) -> dict[str, Any]:
    """The OpenAPI description of the JSON API."""
    schema: dict[str, Any] = request.app.openapi()
    return schema
