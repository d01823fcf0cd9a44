"""Leases sized by bytes: a server-built iteration created without ``lease_size`` holds about
``lease_bytes`` of the dataset's rows per lease (the RemoteLoader's default), within 16-256
batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from datamill.client import Client, Leases, RemoteLoader, Transport
from datamill.client.options import LEASE_BYTES
from datamill.serve.catalog import LEASE_SIZES, auto_lease_size, row_bytes
from datamill.serve.server import ServeState
from datamill.shards import ShardsetDataset
from datamill.sources import open_source

pytestmark = pytest.mark.server


def _dataset(root: Path, name: str, n: int, width: int) -> None:
    """``n`` rows of a uid and ``width`` bytes of incompressible binary each."""
    rng = np.random.default_rng(5)
    blobs = [rng.bytes(width) for _ in range(n)]
    table = pa.table({"uid": np.arange(n, dtype=np.int64), "blob": pa.array(blobs, pa.binary())})
    ShardsetDataset.create(root / name, table, uid="uid", shardset="main", shard_size=n // 4)


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("leasebytes")
    _dataset(root, "small", 4000, 16)  # ~30 B per row stored
    _dataset(root, "large", 400, 4000)  # ~4 KB per row
    return root


@pytest.mark.parametrize(
    ("name", "batch", "want"),
    [("small", 32, LEASE_SIZES[1]), ("large", 32, None), ("large", 256, LEASE_SIZES[0])],
)
def test_lease_size_from_the_datasets_bytes_per_row(
    roots: Path, tmp_path: Path, name: str, batch: int, want: int | None
) -> None:
    row = row_bytes(open_source(roots / name))
    assert row is not None
    assert (20 < row < 60) if name == "small" else (3900 < row < 4300)
    st = ServeState(tmp_path / "state", roots=[roots], auth=False)
    try:
        st.register(name, name=name)
        made = st.create_iteration(
            {"dataset": name, "batch_size": batch, "lease_bytes": LEASE_BYTES}
        )
        size = made["config"]["lease_size"]
        assert size == auto_lease_size(LEASE_BYTES, batch, row)
        if want is not None:  # clamped at one end
            assert size == want
        else:  # ~8 MiB of ~4 KB rows in batches of 32: about 64 batches
            assert 60 <= size <= 68
        # an explicit lease_size wins; neither gives the server's default of 16
        given = {"dataset": name, "batch_size": batch, "lease_bytes": LEASE_BYTES, "name": "x"}
        assert st.create_iteration({**given, "lease_size": 7})["config"]["lease_size"] == 7
        plain = st.create_iteration({"dataset": name, "batch_size": batch, "name": "plain"})
        assert plain["config"]["lease_size"] == 16
    finally:
        st.close()


def test_auto_lease_size_stays_within_its_bounds() -> None:
    for batch in (1, 7, 256, 1 << 14, 1 << 18):
        for row in (None, 0.5, 90.0, 3000.0, 1e7):
            size = auto_lease_size(LEASE_BYTES, batch, row)
            assert LEASE_SIZES[0] <= size <= LEASE_SIZES[1]
            assert batch * size <= 1 << 22


def test_a_remote_loader_sizes_server_built_leases_by_bytes(server: dict[str, Any]) -> None:
    """RemoteLoader's default: server-built leases sized by bytes; direct mode keeps 64 batches."""
    loader = RemoteLoader(
        server["url"], server["read"], "ds", batch_size=16, leases=Leases(name="by-bytes")
    )
    assert sum(len(b["uid"]) for b in loader) > 0
    with Client(server["url"], server["admin"]) as c:
        cfg = c.http.request("GET", f"/api/v1/iterations/{loader.iteration_id}").json()["config"]
    source = open_source(server["root"] / "ds")
    assert cfg["lease_size"] == auto_lease_size(LEASE_BYTES, 16, row_bytes(source))
    assert loader.leases.nbytes == LEASE_BYTES
    direct = RemoteLoader(
        server["url"], server["read"], "ds", batch_size=16, transport=Transport("direct")
    )
    assert direct.leases.size == 64 and direct.leases.nbytes is None
