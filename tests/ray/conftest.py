"""One Ray cluster for every ``ray`` test: two nodes of one CPU each
(``ray.cluster_utils.Cluster``).

Started once per session (Ray's start costs seconds) and shut down by the fixture that started it;
``ray stop`` is never run. ``RAY_AUTH_MODE=disabled`` keeps ray 2.60 from writing an auth token.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="needs the ray extra: pip install 'datamill[ray]'")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A 2-node local Ray cluster (1 CPU each, 256 MiB object store each), the driver connected."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # pragma: no cover - another session-level user; never stop theirs
        pytest.skip("Ray is already initialised in this process")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "object_store_memory": 256 << 20,
        },
    )
    try:
        cluster.add_node(num_cpus=1, object_store_memory=256 << 20)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
