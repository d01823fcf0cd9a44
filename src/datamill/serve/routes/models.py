"""The request bodies of the JSON API: pydantic models that forbid unknown fields and bound every value."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ID_PATTERN", "AckIn", "DatasetIn", "HeartbeatIn", "ItId", "IterationIn", "KeyIn", "RewindIn"]

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
ItId = Annotated[str, Path(pattern=ID_PATTERN)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetIn(_Body):
    """``POST /datasets``: a path under the server's roots and the name to register it as."""

    path: str = Field(min_length=1, max_length=4096)
    name: str = Field(pattern=ID_PATTERN)


class KeyIn(_Body):
    """``POST /keys``: the new key's role and note."""

    role: Literal["read", "admin"] = "read"
    note: str = Field("", max_length=200)


class IterationIn(_Body):
    """``POST /iterations``: a loader configuration (see :meth:`ServeState.create_iteration`)."""

    dataset: str = Field(pattern=ID_PATTERN)
    batch_size: int = Field(ge=1, le=1 << 20)
    seed: int = Field(0, ge=0, le=2**63 - 1)
    epoch: int = Field(0, ge=0, le=1 << 30)
    shuffle: bool = True
    columns: list[str] | None = Field(None, max_length=10_000)
    drop_last: bool = False
    window: int | None = Field(None, ge=1)
    mode: Literal["static", "dynamic"] = "static"
    world_size: int = Field(1, ge=1, le=1 << 16)
    name: str | None = Field(None, pattern=ID_PATTERN)
    lease_size: int = Field(16, ge=1, le=4096)
    lease_timeout: float | None = Field(None, gt=0, le=86_400)
    resume_from: str | None = Field(None, pattern=ID_PATTERN)
    loader_states: list[dict[str, Any]] | None = Field(None, max_length=1 << 16)


class AckIn(_Body):
    """``POST /iterations/{id}/ack``: ``(lease, fence)`` pairs of a client."""

    client: str = Field(pattern=ID_PATTERN)
    leases: list[tuple[str, int]] = Field(max_length=1024)


class HeartbeatIn(_Body):
    """``POST /iterations/{id}/heartbeat``: the leases a client still holds, and its stall statistics."""

    client: str = Field(pattern=ID_PATTERN)
    leases: list[str] = Field(default_factory=list, max_length=1024)
    stall_s: float | None = Field(None, ge=0)
    batches: int | None = Field(None, ge=0)


class RewindIn(_Body):
    """``POST /iterations/{id}/rewind``: ``{rank, consumed}`` or ``{done: [[start, stop], ...]}``."""

    rank: int | None = Field(None, ge=0)
    consumed: int | None = Field(None, ge=0)
    done: list[tuple[int, int]] | None = None
