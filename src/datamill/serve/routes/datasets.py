"""``/api/v1/datasets``: list (read) and register (admin) datasets.

The dataset views (describe, column values, samples) are in :mod:`datamill.serve.views`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from datamill.serve.access import State, requires
from datamill.serve.routes.models import DatasetIn

__all__ = ["router"]

router = APIRouter(prefix="/api/v1/datasets")


@router.get("", dependencies=[requires("read")])
def datasets(state: State) -> list[dict[str, Any]]:
    """Every registered dataset."""
    return state.datasets()


@router.post("", dependencies=[requires("admin")])
def register(body: DatasetIn, state: State) -> dict[str, Any]:
    """Register a dataset from a path under the server's roots."""
    return state.register(body.path, name=body.name)
