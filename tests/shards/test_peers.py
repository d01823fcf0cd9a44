"""Import from the peers' formats (fixtures written by the peers' own libraries): every sample once,
equal bytes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from datamill.core.errors import ConfigError, DataFileError, DataFileNotFoundError, SchemaError
from datamill.shards import ShardsetDataset
from datamill.shards.peers import from_peer, read_peer

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "peers"
EXPECTED = {r["uid"]: r for r in json.loads((FIX / "expected.json").read_text(encoding="utf-8"))}


def _check_rows(rows: list[dict[str, object]]) -> None:
    uids = [r["uid"] for r in rows]
    assert sorted(uids) == sorted(EXPECTED), "every sample exactly once"  # type: ignore[type-var]
    for r in rows:
        e = EXPECTED[r["uid"]]
        assert r["image"] == bytes.fromhex(e["image"]) and r["tokens"] == e["tokens"]
        assert r["name"] == e["name"] and r["label"] == e["label"] and r["score"] == e["score"]


@pytest.mark.parametrize("fmt", ["mds", "litdata", "hf"])
def test_read_peer_gives_every_sample_once_with_equal_bytes(fmt: str) -> None:
    table = read_peer(fmt, FIX / fmt)
    _check_rows(table.to_pylist())
    assert table.schema.field("image").type == pa.binary()
    if fmt != "hf":  # int32 token ids stay int32 (HF stored them as int64 lists)
        assert table.schema.field("tokens").type == pa.list_(pa.int32())


def test_read_webdataset_groups_members_by_key() -> None:
    table = read_peer("webdataset", FIX / "wds")
    assert table.column_names == ["key", "image.bin", "json", "txt"]
    rows = table.to_pylist()
    assert [r["key"] for r in rows] == [f"sample{i:04d}" for i in range(23)]
    for r in rows:
        meta = json.loads(r["json"])
        e = EXPECTED[meta["uid"]]
        assert r["image.bin"] == bytes.fromhex(e["image"]) and r["txt"].decode() == e["name"]


@pytest.mark.parametrize("fmt", ["mds", "litdata", "hf", "webdataset"])
def test_cli_shards_create_from_a_peer(fmt: str, tmp_path: Path) -> None:
    src = FIX / ("wds" if fmt == "webdataset" else fmt)
    args = [
        "shards",
        "create",
        str(tmp_path / "ds"),
        "--uid",
        "uid",
        "--shardset",
        "s",
        "--shard-size",
        "5",
        "--from",
        fmt,
        str(src),
    ] + (["--add-uid"] if fmt == "webdataset" else [])
    out = subprocess.run(
        [sys.executable, "-m", "datamill.cli", *args], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    ds = ShardsetDataset(tmp_path / "ds")
    assert ds.shard_sizes().tolist() == [5, 5, 5, 5, 3]
    table = ds.to_table()
    if fmt == "webdataset":
        assert (
            table.column("image.bin").to_pylist()
            == read_peer(fmt, src).column("image.bin").to_pylist()
        )
    else:
        _check_rows(table.to_pylist())


def test_bad_peer_inputs_fail_with_located_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown peer format"):
        read_peer("tfrecord", FIX / "mds")
    with pytest.raises(DataFileNotFoundError) as nf:
        read_peer("mds", tmp_path)
    assert nf.value.path is not None and "index.json" in str(nf.value.path)
    bad = tmp_path / "mds"
    shutil.copytree(FIX / "mds", bad)
    index = json.loads((bad / "index.json").read_text())
    index["shards"][0]["column_encodings"][0] = "pkl"
    (bad / "index.json").write_text(json.dumps(index))
    with pytest.raises(SchemaError) as se:
        read_peer("mds", bad)
    assert se.value.column == "image"
    shutil.copytree(FIX / "mds", tmp_path / "cut")
    shard = tmp_path / "cut" / "shard.00001.mds"
    shard.write_bytes(shard.read_bytes()[:9])
    with pytest.raises(DataFileError):
        read_peer("mds", tmp_path / "cut")
    with pytest.raises(DataFileNotFoundError):
        from_peer("hf", tmp_path, tmp_path / "out", uid="uid", shardset="s", shard_size=4)
