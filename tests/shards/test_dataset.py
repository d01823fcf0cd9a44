"""Shardset datasets: the seed's example, reading/joining, atomicity, URIs, conversions, CLI."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamill.core.errors import ShardsetError
from datamill.core.source import Source
from datamill.shards import ShardsetDataset, check_dataset

N_SHARDS, PER = 100, 100


def hashes(root: Path) -> dict[str, str]:
    """Content hash of every non-hidden file of a dataset folder."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not any(s.startswith(".") for s in p.relative_to(root).parts)
    }


def write_shards(folder: Path, tables: list[pa.Table], ext: str = "parquet") -> list[Path]:
    import pyarrow.csv as pcsv

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for k, t in enumerate(tables):
        p = folder / f"in{k:03d}.{ext}"
        pq.write_table(t, p) if ext == "parquet" else pcsv.write_csv(t, p)
        out.append(p)
    return out


@pytest.fixture()
def seed_ds(tmp_path: Path) -> ShardsetDataset:
    """shardset_1: 100 shards x 100 samples; shardset_2: 90 per shard (samples 90-99 missing)."""
    s1 = [
        pa.table(
            {"uid": np.arange(k * PER, (k + 1) * PER), "a": np.arange(PER, dtype=np.float64) + k}
        )
        for k in range(N_SHARDS)
    ]
    s2 = [
        pa.table({"uid": np.arange(k * PER, k * PER + 90), "b": [f"s{k}"] * 90})
        for k in range(N_SHARDS)
    ]
    ds = ShardsetDataset.create(
        tmp_path / "ds", write_shards(tmp_path / "in1", s1), uid="uid", shardset="shardset_1"
    )
    return ds.add("shardset_2", write_shards(tmp_path / "in2", s2))


def test_seed_example_get_and_read_shard(seed_ds: ShardsetDataset) -> None:
    ds = seed_ds
    assert isinstance(ds, Source)
    assert (len(ds), ds.num_shards, ds.shardsets) == (10_000, 100, ["shardset_1", "shardset_2"])
    assert ds.shard_sizes().tolist() == [100] * 100
    assert ds.get(1295) == {"uid": 1295, "a": 95.0 + 12, "b": None}  # missing from shardset_2
    assert ds.get(1205) == {"uid": 1205, "a": 5.0 + 12, "b": "s12"}
    assert ds.get(1295, columns=["b"]) == {"uid": 1295, "b": None}
    t = ds.read_shard(12)
    assert t.column_names == ["uid", "a", "b"] and t.num_rows == 100
    assert t.column("uid").to_pylist() == list(range(1200, 1300))
    assert t.column("b").null_count == 10 and t.column("b")[89].as_py() == "s12"
    inner = ds.read_shard(12, join="inner")
    assert inner.num_rows == 90 and ds.last_dropped == {"shardset_1": 0, "shardset_2": 10}
    assert b"datamill.dropped" in inner.schema.metadata
    assert ds.read_shard(3, columns=["b"]).column_names == ["b"]
    assert ds.read_shard(3, columns=["b", "uid", "a"]).column_names == ["b", "uid", "a"]
    with pytest.raises(ShardsetError) as exc:
        ds.get(10_000_000)
    assert exc.value.uid == 10_000_000
    assert check_dataset(ds.loc) == []
    assert "shardset_2 [parquet]: 9,000 samples, 1,000 missing" in ds.info()


def _rows_in_child(ds: ShardsetDataset, q: Any) -> None:
    q.put(ds.read_shard(5).column("b").null_count)


def test_read_shard_after_fork(seed_ds: ShardsetDataset) -> None:
    """The shared reading threads are made anew in a forked child (a stale pool would hang)."""
    import multiprocessing as mp

    assert seed_ds.read_shard(4).num_rows == 100  # the parent's pool exists before the fork
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_rows_in_child, args=(seed_ds, q))
    p.start()
    p.join(30)
    if p.exitcode is None:  # hung: do not leave it behind
        p.kill()
    assert p.exitcode == 0 and q.get(timeout=5) == 10


def test_read_shard_after_a_file_changes_size(seed_ds: ShardsetDataset) -> None:
    """A remembered Parquet footer is used only for the same file size."""
    before = seed_ds.read_shard(9)
    path = seed_ds.loc.join(seed_ds.shard_path("shardset_2", 9))
    t = pq.read_table(path)
    pq.write_table(
        t.set_column(1, "b", pa.array([f"longer value {i}" for i in range(t.num_rows)])), path
    )
    after = seed_ds.read_shard(9)
    assert (
        before.column("b")[0].as_py() == "s9" and after.column("b")[0].as_py() == "longer value 0"
    )


def test_column_selection_reads_only_owning_shardsets(seed_ds: ShardsetDataset) -> None:
    os.remove(seed_ds.loc.join(seed_ds.shard_path("shardset_2", 7)))
    assert seed_ds.read_shard(7, columns=["a"]).num_rows == 100  # shardset_2 not opened
    from datamill.core.errors import DataFileNotFoundError

    with pytest.raises(DataFileNotFoundError) as exc:
        seed_ds.read_shard(7)
    assert exc.value.shard == 7 and "shardset_2/shard.00007.parquet" in exc.value.path


def test_adding_shardset_3_leaves_old_files_byte_identical(seed_ds: ShardsetDataset) -> None:
    root = Path(seed_ds.loc.path)
    before = hashes(root)
    rng = np.random.default_rng(0)
    uids = rng.permutation(10_000)[:7_000]
    ds = seed_ds.add("shardset_3", pa.table({"uid": uids, "c": uids * 2}), route=True)
    after = hashes(root)
    assert {
        k: v for k, v in after.items() if not k.startswith("shardset_3/") and k != "dataset.json"
    } == {k: v for k, v in before.items() if k != "dataset.json"}
    assert len([k for k in after if k.startswith("shardset_3/")]) == 100
    assert ds.get(int(uids[0]))["c"] == int(uids[0]) * 2
    assert check_dataset(root) == []


def test_failed_add_leaves_dataset_unchanged(
    seed_ds: ShardsetDataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datamill.shards.sink as w

    root = Path(seed_ds.loc.path)
    before = hashes(root)
    calls = {"n": 0}
    real = w.write_any

    def boom(*args: object, **kw: object) -> None:
        calls["n"] += 1
        if calls["n"] == 50:
            raise OSError("disk full")
        real(*args, **kw)  # type: ignore[arg-type]  # test double

    monkeypatch.setattr(w, "write_any", boom)
    with pytest.raises(OSError):
        seed_ds.add(
            "shardset_3", pa.table({"uid": np.arange(10_000), "c": np.arange(10_000)}), route=True
        )
    assert hashes(root) == before
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp")]
    assert ShardsetDataset(root).shardsets == ["shardset_1", "shardset_2"]


_KILL_SCRIPT = """
import sys, numpy as np, pyarrow as pa
from datamill.shards import ShardsetDataset
ds = ShardsetDataset(sys.argv[1])
n = len(ds)
big = pa.table({"uid": np.arange(n), "blob": pa.array([b"x" * 20000] * n, pa.binary())})
print("start", flush=True)
ds.add("big", big, route=True)
"""


def test_killed_add_leaves_dataset_byte_identical(seed_ds: ShardsetDataset, tmp_path: Path) -> None:
    root = Path(seed_ds.loc.path)
    before = hashes(root)
    script = tmp_path / "kill.py"
    script.write_text(_KILL_SCRIPT)
    with subprocess.Popen(
        [sys.executable, str(script), str(root)], stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "start"
        deadline = time.time() + 30
        while time.time() < deadline and not any(
            p.name.startswith(".tmp-big") and any(p.iterdir()) for p in root.iterdir()
        ):
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert any(p.name.startswith(".tmp-big") for p in root.iterdir())  # killed mid-write
    assert hashes(root) == before  # only a hidden .tmp-big-* folder may remain
    ds = ShardsetDataset(root)
    assert ds.shardsets == ["shardset_1", "shardset_2"]
    litter = check_dataset(root)  # the temporary folder is reported, nothing else
    assert len(litter) == 1 and litter[0].path is not None and ".tmp-big" in litter[0].path
    ds.add(
        "small",
        pa.table({"uid": [], "y": pa.array([], pa.int64())}).cast(
            pa.schema([("uid", ds.uids.type), ("y", pa.int64())])
        ),
        route=True,
    )
    assert check_dataset(root) == []  # the next add removed it
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


def test_file_uri_and_csv_shards(tmp_path: Path) -> None:
    t = pa.table({"uid": [f"u{i}" for i in range(10)], "x": list(range(10))})
    uri = (tmp_path / "ds").as_uri()
    assert uri.startswith("file://")
    ds = ShardsetDataset.create(uri, t, uid="uid", shardset="base", shard_size=4, fmt="csv")
    ds = ds.add("extra", pa.table({"uid": ["u9", "u0"], "y": [9.5, 0.5]}), route=True)
    assert (tmp_path / "ds" / "base" / "shard.00002.csv").exists()
    ds = ShardsetDataset(uri)
    assert ds.get("u9") == {"uid": "u9", "x": 9, "y": 9.5}
    assert ds.read_shard(2).to_pydict() == {"uid": ["u8", "u9"], "x": [8, 9], "y": [None, 9.5]}
    assert check_dataset(uri) == []


def test_hdf5_and_bert_conversions_and_export(tmp_path: Path) -> None:
    import h5py

    from datamill.shards.convert import export, from_bert_parquet, from_hdf5

    h5 = tmp_path / "train.hdf5"
    with h5py.File(h5, "w") as f:
        f["age"] = np.arange(6, dtype=np.float32)
        f["image"] = np.arange(6 * 2 * 3, dtype=np.uint8).reshape(6, 2, 3)
        g = f.create_group("tags")
        g.attrs["layout"], g.attrs["vocab_size"] = "csr", 5
        g["indices"] = np.array([1, 2, 3, 4], dtype=np.int32)
        g["offsets"] = np.array([0, 1, 1, 2, 3, 3, 4], dtype=np.int64)
    ds = from_hdf5(h5, tmp_path / "h5ds", shard_size=4)
    assert ds.columns[0] == "uid" and ds.shard_sizes().tolist() == [4, 2]
    row = ds.get(3)
    assert row["image"] == [[18, 19, 20], [21, 22, 23]] and row["tags"] == [3] and row["age"] == 3.0
    assert pa.types.is_fixed_size_list(ds.read_shard(0).schema.field("image").type)
    bert = tmp_path / "bert.parquet"
    bt = pa.table({"tokens": [[1, 2], [3, 4], [5, 6]], "is_random_next": [True, False, True]})
    pq.write_table(bt.replace_schema_metadata({"datamill": '{"format": "datamill.bert/1"}'}), bert)
    bds = from_bert_parquet(bert, tmp_path / "bds", shard_size=2)
    assert bds.manifest["shardsets"][0]["source_metadata"] == '{"format": "datamill.bert/1"}'
    assert bds.get(2) == {"uid": 2, "tokens": [5, 6], "is_random_next": True}
    out = export(ds, tmp_path / "all.parquet")
    assert pq.read_table(tmp_path / "all.parquet").equals(out) and out.num_rows == 6


def test_cli_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from datamill.cli import main

    src = tmp_path / "t.csv"
    src.write_text("id,x\n" + "".join(f"{i},{i * i}\n" for i in range(10)))
    extra = tmp_path / "e.csv"
    extra.write_text("id,note\n3,three\n7,seven\n")
    root = str(tmp_path / "ds")
    assert (
        main(
            [
                "shards",
                "create",
                root,
                "--uid",
                "id",
                "--shardset",
                "base",
                str(src),
                "--shard-size",
                "3",
            ]
        )
        == 0
    )
    assert main(["shards", "add", root, "--shardset", "notes", str(extra), "--route"]) == 0
    assert main(["shards", "check", root]) == 0
    assert main(["shards", "get", root, "7"]) == 0
    assert '{"id": 7, "x": 49, "note": "seven"}' in capsys.readouterr().out
    assert main(["shards", "info", root]) == 0
    assert "notes [parquet]: 2 samples, 8 missing" in capsys.readouterr().out
    assert main(["shards", "export", root, str(tmp_path / "out.csv"), "--join", "inner"]) == 0
    assert (tmp_path / "out.csv").read_text().splitlines()[1:] == ['3,9,"three"', '7,49,"seven"']
    bad = tmp_path / "bad.csv"
    bad.write_text("id,note\n99,x\n")
    assert main(["shards", "add", root, "--shardset", "bad", str(bad), "--route"]) == 2
    assert "99" in capsys.readouterr().err
    pq.write_table(
        pa.table({"id": [3, 7], "note": ["three", "x"]}),
        Path(root) / "notes" / "shard.00001.parquet",
    )
    assert main(["shards", "check", root]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"{root}/notes/shard.00001.parquet, shard 1: expected 1 rows (manifest), got 2",
        (
            f"{root}/notes/shard.00001.parquet, shard 1, row 1, uid 7: uid belongs to shard 2 "
            "(as in base/shard.00002.parquet) Fix: a sample lives in the same shard index in every "
            "shardset; use `add --route`"
        ),
        f"{root}: 2 violations",
    ]


def test_stale_object_add_keeps_other_shardsets(seed_ds: ShardsetDataset) -> None:
    """Regression: an add through an old ShardsetDataset object must not drop a shardset added
    since."""
    stale = ShardsetDataset(seed_ds.loc)
    seed_ds.add("s3", pa.table({"uid": [5], "c": [1]}), route=True)
    ds = stale.add("s4", pa.table({"uid": [6], "d": [2]}), route=True)
    assert ds.shardsets == ["shardset_1", "shardset_2", "s3", "s4"]
    assert ShardsetDataset(seed_ds.loc).get(6, columns=["c", "d"]) == {"uid": 6, "c": None, "d": 2}


def test_loader_iterates_a_shardset_dataset(seed_ds: ShardsetDataset) -> None:
    import datamill
    from datamill.loader import Loader

    assert datamill.ShardsetDataset is ShardsetDataset
    seen: list[int] = []
    nulls = 0
    for batch in Loader(seed_ds, 512, seed=3, columns=["uid", "b"], collate=lambda t: t):
        seen += batch.column("uid").to_pylist()
        nulls += batch.column("b").null_count
    assert sorted(seen) == list(range(10_000)) and nulls == 1_000


def test_a_csv_export_replaces_its_own_file_and_never_a_users_csv(tmp_path: Path) -> None:
    """A CSV export leaves a marker with its SHA-256: a second export replaces it; a user's CSV, or
    the export after the user edited it, is refused even with overwrite=True, and a killed switch
    (marker listing both files) still recognises whichever file is there."""
    import json

    from datamill.core.errors import DataFileError
    from datamill.shards.convert import CSV_MARKER_SUFFIX, export

    ds = ShardsetDataset.create(
        tmp_path / "ds", pa.table({"uid": [1, 2, 3]}), uid="uid", shardset="a", shard_size=2
    )
    out = tmp_path / "all.csv"
    export(ds, out)
    marker = tmp_path / ("all.csv" + CSV_MARKER_SUFFIX)
    assert json.loads(marker.read_text())["sha256"]
    assert export(ds, out, columns=["uid"]).num_rows == 3  # its own export: replaced
    mine = tmp_path / "mine.csv"
    mine.write_text("uid\n9\n")
    for overwrite in (False, True):
        with pytest.raises(DataFileError, match="refusing"):
            export(ds, mine, overwrite=overwrite)
    assert mine.read_text() == "uid\n9\n"
    out.write_text(out.read_text() + "4\n")  # the user edited the export
    with pytest.raises(DataFileError, match="refusing"):
        export(ds, out, overwrite=True)
    assert out.read_text().endswith("4\n")
    fake = tmp_path / "other.csv"
    (tmp_path / ("other.csv" + CSV_MARKER_SUFFIX)).write_text("my notes")
    with pytest.raises(DataFileError, match="not a datamill export marker"):
        export(ds, fake)
    assert not fake.exists()
