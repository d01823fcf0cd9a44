"""``/api/v1/keys``: list, create and revoke API keys (admin)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from datamill.serve.access import State, requires
from datamill.serve.auth import create_key
from datamill.serve.routes.models import KeyIn
from datamill.serve.server import NotFoundError

__all__ = ["router"]

router = APIRouter(prefix="/api/v1/keys")


@router.get("", dependencies=[requires("admin")])
def keys(state: State) -> list[dict[str, Any]]:
    """Every key (revoked ones too), without secrets."""
    return state.keys.listing()


@router.post("", dependencies=[requires("admin")])
def new_key(body: KeyIn, state: State) -> dict[str, Any]:
    """Create a key; the answer holds the full key, shown this once."""
    key_id, key = create_key(state.journal, role=body.role, note=body.note)
    state.keys.reload()
    return {"id": key_id, "key": key, "role": body.role}


@router.delete("/{key_id}", dependencies=[requires("admin")])
def revoke(key_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9]{1,32}$")], state: State) -> dict[str, Any]:
    """Revoke a key (it is refused from the next request on)."""
    if not state.journal.revoke_key(key_id):
        raise NotFoundError(f"no live key {key_id!r}")
    state.keys.reload()
    return {"revoked": key_id}
