"""``/api/v1/datasets``: list (read) and register (admin) datasets.

The dataset views (describe, column values, samples) are in :mod:`datamill.serve.data.views`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from datamill.serve.http.access import Admin, Reader, State, audit, check_dataset, may_use
from datamill.serve.http.routes.models import DatasetIn

__all__ = ["router"]

router = APIRouter(prefix="/api/v1/datasets")


@router.get("")
def datasets(who: Reader, state: State) -> list[dict[str, Any]]:
    """The registered datasets the caller's key may use."""
    return [ds for ds in state.datasets() if may_use(who, ds)]


@router.post("")
def register(who: Admin, body: DatasetIn, state: State) -> dict[str, Any]:
    """Register a dataset from a path under the server's roots."""
    if not may_use(who, {"id": "", "name": body.name}):
        raise HTTPException(403, f"this key may not use a dataset named {body.name!r}")
    ds = state.register(body.path, name=body.name, client_location=body.client_location)
    audit(state, who, "register dataset", f"{body.name} = {body.path}")
    return ds


@router.get("/{ref}/location")
def location(who: Reader, ref: str, state: State) -> dict[str, Any]:
    """Where clients read the dataset in direct mode (``400`` when registered without a client
    location), and the content identity a direct client checks its copy against."""
    ds = check_dataset(who, state, ref)
    loc = state.client_location(ds["id"])
    return {"dataset": ds["id"], "location": loc, "identity": state.client_identity(ds["id"])}
