"""After a server is killed and its journal replayed, the UI's counts, ``/metrics`` and the journal
agree to the unit (issue #37): they are folds of the same records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from datamill.serve.journal.schema import unlock_state
from datamill.serve.observe import ledger
from datamill.serve.observe.metrics import JournalCollector
from datamill.serve.server import ServeState
from tests.serve._trips import ack_batches, next_lease

pytestmark = pytest.mark.server


def _metrics(state: ServeState, it_id: str) -> dict[str, float]:
    out = {}
    for fam in JournalCollector(state).collect():
        for s in fam.samples:
            if s.labels.get("iteration") == it_id and s.labels.get("state", "done") == "done":
                out[s.name] = s.value
    return out


def _acks(state: ServeState, it: Any, payload: Any, client: str, batches: int) -> None:
    lease = payload.lease
    for pos in range(lease.start, min(lease.stop, lease.start + batches)):
        ack_batches(state, it, [(lease.id, lease.fence, pos, pos + 1)], client=client)


def test_ui_metrics_and_journal_agree_after_a_kill_and_replay(
    server: dict[str, Any], tmp_path: Path
) -> None:
    state = ServeState(tmp_path / "state", roots=[server["root"]], auth=False)
    state.register("ds", name="ds")
    req = {"dataset": "ds", "batch_size": 100, "mode": "dynamic", "lease_size": 4, "name": "agree"}
    it = state.iteration(state.create_iteration(req)["id"])
    held = {}
    for k, n in enumerate((4, 3, 1)):
        p = next_lease(state, it, f"c{k}")
        assert p is not None
        _acks(state, it, p, f"c{k}", n)
        held[f"c{k}"] = p
    # kill -9: no close(); memory and the counters not yet flushed are lost, the OS frees the lock
    unlock_state(state.journal._held)
    state.journal._held = None
    again = ServeState(tmp_path / "state", roots=[server["root"]], auth=False)
    try:
        it2 = again.iteration("agree")
        p = held["c1"]  # its holder reclaims its lease and acknowledges the rest
        ack_batches(again, it2, [(p.lease.id, p.lease.fence, None, None)], client="c1")
        journal = sum(b - a for a, b in again.journal.done_runs(it2.id))
        m = _metrics(again, it2.id)
        ui = ledger.clients(again.journal, it2.id, live=it2)
        assert journal == 4 + 4 + 1
        assert m["datamill_units_acknowledged_total"] == journal
        assert m["datamill_iteration_units"] == again.progress(it2)["done"] == journal
        assert {c: v["batches"] for c, v in ui.items()} == {"c0": 4, "c1": 4, "c2": 1}
    finally:
        again.close()
