"""The Ray engine keeps the previous output through a failed or killed run, and guards its output
paths."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from datamill.core.errors import DataFileError
from datamill.core.io import find_litter
from datamill.preprocessing import pipeline
from datamill.preprocessing.api import preprocess
from datamill.shards import ShardsetDataset
from tests.ray.test_preprocess_ray import assert_same

pytestmark = pytest.mark.ray

CFG: dict[str, Any] = {
    "input_features": [
        {
            "name": "image_path",
            "type": "image",
            "preprocessing": {"num_channels": 1, "height": 32, "width": 32},
        }
    ],
    "output_features": [{"name": "label", "type": "category"}],
    "preprocessing": {"split": {"type": "random"}, "seed": 3},
}


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "BLOCK_ROWS", 64)  # 100 rows: two blocks, two shards


def _parts(
    folder: Path, data_dir: Path, *, missing_at: int | None = None, relabel: bool = False
) -> Path:
    """Two CSV files of 50 rows each (absolute paths of image copies); the row ``missing_at`` names
    an absent image."""
    src = pacsv.read_csv(data_dir / "cifar10_tiny" / "labels.csv")
    (folder.parent / "images").mkdir(exist_ok=True)  # copies: a test changes one
    images = [
        str(shutil.copy2(data_dir / "cifar10_tiny" / p, folder.parent / p))
        for p in src["image_path"].to_pylist()
    ]
    if missing_at is not None:
        images[missing_at] = str(folder.parent / "no-such-image.png")
    labels = src["label"].to_pylist()
    if relabel:
        labels[0] = "relabelled"
    table = pa.table({"id": src["id"], "image_path": images, "label": labels})
    folder.mkdir(exist_ok=True)
    for i in range(2):
        pacsv.write_csv(table.slice(50 * i, 50), folder / f"part-{i}.csv")
    return folder


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_a_failed_or_killed_run_keeps_the_previous_output_and_the_next_run_removes_litter(
    ray_cluster: Any, data_dir: Path, tmp_path: Path
) -> None:
    parts, out = tmp_path / "parts", tmp_path / "out"
    _parts(parts, data_dir)
    good = preprocess(parts, CFG, output_dir=out, engine="ray", engine_options={"fmt": "hdf5"})
    assert good.num_rows == 100
    before = _snapshot(out)
    assert sorted(before) == sorted(
        [
            "parts.hdf5",
            "parts.meta.json",
            "parts.shards/dataset.json",
            "parts.shards/samples.parquet",
            "parts.shards/features/shard.00000.parquet",
            "parts.shards/features/shard.00001.parquet",
        ]
    )

    # killed (kill -9) after the new dataset was switched in, before meta.json: old meta.json, new
    # dataset
    _parts(parts, data_dir, relabel=True)
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join(sys.path),
        "DATAMILL_FAULT": "ray.preprocess.before_meta",
    }
    (tmp_path / "c.json").write_text(json.dumps(CFG))
    code = (
        "import sys; from datamill.preprocessing import pipeline; pipeline.BLOCK_ROWS = 64; "
        "from datamill.cli import main; sys.exit(main())"
    )
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "--quiet",
            "preprocess",
            str(parts),
            "--config",
            str(tmp_path / "c.json"),
            "--engine",
            "ray",
            "--address",
            ray_cluster.address,
            "--format",
            "hdf5",
            "--output-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert run.returncode == -9, run.stderr[-2000:]
    assert (out / "parts.meta.json").read_bytes() == before["parts.meta.json"]
    assert _snapshot(out / "parts.shards") != {
        k.split("/", 1)[1]: v for k, v in before.items() if "/" in k
    }
    assert sorted(p.name.split("-")[0] for p in find_litter(out)) == [
        ".parts.hdf5.tmp",
        ".parts.shards.old",
    ]

    # a run that fails on a worker (an image file is missing in the 2nd file, block 1) first repairs
    # the killed run's switch, then leaves the previous output byte for byte, and cleans up after
    # itself
    _parts(parts, data_dir, missing_at=90)
    with pytest.raises(DataFileError) as info:
        preprocess(parts, CFG, output_dir=out, engine="ray", engine_options={"fmt": "hdf5"})
    assert "image file not found" in str(info.value) and info.value.column == "image_path"
    assert _snapshot(out) == before
    assert sorted(p.name for p in out.iterdir()) == [
        "parts.hdf5",
        "parts.meta.json",
        "parts.shards",
    ]

    # the next good run replaces the output; nothing is left beside it
    _parts(parts, data_dir, relabel=True)
    again = preprocess(parts, CFG, output_dir=out, engine="ray", engine_options={"fmt": "hdf5"})
    assert sorted(p.name for p in out.iterdir()) == [
        "parts.hdf5",
        "parts.meta.json",
        "parts.shards",
    ]
    old_header = json.loads(before["parts.meta.json"])["datamill"]
    assert again.metadata.header["fingerprint"] != old_header["fingerprint"]
    assert again.metadata.header["dataset"]["stamp"] != old_header["dataset"]["stamp"]
    assert len(ShardsetDataset(out / "parts.shards")) == 100


def test_output_paths_holding_your_files_are_refused(
    ray_cluster: Any, data_dir: Path, tmp_path: Path
) -> None:
    parts, out = _parts(tmp_path / "parts", data_dir), tmp_path / "out"
    (out / "parts.shards").mkdir(parents=True)
    (out / "parts.shards" / "mine.txt").write_text("mine")
    with pytest.raises(DataFileError) as info:
        preprocess(parts, CFG, output_dir=out, engine="ray")
    assert info.value.path == str(out / "parts.shards") and "not a datamill" in str(info.value)
    (out / "parts.shards" / "mine.txt").unlink()
    (out / "parts.meta.json").write_text("{}")
    with pytest.raises(DataFileError) as info:
        preprocess(parts, CFG, output_dir=out, engine="ray")
    assert info.value.path == str(out / "parts.meta.json")
    assert (out / "parts.meta.json").read_text() == "{}" and not any(
        (out / "parts.shards").iterdir()
    )
    with pytest.raises(DataFileError) as info:  # the next run would read the outputs as input files
        preprocess(parts, CFG, output_dir=parts, engine="ray")
    assert info.value.path == str(parts / "parts.shards") and sorted(
        p.name for p in parts.iterdir()
    ) == ["part-0.csv", "part-1.csv"]


class _Miss(Exception):
    """Raised instead of connecting to Ray: the cache was missed."""


def test_an_identical_rerun_reuses_the_output_and_any_change_recomputes(
    ray_cluster: Any, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts, out = _parts(tmp_path / "parts", data_dir), tmp_path / "out"
    first = preprocess(parts, CFG, output_dir=out, engine="ray", engine_options={"fmt": "hdf5"})
    assert not first.cached
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*")}

    def no_ray(address: Any = None) -> Any:
        raise _Miss

    monkeypatch.setattr(importlib.import_module("datamill.ray.preprocess"), "connect", no_ray)
    second = preprocess(parts, CFG, output_dir=out, engine="ray", engine_options={"fmt": "hdf5"})
    assert second.cached and second.num_rows == 100 and second.hdf5_path == out / "parts.hdf5"
    assert second.metadata.to_dict() == first.metadata.to_dict()
    shards = preprocess(
        parts, CFG, output_dir=out, engine="ray"
    )  # the dataset alone is the same output too
    assert shards.cached and shards.hdf5_path is None
    assert_same(first.data, shards.data)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == mtimes  # nothing was written

    def misses(**changed: Any) -> None:
        with pytest.raises(_Miss):
            preprocess(
                parts,
                changed.get("cfg", CFG),
                output_dir=out,
                engine="ray",
                engine_options={"fmt": "hdf5", "uid_column": changed.get("uid")},
            )

    shard = out / "parts.shards" / "features" / "shard.00001.parquet"
    os.utime(shard, ns=(mtimes[shard], mtimes[shard] + 1))  # the dataset was touched: not trusted
    misses()
    os.utime(shard, ns=(mtimes[shard], mtimes[shard]))
    image = tmp_path / "images" / "1.png"
    st = image.stat()
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # an image file changed
    misses()
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))
    misses(cfg={**CFG, "preprocessing": {"split": {"type": "random"}, "seed": 4}})  # the config
    misses(uid="id")  # the UID column
    _parts(parts, data_dir, relabel=True)  # the input's content
    misses()
    _parts(parts, data_dir)
    assert preprocess(
        parts, CFG, output_dir=out, engine="ray", engine_options={"fmt": "hdf5"}
    ).cached
