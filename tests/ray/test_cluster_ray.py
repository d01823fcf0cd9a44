"""Two nodes, the command line with --address, and failures: a killed worker is retried, or the run
fails cleanly."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from datamill.core.errors import DatamillError
from datamill.preprocessing import pipeline
from datamill.preprocessing.api import preprocess
from datamill.ray import _blocks
from datamill.shards import ShardsetDataset
from tests.ray.test_preprocess_ray import assert_same

pytestmark = pytest.mark.ray

CFG: dict[str, Any] = {
    "input_features": [
        {"name": "t", "type": "text"},
        {"name": "c", "type": "category"},
        {"name": "x", "type": "number", "preprocessing": {"normalization": "zscore"}},
    ],
    "preprocessing": {"split": {"type": "random"}, "seed": 2},
}
_TASKS = ("ray::_transform_task", "ray::_apply", "ray::_prepare_task")


def _data(path: Path, n: int = 24_000) -> Path:
    rng = np.random.default_rng(0)
    words = np.array(["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"])
    pacsv.write_csv(
        pa.table(
            {
                "t": [" ".join(rng.choice(words, 12)) for _ in range(n)],
                "c": rng.choice(["a", "b", "c"], n),
                "x": rng.normal(0, 1, n),
            }
        ),
        path,
    )
    return path


def _busy_task_pids() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    title = f.read().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if title.startswith(_TASKS):
                pids.append(int(entry))
    return pids


class Killer(threading.Thread):
    """kill -9 the first worker process found running one of this engine's tasks."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.killed: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and not self.killed:
            for pid in _busy_task_pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.killed.append(pid)
                except ProcessLookupError:
                    continue
                break
            time.sleep(0.002)


def test_a_killed_worker_is_retried_and_the_output_equals_local(
    ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline, "BLOCK_ROWS", 2_000)
    src = _data(tmp_path / "d.csv")
    local = preprocess(src, CFG, output_dir=tmp_path / "local")
    killer = Killer()
    killer.start()
    try:
        out = preprocess(src, CFG, output_dir=tmp_path / "ray", engine="ray")
    finally:
        killer.stop.set()
        killer.join()
    assert killer.killed, "no task process was found to kill"
    assert_same(local.data, out.data)


def test_a_killed_worker_without_retries_fails_with_one_error_and_nothing_trusted(
    ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline, "BLOCK_ROWS", 2_000)
    monkeypatch.setattr(_blocks, "MAX_RETRIES", 0)
    monkeypatch.setattr(importlib.import_module("datamill.ray.preprocess"), "MAX_RETRIES", 0)
    src = _data(tmp_path / "d.csv")
    killer = Killer()
    killer.start()
    try:
        with pytest.raises(DatamillError) as info:
            preprocess(src, CFG, output_dir=tmp_path / "ray", engine="ray")
    finally:
        killer.stop.set()
        killer.join()
    assert killer.killed
    assert "failed on Ray" in str(info.value) and "\n" not in info.value.one_line()
    out = tmp_path / "ray"
    assert not (out / "d.meta.json").exists() and not (out / "d.shards" / "dataset.json").exists()
    assert [p.name for p in out.iterdir()] == [] if out.exists() else True
    again = preprocess(
        src, CFG, output_dir=out, engine="ray"
    )  # a later run starts clean and succeeds
    assert again.num_rows == 24_000 and (out / "d.meta.json").exists()


def test_cli_joins_the_two_node_cluster_by_address(ray_cluster: Any, tmp_path: Path) -> None:
    src = _data(tmp_path / "d.csv", n=3_000)
    (tmp_path / "c.json").write_text(json.dumps(CFG))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "from datamill.cli import main; raise SystemExit(main())",
            "--quiet",
            "preprocess",
            str(src),
            "--config",
            str(tmp_path / "c.json"),
            "--engine",
            "ray",
            "--address",
            ray_cluster.address,
            "--format",
            "hdf5",
            "--output-dir",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "shardset dataset" in run.stdout
    local = preprocess(src, CFG, output_dir=tmp_path / "local")
    meta = json.loads((tmp_path / "o" / "d.meta.json").read_text())
    assert meta["t"] == local.metadata["t"] and meta["datamill"]["dataset"]["num_samples"] == 3_000
    assert len(ShardsetDataset(tmp_path / "o" / "d.shards")) == 3_000
