"""A real training client: torchrun with 2 ranks (gloo, CPU) sees per rank the same samples from the
server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from datamill.client import Leases
from tests.serve._proc import env

pytestmark = [pytest.mark.server, pytest.mark.torch]

DDP = str(Path(__file__).with_name("_ddp.py"))


def _torchrun(source: str, server: dict[str, Any], out: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        # torchrun picks a free loopback port itself (a port chosen here could be taken before
        # torchrun binds it: EADDRINUSE seen once in CI)
        "--standalone",
        DDP,
        source,
        server["url"],
        server["read"],
        str(server["root"]),
        str(out),
    ]
    res = subprocess.run(
        cmd,
        env={**env(), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]


def test_torchrun_two_ranks_get_the_in_process_loaders_samples_per_rank(
    server: dict[str, Any], tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    _torchrun("server", server, tmp_path / "served")
    _torchrun("local", server, tmp_path / "local")
    for rank in range(2):
        served = json.loads((tmp_path / f"served.{rank}").read_text())
        local = json.loads((tmp_path / f"local.{rank}").read_text())
        assert served == local and len(served) == 46 * 64  # same samples, same order, per rank


def test_dataloader_workers_split_a_rank_by_slot_exactly_once(server: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    from datamill.client.torch import RemoteTorchDataset

    uids: list[int] = []
    ds = RemoteTorchDataset(
        server["url"],
        server["read"],
        "ds",
        batch_size=50,
        seed=8,
        leases=Leases(name="workers", size=2),
    )
    for batch in torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context="spawn"
    ):
        assert isinstance(batch["x"], torch.Tensor)
        uids.extend(batch["uid"].tolist())
    assert sorted(uids) == list(range(6000))
