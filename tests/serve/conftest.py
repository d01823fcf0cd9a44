"""One server for the whole ``tests/serve`` package (a subprocess on a free loopback port)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from datamill.client import Client
from datamill.shards.dataset import ShardsetDataset
from tests.serve._proc import free_port, make_key, start_server, stop

N = 6000


def _table(n: int) -> pa.Table:
    rng = np.random.default_rng(7)
    return pa.table(
        {
            "uid": np.arange(n, dtype=np.int64),
            "x": rng.normal(size=n).astype(np.float32),
            "ids": pa.array([list(range(i % 7)) for i in range(n)], type=pa.list_(pa.int32())),
            "label": pa.array([f"c{i % 3}" for i in range(n)]),
        }
    )


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("serve")
    root = base / "root"
    ShardsetDataset.create(root / "ds", _table(N), uid="uid", shardset="main", shard_size=500)
    (base / "outside").mkdir()
    ShardsetDataset.create(
        base / "outside" / "secret", _table(100), uid="uid", shardset="main", shard_size=50
    )
    (root / "escape").symlink_to(base / "outside" / "secret")
    state = base / "state"
    admin = make_key(state, "admin")
    read = make_key(state, "read")
    port = free_port()
    proc = start_server(root, state, port, "--lease-timeout", "2")
    try:
        url = f"http://127.0.0.1:{port}"
        with Client(url, admin) as c:
            c.register("ds", name="ds")
        yield {
            "url": url,
            "admin": admin,
            "read": read,
            "root": root,
            "state": state,
            "base": base,
            "proc": proc,
        }
    finally:
        stop(proc)
