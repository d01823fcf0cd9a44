"""kill -9 of ``datamill bert`` with worker processes: the workers notice the dead parent and
exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from datamill.core.faults import FAULT_ENV

pytestmark = pytest.mark.faults


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.add(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to list child processes")
def test_killing_bert_leaves_no_worker_running(tmp_path: Path, data_dir: Path) -> None:
    lines = (
        (data_dir / "wikitext2_test.raw")
        .read_text(encoding="utf-8")
        .splitlines(keepends=True)[:3000]
    )
    (tmp_path / "raw.txt").write_text("".join(lines), encoding="utf-8")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **{FAULT_ENV: "bert.row_group_written"})
    cmd = [
        sys.executable,
        "-c",
        "import sys; from datamill.cli import main; sys.exit(main())",
        "-q",
        "bert",
        "raw.txt",
        "--out",
        "b.parquet",
        "--vocab-size",
        "400",
        "--max-seq-length",
        "48",
        "--dupe-factor",
        "6",
        "--workers",
        "2",
    ]
    seen: set[int] = set()
    log = tmp_path / "stderr.txt"
    with (
        log.open("wb") as err,
        subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err) as proc,
    ):  # a file: orphans cannot block a pipe
        while proc.poll() is None:
            seen |= _children(proc.pid)
            time.sleep(0.01)
    assert proc.returncode == -9, log.read_text()[-2000:]
    assert seen, "the run never started worker processes"
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(p) for p in seen):
        time.sleep(0.05)
    survivors = [p for p in seen if _alive(p)]
    for p in survivors:  # do not leave them running when the test fails
        os.kill(p, 9)
    assert not survivors, "workers outlived their killed parent"
    assert not (tmp_path / "b.parquet").exists()
