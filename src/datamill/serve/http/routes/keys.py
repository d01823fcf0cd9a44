"""``/api/v1/keys``: list, create and revoke API keys (admin)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from datamill.serve.http.access import Admin, State, audit
from datamill.serve.http.auth import create_key, parse_duration
from datamill.serve.http.key_scope import check_create, check_revoke, visible_keys
from datamill.serve.http.routes.models import KeyIn
from datamill.serve.server import NotFoundError

__all__ = ["router"]

router = APIRouter(prefix="/api/v1/keys")


@router.get("")
def keys(who: Admin, state: State) -> list[dict[str, Any]]:
    """Every key (revoked ones too) within the caller's scope, without secrets."""
    return visible_keys(state, who)


@router.post("")
def new_key(who: Admin, body: KeyIn, state: State) -> dict[str, Any]:
    """Create a key; the answer holds the full key, shown this once."""
    expires_in = parse_duration(body.expires) if body.expires else None
    check_create(state, who, role=body.role, datasets=body.datasets, expires_in=expires_in)
    key_id, key = create_key(
        state.journal, role=body.role, note=body.note, datasets=body.datasets, expires_in=expires_in
    )
    state.keys.reload()
    audit(
        state,
        who,
        "create key",
        f"{key_id} role={body.role} datasets={body.datasets} expires={body.expires}",
    )
    return {"id": key_id, "key": key, "role": body.role}


@router.delete("/{key_id}")
def revoke(
    who: Admin, key_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9]{1,32}$")], state: State
) -> dict[str, Any]:
    """Revoke a key and its UI sessions (refused from the next request on)."""
    check_revoke(state, who, key_id)
    if not state.journal.revoke_key(key_id):
        raise NotFoundError(f"no live key {key_id!r}")
    state.keys.reload()
    audit(state, who, "revoke key", key_id)
    return {"revoked": key_id}
