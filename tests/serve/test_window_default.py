"""An iteration created without a shuffle window is given the dataset's default (the byte-bounded
rule of :func:`~datamill.loader.order.default_window`) when it is created, so every build worker
and direct client plans the in-process Loader's order; joiners and resumes keep the window of the
iteration they join or resume, and an iteration journaled before windows were fixed at creation
(``window: None``) keeps the rule of its time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from datamill.loader import Batching, Loader
from datamill.loader import order as order_mod
from datamill.loader.order import default_window
from datamill.loader.runs import service_for
from datamill.serve.catalog import ConflictError
from datamill.serve.server import ServeState
from datamill.shards import ShardsetDataset

pytestmark = pytest.mark.server


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """12 shards of 40 rows of 4 KB incompressible bytes; five shards' files a default window."""
    rng = np.random.default_rng(4)
    n = 480
    blobs = pa.array([rng.bytes(4000) for _ in range(n)], pa.binary())
    table = pa.table({"uid": np.arange(n, dtype=np.int64), "blob": blobs})
    ds = ShardsetDataset.create(
        tmp_path / "data" / "wide", table, uid="uid", shardset="main", shard_size=40
    )
    monkeypatch.setattr(order_mod, "DEFAULT_WINDOW_BYTES", int(ds.shard_nbytes().mean() * 5.5))
    return tmp_path / "data"


def test_an_iteration_fixes_the_default_window_when_it_is_created(
    root: Path, tmp_path: Path
) -> None:
    ds = ShardsetDataset(root / "wide")
    want = default_window(ds.shard_sizes(), ds.shard_nbytes())
    assert want == 5 != default_window(ds.shard_sizes())
    st = ServeState(tmp_path / "state", roots=[root], auth=False)
    try:
        st.register("wide", name="wide")
        req = {"dataset": "wide", "batch_size": 16, "name": "a", "seed": 2}
        made = st.create_iteration(req)
        assert made["config"]["window"] == want
        # the server's plan is the in-process Loader's (default window on both sides)
        it = st.iteration(made["id"])
        local = Loader(ds, 16, seed=2)
        assert local.service.window == want
        served = st.service(it.config).plan(0, 0, 1)
        assert np.array_equal(served.seq, local.plan(0).seq)
        by_samples = Batching(window=default_window(ds.shard_sizes()))
        assert not np.array_equal(
            served.seq, Loader(ds, 16, seed=2, batching=by_samples).plan(0).seq
        )
        # a joiner that leaves the window to the default joins; another window is a conflict
        assert st.create_iteration(req)["id"] == made["id"]
        with pytest.raises(ConflictError, match="window"):
            st.create_iteration({**req, "window": 2})
        # a resume without a window keeps its predecessor's, given or not
        given = st.create_iteration({**req, "name": "b", "window": 3})
        resumed = st.create_iteration({**req, "name": "c", "resume_from": given["id"]})
        assert resumed["config"]["window"] == 3
        # an iteration journaled before windows were fixed at creation has none: a joiner without
        # a window joins it, and a resume of it keeps none (so plans with the samples rule)
        old = st.iteration(st.create_iteration({**req, "name": "old"})["id"])
        old.config["window"] = None
        assert st.create_iteration({**req, "name": "old"})["id"] == old.id
        again = st.create_iteration({**req, "name": "d", "resume_from": old.id})
        assert again["config"]["window"] is None
        assert st.service(st.iteration(again["id"]).config).window == default_window(
            ds.shard_sizes()
        )
    finally:
        st.close()


def test_a_resume_from_loader_states_takes_their_window(root: Path, tmp_path: Path) -> None:
    ds = ShardsetDataset(root / "wide")
    local = Loader(ds, 16, seed=2, batching=Batching(window=12))
    it = iter(local)
    for _ in range(5):
        next(it)
    st = ServeState(tmp_path / "state", roots=[root], auth=False)
    try:
        st.register("wide", name="wide")
        req = {"dataset": "wide", "batch_size": 16, "seed": 2, "name": "from-states"}
        made = st.create_iteration({**req, "loader_states": [local.state_dict()]})
        assert made["config"]["window"] == 12
        assert st.iteration(made["id"]).config["base_done"] == [(0, 5)]  # the 5 batches seen
    finally:
        st.close()


def test_an_iteration_journaled_without_a_window_keeps_the_samples_rule(root: Path) -> None:
    ds = ShardsetDataset(root / "wide")
    cfg = {"dataset": "x", "batch_size": 16, "seed": 0, "shuffle": True, "columns": None,
           "drop_last": False, "window": None, "plan_world": 1}  # fmt: skip
    svc = service_for(ds, cfg)
    assert (
        svc.window
        == default_window(ds.shard_sizes())
        != default_window(ds.shard_sizes(), ds.shard_nbytes())
    )
