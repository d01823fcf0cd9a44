"""``datamill iterate`` and the loader demo section."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamill.cli import main
from datamill.loader import demo


def test_iterate_prints_stats_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "d.parquet"
    pq.write_table(
        pa.table({"x": np.arange(1000), "ids": [[1] * (i % 3) for i in range(1000)]}),
        path,
        row_group_size=100,
    )
    state = tmp_path / "state.json"
    assert (
        main(
            [
                "-q",
                "iterate",
                str(path),
                "--batch-size",
                "64",
                "--limit",
                "5",
                "--save-state",
                str(state),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "ParquetSource: 1,000 samples in 10 shards" in out and "yielded 320" in out
    assert "ids (64, 2)" in out and "ids_mask (64, 2)" in out
    assert json.loads(state.read_text())["batches_seen"] == 5
    assert main(["-q", "iterate", str(path), "--batch-size", "64", "--resume", str(state)]) == 0
    assert "yielded 1,000" in capsys.readouterr().out  # the state carries the epoch's counts


def test_iterate_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["iterate", str(tmp_path / "missing.parquet")]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("error: ")
        and "missing.parquet" in err
        and len(err.strip().splitlines()) == 1
    )


def test_demo_runs(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    demo.run(data_dir, tmp_path)
    out = capsys.readouterr().out
    assert "every sample exactly once over both ranks: True" in out
    assert "rest identical to the uninterrupted run: True" in out
    assert len(out.splitlines()) <= 25
