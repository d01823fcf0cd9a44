"""Shardset datasets on S3 (the session's SeaweedFS on loopback): write, read through the cache, CLI, errors."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

import datamill.shards._remote as remote_mod
from datamill.cli import main
from datamill.core.errors import DataFileError, DataFileNotFoundError, ShardsetError
from datamill.core.objstore import s3_filesystem
from datamill.loader import Loader
from datamill.shards import ShardsetDataset
from datamill.sources import open_source
from tests.contracts import assert_same_items, check_source

pytestmark = pytest.mark.server

N = 500


def _table() -> pa.Table:
    rng = np.random.default_rng(7)
    return pa.table({"uid": np.arange(N, dtype=np.int64) * 3, "x": rng.normal(size=N),
                     "tokens": [[int(t)] * int(t % 4) for t in rng.integers(0, 100, N)]})


def _labels() -> pa.Table:
    uids = np.arange(N, dtype=np.int64)[::-2] * 3  # every other sample, in another order
    return pa.table({"uid": uids, "label": (uids % 5).astype(np.int32)})


@pytest.fixture(scope="module")
def store(seaweed: tuple[str, str, str], tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[pafs.S3FileSystem, ShardsetDataset]]:
    """Bucket ``shards`` on the server (keys in the AWS_* variables); a local twin dataset to compare with."""
    endpoint, key, secret = seaweed
    fs = s3_filesystem(endpoint=endpoint, access_key=key, secret_key=secret, allow_bucket_creation=True)
    fs.create_dir("shards")
    local = ShardsetDataset.create(tmp_path_factory.mktemp("local") / "ds", _table(), uid="uid", shardset="base",
                                   shard_size=80)
    local = local.add("labels", _labels(), route=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ACCESS_KEY_ID", key)
        mp.setenv("AWS_SECRET_ACCESS_KEY", secret)
        mp.setenv("AWS_ENDPOINT_URL", endpoint)
        yield fs, local


def test_create_add_and_load_from_s3_equal_the_local_dataset(store: tuple[pafs.S3FileSystem, ShardsetDataset],
                                                             tmp_path: Path) -> None:
    fs, local = store
    ds = ShardsetDataset.create("s3://shards/ds", _table(), uid="uid", shardset="base", shard_size=80)
    ds = ds.add("labels", _labels(), route=True)
    assert ds.shardsets == ["base", "labels"] and ds.manifest["name"] == "ds"
    manifest = json.loads(fs.open_input_stream("shards/ds/dataset.json").read())
    assert all(len(ss["shard_xxh3"]) == len(ss["shard_bytes"]) == 7 for ss in manifest["shardsets"])
    assert [i.base_name for i in fs.get_file_info(pafs.FileSelector("shards/ds")) if i.base_name.startswith(".")] == []

    src = open_source("s3://shards/ds", cache_dir=tmp_path / "c")
    assert isinstance(src, ShardsetDataset) and src.remote is not None
    check_source(src, reopen=lambda: ShardsetDataset("s3://shards/ds/", cache_dir=tmp_path / "c2"))
    assert src.shard_sizes().tolist() == local.shard_sizes().tolist() and src.columns == local.columns
    assert src.shard_nbytes().sum() == sum(manifest["shardsets"][i]["shard_bytes"][k] for i in range(2)
                                           for k in range(7))
    for k in range(src.num_shards):
        assert src.read_shard(k, join="inner").equals(local.read_shard(k, join="inner"))
    assert src.get(3 * 17) == local.get(3 * 17)
    assert pickle.loads(pickle.dumps(src)).read_shard(2).equals(src.read_shard(2))  # spawned workers pickle it

    cold = ShardsetDataset("s3://shards/ds", cache_dir=tmp_path / "cold")
    cols = ["uid", "x", "tokens"]  # (the nullable label column reads as NaN, which never equals itself)
    got = list(Loader(cold, 64, seed=5, world_size=2, rank=1, columns=cols))
    assert_same_items(got, list(Loader(local, 64, seed=5, world_size=2, rank=1, columns=cols)), "s3 vs local")
    warm = ShardsetDataset("s3://shards/ds", cache_dir=tmp_path / "cold")
    assert_same_items(list(Loader(warm, 64, seed=5, world_size=2, rank=1, columns=cols)), got, "warm cache")
    assert cold.remote is not None and warm.remote is not None
    assert cold.remote.cache.stats()["downloads"] >= 4 and warm.remote.cache.stats()["downloads"] == 0
    assert warm.remote.cache.stats()["hits"] == cold.remote.cache.stats()["downloads"]


def test_cache_bound_and_no_corrupt_copy_is_used(store: tuple[pafs.S3FileSystem, ShardsetDataset],
                                                 tmp_path: Path) -> None:
    fs, _ = store
    if not fs.get_file_info("shards/ds/dataset.json").size:
        ShardsetDataset.create("s3://shards/ds", _table(), uid="uid", shardset="base", shard_size=80)
    ds = ShardsetDataset("s3://shards/ds", cache_dir=tmp_path / "c", cache_limit=6_000)
    assert ds.remote is not None
    biggest = int(ds.shard_nbytes().max())
    for _ in range(2):
        for _batch in Loader(ds, 100, seed=2, prefetch=1, columns=["uid", "x"]):
            held = sum(p.stat().st_size for p in (tmp_path / "c").iterdir() if not p.name.endswith(".json"))
            assert held <= 6_000 + biggest
    stats = ds.remote.cache.stats()
    assert stats["bytes_cached"] <= 6_000 and stats["evictions"] > 0

    # a bit flipped in a cached copy: rejected and downloaded again
    want = ds.read_shard(3, columns=["uid", "x"])
    copy = next(p for p in (tmp_path / "c").iterdir() if p.name.endswith("shard.00003.parquet"))
    data = copy.read_bytes()
    copy.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert ds.read_shard(3, columns=["uid", "x"]).equals(want) and ds.remote.cache.stats()["rejected"] == 1

    # an object replaced behind the manifest's back (same rows, other bytes): the checksum refuses it
    bad = ShardsetDataset.create("s3://shards/tampered", _table(), uid="uid", shardset="base", shard_size=80)
    other = ShardsetDataset.create(tmp_path / "other", _table().slice(0, 80).set_column(
        1, "x", pa.array(np.zeros(80))), uid="uid", shardset="base", shard_size=80)
    with fs.open_output_stream("shards/tampered/base/shard.00000.parquet") as f:
        f.write((tmp_path / "other" / "base" / "shard.00000.parquet").read_bytes())
    fresh = ShardsetDataset("s3://shards/tampered", cache_dir=tmp_path / "t")
    with pytest.raises(ShardsetError) as info:
        fresh.read_shard(0)
    assert info.value.shard == 0 and info.value.path == "s3://shards/tampered/base/shard.00000.parquet"
    assert fresh.read_shard(1).num_rows == 80 and bad.num_shards == other.num_shards + 6


def test_writes_never_leave_a_half_dataset_and_never_touch_foreign_objects(
        store: tuple[pafs.S3FileSystem, ShardsetDataset], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fs, _ = store
    ds = ShardsetDataset.create("s3://shards/atomic", _table(), uid="uid", shardset="base", shard_size=100)
    real_put = remote_mod._put

    def failing_put(f: pafs.FileSystem, path: str, data: bytes) -> None:
        if path.endswith("dataset.json"):
            raise OSError("AWS Error NETWORK_CONNECTION during PutObject operation: curlCode: 7")
        real_put(f, path, data)

    monkeypatch.setattr(remote_mod, "_put", failing_put)
    with pytest.raises(DataFileError, match="unreachable") as info:
        ds.add("labels", _labels(), route=True)
    assert info.value.path == "s3://shards/atomic"
    monkeypatch.undo()
    again = ShardsetDataset("s3://shards/atomic", cache_dir=tmp_path / "c")
    assert again.shardsets == ["base"] and again.read_shard(0).num_rows == 100
    assert fs.get_file_info(pafs.FileSelector("shards/atomic/labels", allow_not_found=True)) == []
    assert again.add("labels", _labels(), route=True).shardsets == ["base", "labels"]  # a retry works
    with pytest.raises(ShardsetError, match="already exists") as dup:
        again.add("labels", _labels(), route=True)
    assert dup.value.path == "s3://shards/atomic/labels"

    with pytest.raises(ShardsetError, match="already exists"):
        ShardsetDataset.create("s3://shards/atomic", _table(), uid="uid", shardset="base", shard_size=100)
    replaced = ShardsetDataset.create("s3://shards/atomic", _table().slice(0, 50), uid="uid", shardset="base",
                                      shard_size=10, overwrite=True)
    assert replaced.num_shards == 5 and len(replaced) == 50 and replaced.shardsets == ["base"]
    assert not fs.get_file_info(pafs.FileSelector("shards/atomic/labels", allow_not_found=True))

    with fs.open_output_stream("shards/mine/notes.txt") as f:
        f.write(b"a file of yours")
    for overwrite in (False, True):
        with pytest.raises(DataFileError, match="not a datamill shardset dataset") as refused:
            ShardsetDataset.create("s3://shards/mine", _table(), uid="uid", shardset="base", shard_size=100,
                                   overwrite=overwrite)
        assert refused.value.path == "s3://shards/mine"
    assert fs.open_input_stream("shards/mine/notes.txt").read() == b"a file of yours"


def test_cli_on_s3_and_one_line_errors(store: tuple[pafs.S3FileSystem, ShardsetDataset], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "t.parquet"
    import pyarrow.parquet as pq

    pq.write_table(_table(), table)
    pq.write_table(_labels(), tmp_path / "labels.parquet")
    assert main(["-q", "shards", "create", "s3://shards/cli", str(table), "--uid", "uid", "--shardset", "base",
                 "--shard-size", "120"]) == 0
    assert main(["-q", "shards", "add", "s3://shards/cli", "--shardset", "labels", str(tmp_path / "labels.parquet"),
                 "--route"]) == 0
    assert main(["-q", "shards", "info", "s3://shards/cli"]) == 0
    out = capsys.readouterr().out
    assert "500 samples, 5 shards" in out and "labels [parquet]: 250 samples, 250 missing" in out
    assert main(["-q", "shards", "check", "s3://shards/cli"]) == 0
    assert "s3://shards/cli: OK" in capsys.readouterr().out
    assert main(["-q", "iterate", "s3://shards/cli", "--batch-size", "100", "--cache-dir", str(tmp_path / "c"),
                 "--cache-limit", "1"]) == 0
    assert "ShardsetDataset: 500 samples in 5 shards" in capsys.readouterr().out
    assert main(["-q", "plan", "s3://shards/cli", "--batch-size", "100", "--cache-dir", str(tmp_path / "c"),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["shards"] == 5

    cases = [(["shards", "info", "s3://no-such-bucket/ds"], "s3://no-such-bucket/ds"),
             (["iterate", "s3://shards/nothing-here"], "s3://shards/nothing-here"),
             (["shards", "check", "s3://shards/nothing-here"], "s3://shards/nothing-here")]
    for argv, where in cases:
        assert main(["-q", *argv, *(["--cache-dir", str(tmp_path / "c")] if argv[0] == "iterate" else [])]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and where in err and "Traceback" not in err
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    assert main(["-q", "shards", "info", "s3://shards/cli"]) == 2
    assert "access denied" in capsys.readouterr().err
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert main(["-q", "shards", "create", "s3://shards/x", str(table), "--uid", "uid", "--shardset", "b",
                 "--shard-size", "100"]) == 2
    assert "unreachable" in capsys.readouterr().err
    with pytest.raises(DataFileNotFoundError):
        ShardsetDataset("s3://shards/nothing-here", filesystem=store[0])
