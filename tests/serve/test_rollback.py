"""Rollback to a checkpoint in dynamic mode (issue #37 point 4): a loop that restores a
``state_dict()`` saved K steps ago is served again exactly the batches it consumed after it; a state
the server cannot honour is refused with a located error."""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from datamill.client import RemoteLoader
from datamill.core.errors import ResumeStateError
from datamill.serve.server import ServeState
from tests.serve._opts import grouped

from .conftest import N

pytestmark = pytest.mark.server


def test_a_dynamic_loader_restored_from_a_checkpoint_replays_what_it_consumed_after(
    server: dict[str, Any],
) -> None:
    kw: dict[str, Any] = {
        "batch_size": 64,
        "seed": 4,
        "mode": "dynamic",
        "name": "rollback",
        "lease_size": 4,
        "collate": "arrow",
    }
    first = RemoteLoader(server["url"], server["read"], "ds", **grouped(**kw))
    batches = iter(first)
    seen: list[tuple[int, ...]] = []
    state = None
    for step in range(17):  # checkpoint at 10, crash at 17
        seen.append(tuple(next(batches).column("uid").to_pylist()))
        if step == 9:
            state = first.state_dict()
    batches.close()  # type: ignore[attr-defined]  # the crash (its last acks may land)
    assert state is not None and state["consumed"] == 10
    restored = RemoteLoader(server["url"], server["read"], "ds", **grouped(**kw))
    restored.load_state_dict(state)
    again = [tuple(b.column("uid").to_pylist()) for b in restored]
    every = Counter(seen[:10] + again)  # what the restored model trained on
    assert max(every.values()) == 1 and {u for b in every for u in b} == set(range(N))
    assert set(seen[10:]) <= set(again)  # the 7 batches after the checkpoint came back


def test_a_session_the_journal_never_saw_is_refused(server: dict[str, Any], tmp_path: Path) -> None:
    state = ServeState(tmp_path / "state", roots=[server["root"]], auth=False)
    try:
        state.register("ds", name="ds")
        req = {"dataset": "ds", "batch_size": 100, "mode": "dynamic", "lease_size": 2}
        it = state.iteration(state.create_iteration(req)["id"])
        with pytest.raises(ResumeStateError, match="no record of the saved session"):
            asyncio.run(state.rollback(it, session=secrets.token_hex(16), consumed=3))
        back = asyncio.run(state.rollback(it, session=secrets.token_hex(16), consumed=0))
        assert back["rolled_back"] == 0
    finally:
        state.close()
