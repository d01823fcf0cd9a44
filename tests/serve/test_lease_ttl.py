"""A lease's TTL and grace (issue #37): its holder stops yielding at the TTL, the server hands its
batches out again only a grace later, and counts them in ``/metrics``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from datamill.serve.protocol.iteration import Iteration
from datamill.serve.protocol.state import lease_grace
from datamill.serve.server import ServeState
from tests.serve._trips import next_lease

pytestmark = pytest.mark.server


def test_batches_are_not_handed_out_again_before_ttl_plus_grace() -> None:
    it = Iteration("i", [8], mode="dynamic", lease_size=4, lease_timeout=4.0, boot="b")
    t0 = 100.0
    lease = it.take("holder", now=t0)
    assert lease is not None and it.grace == lease_grace(4.0) == 1.0
    assert it.expire(t0 + 4.0 + 0.5) == 0  # past the TTL, within the grace: still the holder's
    other = it.take("other", now=t0)
    assert other is not None and not set(it.units_of(other)) & set(it.units_of(lease))
    assert it.expire(t0 + 4.0 + 1.0 + 0.01) == 2  # past TTL + grace: both back
    again = it.take("other", now=t0 + 5.02)
    assert again is not None and it.units_of(again) == it.units_of(lease)
    progress = it.progress(now=t0 + 5.02)
    assert it.redelivered == len(it.units_of(lease)) and progress["redelivered_batches"] == 4


@contextlib.contextmanager
def _dynamic(server: dict[str, Any], tmp_path: Path, lease_size: int) -> Iterator[Any]:
    """A server's state with one dynamic iteration of the test dataset: ``(state, iteration)``."""
    state = ServeState(tmp_path / "state", roots=[server["root"]], auth=False)
    try:
        state.register("ds", name="ds")
        req = {"dataset": "ds", "batch_size": 100, "mode": "dynamic", "lease_size": lease_size}
        yield state, state.iteration(state.create_iteration(req)["id"])
    finally:
        state.close()


def test_redelivered_batches_are_counted_for_metrics(
    server: dict[str, Any], tmp_path: Path
) -> None:
    with _dynamic(server, tmp_path, 3) as (state, it):
        first = next_lease(state, it, "a")
        assert first is not None
        it.expire(time.monotonic() + it.lease_timeout + it.grace + 1)
        second = next_lease(state, it, "b")
        assert second is not None and second.units == first.units
        assert state.telemetry.counter(it.id, "batches_redelivered") == 3
        assert state.telemetry.counter(it.id, "leases_reissued") == 1


def test_a_lease_whose_build_fails_still_settles_the_acks_it_carried(
    server: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the write (acks + the next lease) committed before the build failed: the acks count, the
    # error reaches the client, and the lease left unheld goes back to the queue at its expiry
    import asyncio

    from datamill.core.errors import BuildError
    from datamill.serve.data import workers

    with _dynamic(server, tmp_path, 2) as (state, it):
        first = next_lease(state, it, "a")
        assert first is not None

        def fails(*args: Any) -> bytes:
            raise BuildError("plan rank 0 of epoch 0, batches [2, 4): its build failed")

        monkeypatch.setattr(workers, "_lease_body", fails)
        acks = [(first.lease.id, first.lease.fence, None, None)]
        with pytest.raises(BuildError, match="its build failed"):
            asyncio.run(state.round_trip(it, "a", acks))
        assert it.done_count(0) == 2 and state.journal.done(it.id)  # acknowledged and journaled
        monkeypatch.undo()
        it.expire(time.monotonic() + it.lease_timeout + it.grace + 1)
        again = next_lease(state, it, "b")
        assert again is not None and not set(again.units) & set(first.units)
        assert state.telemetry.counter(it.id, "batches_redelivered") == 2  # the unheld lease's


def test_a_failed_build_is_answered_503_so_the_client_retries() -> None:
    import asyncio

    from datamill.core.errors import BuildError, DataFileError
    from datamill.serve.http.app import _on_datamill_error

    failed = asyncio.run(_on_datamill_error(None, BuildError("its build was stopped")))  # type: ignore[arg-type]
    bad = asyncio.run(_on_datamill_error(None, DataFileError("not Parquet", path="x")))  # type: ignore[arg-type]
    assert (failed.status_code, bad.status_code) == (503, 400)
    assert b"its build was stopped" in failed.body
