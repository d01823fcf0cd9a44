"""The request bodies of the JSON API: pydantic models that forbid unknown fields and bound every
value."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field, model_validator

from datamill.core.wire import FENCE_PATTERN, ID_PATTERN, SESSION_PATTERN

__all__ = [
    "ID_PATTERN",
    "MAX_UNITS",
    "AckIn",
    "DatasetIn",
    "HeartbeatIn",
    "ItId",
    "IterationIn",
    "KeyIn",
    "ResumeIn",
    "RewindIn",
    "one_line",
]

MAX_UNITS = 1 << 40
"""Largest unit (batch) number or count a request may name."""
ItId = Annotated[str, Path(pattern=ID_PATTERN)]
Id = Annotated[str, Field(pattern=ID_PATTERN)]
Unit = Annotated[int, Field(ge=0, le=MAX_UNITS)]
Fence = Annotated[str, Field(pattern=FENCE_PATTERN)]
Seconds = Annotated[float, Field(ge=1, le=86_400, allow_inf_nan=False)]


def _no_nul(value: Any, depth: int = 0) -> None:
    if depth > 32:
        raise ValueError("expected JSON nested at most 32 levels deep")
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("expected strings without NUL bytes (\\u0000)")
    elif isinstance(value, dict):
        for k, v in value.items():
            _no_nul(k, depth + 1)
            _no_nul(v, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _no_nul(v, depth + 1)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _strings(cls, data: Any) -> Any:
        _no_nul(data)
        return data


class DatasetIn(_Body):
    """``POST /datasets``: a path under the server's roots and the name to register it as."""

    path: str = Field(min_length=1, max_length=4096)
    name: str = Field(pattern=ID_PATTERN)
    client_location: str | None = Field(default=None, min_length=1, max_length=4096)


class KeyIn(_Body):
    """``POST /keys``: the new key's role and note."""

    role: Literal["read", "admin", "metrics"] = "read"
    note: str = Field("", max_length=200)
    datasets: list[Id] | None = Field(None, min_length=1, max_length=1000)
    expires: str | None = Field(None, pattern=r"^\d{1,6}[smhdw]$")


class IterationIn(_Body):
    """``POST /iterations``: a loader configuration (see :meth:`ServeState.create_iteration`)."""

    dataset: str = Field(pattern=ID_PATTERN)
    batch_size: int = Field(ge=1, le=1 << 20)
    seed: int = Field(0, ge=0, le=2**63 - 1)
    epoch: int = Field(0, ge=0, le=1 << 30)
    shuffle: bool = True
    columns: list[Annotated[str, Field(min_length=1, max_length=1000)]] | None = Field(
        None, max_length=10_000
    )
    drop_last: bool = False
    window: int | None = Field(None, ge=1, le=1 << 16)
    mode: Literal["static", "dynamic"] = "static"
    world_size: int = Field(1, ge=1, le=1 << 16)
    name: str | None = Field(None, pattern=ID_PATTERN)
    lease_size: int | None = Field(None, ge=1, le=4096)
    lease_bytes: int | None = Field(None, ge=1 << 10, le=1 << 30)
    lease_timeout: Seconds | None = None
    resume_from: str | None = Field(None, pattern=ID_PATTERN)
    loader_states: list[dict[str, Any]] | None = Field(None, max_length=1 << 16)


class AckIn(_Body):
    """``POST /iterations/{id}/ack``: consumed batches ``[lease, fence, start, stop]`` (queue
    positions) of a client, or whole leases ``[lease, fence]``."""

    client: str = Field(pattern=ID_PATTERN)
    leases: list[tuple[Id, Fence]] = Field(default_factory=list, max_length=1024)
    acks: list[tuple[Id, Fence, Unit, Unit]] = Field(default_factory=list, max_length=1024)


class HeartbeatIn(_Body):
    """``POST /iterations/{id}/heartbeat``: the ``[lease, fence]`` a client holds (reclaimed after a
    restart), and its stall statistics."""

    client: str = Field(pattern=ID_PATTERN)
    leases: list[tuple[Id, Fence]] = Field(default_factory=list, max_length=1024)
    stall_s: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False)
    batches: Unit | None = None


class RewindIn(_Body):
    """``POST /iterations/{id}/rewind``: ``{rank, consumed}`` or ``{done: [[start, stop],
    ...]}``."""

    rank: int | None = Field(None, ge=0, le=1 << 16)
    consumed: Unit | None = None
    done: list[tuple[Unit, Unit]] | None = Field(None, max_length=1 << 16)


class ResumeIn(_Body):
    """``POST /iterations/{id}/resume``: one rank of a static iteration back to a checkpoint; with
    ``session`` (the saved state's), a dynamic client's checkpoint: what that session consumed after
    its first ``consumed`` batches is served again."""

    rank: int = Field(ge=0, le=1 << 16)
    consumed: Unit
    session: str | None = Field(None, pattern=SESSION_PATTERN)


def one_line(errors: Any) -> str:
    """Validation errors (pydantic's ``errors()``) as one line: where, what was expected, what came.

    Examples:
        >>> one_line([{"loc": ("body", "ttl"), "msg": "Input should be finite", "input": "NaN"}])
        "body.ttl: Input should be finite (got 'NaN')"
    """
    parts = []
    for err in list(errors)[:3]:
        loc = ".".join(str(x) for x in err.get("loc", ()))
        got = repr(err.get("input"))
        got = f" (got {got if len(got) <= 60 else got[:57] + '...'})" if "input" in err else ""
        parts.append(f"{loc}: {err.get('msg', 'invalid')}{got}")
    more = len(list(errors)) - 3
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
