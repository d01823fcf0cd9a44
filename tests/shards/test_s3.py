"""Shardset datasets on S3 (the session's SeaweedFS on loopback): write, read through the cache,
CLI, errors."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

import datamill.core.storage as storage_mod
from datamill.cli import main
from datamill.core.errors import DataFileError, DataFileNotFoundError, ShardsetError
from datamill.core.objstore import s3_filesystem
from datamill.loader import Batching, Loader, Workers
from datamill.loader.sources import open_source
from datamill.shards import ShardsetDataset
from tests.contracts import assert_same_items, check_source
from tests.loader.test_remote import held_bytes

pytestmark = pytest.mark.server

N = 500


def _table() -> pa.Table:
    rng = np.random.default_rng(7)
    return pa.table(
        {
            "uid": np.arange(N, dtype=np.int64) * 3,
            "x": rng.normal(size=N),
            "tokens": [[int(t)] * int(t % 4) for t in rng.integers(0, 100, N)],
        }
    )


def _labels() -> pa.Table:
    uids = np.arange(N, dtype=np.int64)[::-2] * 3  # every other sample, in another order
    return pa.table({"uid": uids, "label": (uids % 5).astype(np.int32)})


@pytest.fixture(scope="module")
def store(
    seaweed: tuple[str, str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[pafs.S3FileSystem, ShardsetDataset]]:
    """Bucket ``shards`` on the server (keys in the AWS_* variables); a local twin dataset to
    compare with."""
    endpoint, key, secret = seaweed
    fs = s3_filesystem(
        endpoint=endpoint, access_key=key, secret_key=secret, allow_bucket_creation=True
    )
    fs.create_dir("shards")
    local = ShardsetDataset.create(
        tmp_path_factory.mktemp("local") / "ds", _table(), uid="uid", shardset="base", shard_size=80
    )
    local = local.add("labels", _labels(), route=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ACCESS_KEY_ID", key)
        mp.setenv("AWS_SECRET_ACCESS_KEY", secret)
        mp.setenv("AWS_ENDPOINT_URL", endpoint)
        yield fs, local


def test_create_add_and_load_from_s3_equal_the_local_dataset(
    store: tuple[pafs.S3FileSystem, ShardsetDataset], tmp_path: Path
) -> None:
    fs, local = store
    ds = ShardsetDataset.create(
        "s3://shards/ds", _table(), uid="uid", shardset="base", shard_size=80
    )
    ds = ds.add("labels", _labels(), route=True)
    assert ds.shardsets == ["base", "labels"] and ds.manifest["name"] == "ds"
    manifest = json.loads(fs.open_input_stream("shards/ds/dataset.json").read())
    assert all(len(ss["shard_xxh3"]) == len(ss["shard_bytes"]) == 7 for ss in manifest["shardsets"])
    assert [
        i.base_name
        for i in fs.get_file_info(pafs.FileSelector("shards/ds"))
        if i.base_name.startswith(".")
    ] == []

    src = open_source("s3://shards/ds", cache_dir=tmp_path / "c")
    assert isinstance(src, ShardsetDataset) and src.remote is not None
    check_source(src, reopen=lambda: ShardsetDataset("s3://shards/ds/", cache_dir=tmp_path / "c2"))
    assert (
        src.shard_sizes().tolist() == local.shard_sizes().tolist() and src.columns == local.columns
    )
    assert src.shard_nbytes().sum() == sum(
        manifest["shardsets"][i]["shard_bytes"][k] for i in range(2) for k in range(7)
    )
    for k in range(src.num_shards):
        assert src.read_shard(k, join="inner").equals(local.read_shard(k, join="inner"))
    assert src.get(3 * 17) == local.get(3 * 17)
    assert (
        pickle.loads(pickle.dumps(src)).read_shard(2).equals(src.read_shard(2))
    )  # spawned workers pickle it

    cold = ShardsetDataset("s3://shards/ds", cache_dir=tmp_path / "cold")
    cols = [
        "uid",
        "x",
        "tokens",
    ]  # (the nullable label column reads as NaN, which never equals itself)
    got = list(Loader(cold, 64, seed=5, world_size=2, rank=1, columns=cols))
    # a Loader over object storage warms up by default; with that setting the local order is equal
    local_warm = Loader(
        local, 64, seed=5, world_size=2, rank=1, columns=cols, batching=Batching(warmup=True)
    )
    assert_same_items(got, list(local_warm), "s3 vs local")
    warm = ShardsetDataset("s3://shards/ds", cache_dir=tmp_path / "cold")
    assert_same_items(
        list(Loader(warm, 64, seed=5, world_size=2, rank=1, columns=cols)), got, "warm cache"
    )
    assert cold.remote is not None and warm.remote is not None
    assert (
        cold.remote.cache.stats()["downloads"] >= 4 and warm.remote.cache.stats()["downloads"] == 0
    )
    assert warm.remote.cache.stats()["hits"] == cold.remote.cache.stats()["downloads"]


def test_cache_bound_and_no_corrupt_copy_is_used(
    store: tuple[pafs.S3FileSystem, ShardsetDataset], tmp_path: Path
) -> None:
    fs, _ = store
    if not fs.get_file_info("shards/ds/dataset.json").size:
        ShardsetDataset.create(
            "s3://shards/ds", _table(), uid="uid", shardset="base", shard_size=80
        )
    ds = ShardsetDataset("s3://shards/ds", cache_dir=tmp_path / "c", cache_limit=6_000)
    assert ds.remote is not None
    biggest = int(ds.shard_nbytes().max())
    for _ in range(2):
        for _batch in Loader(ds, 100, seed=2, columns=["uid", "x"], workers=Workers(prefetch=1)):
            held = held_bytes(tmp_path / "c")
            # the bound, plus the copies read at the moment (up to 4 with the warm-up's reads)
            assert held <= 6_000 + 4 * biggest
    stats = ds.remote.cache.stats()
    assert stats["bytes_cached"] <= 6_000 and stats["evictions"] > 0

    # a bit flipped in a cached copy: rejected and downloaded again
    want = ds.read_shard(3, columns=["uid", "x"])
    copy = next(p for p in (tmp_path / "c").iterdir() if p.name.endswith("shard.00003.parquet"))
    data = copy.read_bytes()
    copy.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert (
        ds.read_shard(3, columns=["uid", "x"]).equals(want)
        and ds.remote.cache.stats()["rejected"] == 1
    )

    # an object replaced behind the manifest's back (same rows, other bytes): the checksum refuses
    # it
    bad = ShardsetDataset.create(
        "s3://shards/tampered", _table(), uid="uid", shardset="base", shard_size=80
    )
    other = ShardsetDataset.create(
        tmp_path / "other",
        _table().slice(0, 80).set_column(1, "x", pa.array(np.zeros(80))),
        uid="uid",
        shardset="base",
        shard_size=80,
    )
    with fs.open_output_stream("shards/tampered/base/shard.00000.parquet") as f:
        f.write((tmp_path / "other" / "base" / "shard.00000.parquet").read_bytes())
    fresh = ShardsetDataset("s3://shards/tampered", cache_dir=tmp_path / "t")
    with pytest.raises(ShardsetError) as info:
        fresh.read_shard(0)
    assert (
        info.value.shard == 0 and info.value.path == "s3://shards/tampered/base/shard.00000.parquet"
    )
    assert fresh.read_shard(1).num_rows == 80 and bad.num_shards == other.num_shards + 6


def test_writes_never_leave_a_half_dataset_and_never_touch_foreign_objects(
    store: tuple[pafs.S3FileSystem, ShardsetDataset],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fs, _ = store
    ds = ShardsetDataset.create(
        "s3://shards/atomic", _table(), uid="uid", shardset="base", shard_size=100
    )
    real_put = storage_mod.upload

    def failing_put(data: storage_mod.Staged, f: pafs.FileSystem, path: str) -> None:
        if path.endswith("dataset.json"):
            raise OSError("AWS Error NETWORK_CONNECTION during PutObject operation: curlCode: 7")
        real_put(data, f, path)

    monkeypatch.setattr(storage_mod, "upload", failing_put)
    with pytest.raises(DataFileError, match="unreachable") as info:
        ds.add("labels", _labels(), route=True)
    assert info.value.path == "s3://shards/atomic"
    monkeypatch.undo()
    again = ShardsetDataset("s3://shards/atomic", cache_dir=tmp_path / "c")
    assert again.shardsets == ["base"] and again.read_shard(0).num_rows == 100
    assert fs.get_file_info(pafs.FileSelector("shards/atomic/labels", allow_not_found=True)) == []
    assert again.add("labels", _labels(), route=True).shardsets == [
        "base",
        "labels",
    ]  # a retry works
    with pytest.raises(ShardsetError, match="already exists") as dup:
        again.add("labels", _labels(), route=True)
    assert dup.value.path == "s3://shards/atomic/labels"

    with pytest.raises(ShardsetError, match="already exists"):
        ShardsetDataset.create(
            "s3://shards/atomic", _table(), uid="uid", shardset="base", shard_size=100
        )
    replaced = ShardsetDataset.create(
        "s3://shards/atomic",
        _table().slice(0, 50),
        uid="uid",
        shardset="base",
        shard_size=10,
        overwrite=True,
    )
    assert replaced.num_shards == 5 and len(replaced) == 50 and replaced.shardsets == ["base"]
    assert not fs.get_file_info(pafs.FileSelector("shards/atomic/labels", allow_not_found=True))

    with fs.open_output_stream("shards/mine/notes.txt") as f:
        f.write(b"a file of yours")
    for overwrite in (False, True):
        with pytest.raises(DataFileError, match="not a datamill shardset dataset") as refused:
            ShardsetDataset.create(
                "s3://shards/mine",
                _table(),
                uid="uid",
                shardset="base",
                shard_size=100,
                overwrite=overwrite,
            )
        assert refused.value.path == "s3://shards/mine"
    assert fs.open_input_stream("shards/mine/notes.txt").read() == b"a file of yours"


def test_cli_on_s3_and_one_line_errors(
    store: tuple[pafs.S3FileSystem, ShardsetDataset],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = tmp_path / "t.parquet"
    import pyarrow.parquet as pq

    pq.write_table(_table(), table)
    pq.write_table(_labels(), tmp_path / "labels.parquet")
    assert (
        main(
            [
                "-q",
                "shards",
                "create",
                "s3://shards/cli",
                str(table),
                "--uid",
                "uid",
                "--shardset",
                "base",
                "--shard-size",
                "120",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "-q",
                "shards",
                "add",
                "s3://shards/cli",
                "--shardset",
                "labels",
                str(tmp_path / "labels.parquet"),
                "--route",
            ]
        )
        == 0
    )
    assert main(["-q", "shards", "info", "s3://shards/cli"]) == 0
    out = capsys.readouterr().out
    assert "500 samples, 5 shards" in out and "labels [parquet]: 250 samples, 250 missing" in out
    assert main(["-q", "shards", "check", "s3://shards/cli"]) == 0
    assert "s3://shards/cli: OK" in capsys.readouterr().out
    assert (
        main(
            [
                "-q",
                "iterate",
                "s3://shards/cli",
                "--batch-size",
                "100",
                "--cache-dir",
                str(tmp_path / "c"),
                "--cache-limit",
                "1",
            ]
        )
        == 0
    )
    assert "ShardsetDataset: 500 samples in 5 shards" in capsys.readouterr().out
    assert (
        main(
            [
                "-q",
                "plan",
                "s3://shards/cli",
                "--batch-size",
                "100",
                "--cache-dir",
                str(tmp_path / "c"),
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["settings"]["shards"] == 5

    cases = [
        (["shards", "info", "s3://no-such-bucket/ds"], "s3://no-such-bucket/ds"),
        (["iterate", "s3://shards/nothing-here"], "s3://shards/nothing-here"),
        (["shards", "check", "s3://shards/nothing-here"], "s3://shards/nothing-here"),
    ]
    for argv, where in cases:
        assert (
            main(
                [
                    "-q",
                    *argv,
                    *(["--cache-dir", str(tmp_path / "c")] if argv[0] == "iterate" else []),
                ]
            )
            == 2
        )
        err = capsys.readouterr().err
        assert err.startswith("error: ") and where in err and "Traceback" not in err
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    assert main(["-q", "shards", "info", "s3://shards/cli"]) == 2
    assert "access denied" in capsys.readouterr().err
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert (
        main(
            [
                "-q",
                "shards",
                "create",
                "s3://shards/x",
                str(table),
                "--uid",
                "uid",
                "--shardset",
                "b",
                "--shard-size",
                "100",
            ]
        )
        == 2
    )
    assert "unreachable" in capsys.readouterr().err
    with pytest.raises(DataFileNotFoundError):
        ShardsetDataset("s3://shards/nothing-here", filesystem=store[0])


def _keys(fs: pafs.S3FileSystem, prefix: str) -> list[str]:
    sel = pafs.FileSelector(prefix, allow_not_found=True, recursive=True)
    return sorted(
        i.path[len(prefix) + 1 :] for i in fs.get_file_info(sel) if i.type == pafs.FileType.File
    )


def test_an_interrupted_overwrite_keeps_the_previous_dataset_and_a_finished_one_removes_it(
    store: tuple[pafs.S3FileSystem, ShardsetDataset],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """S3 has no rename: an overwrite uploads the new dataset whole to a fresh ``.gen-<hex>``
    folder, switches with one PUT of ``dataset.json`` and then deletes the old objects."""
    from datamill.shards.check import check_dataset

    fs, _ = store
    old = ShardsetDataset.create(
        "s3://shards/gen", _table(), uid="uid", shardset="base", shard_size=100
    )
    old = old.add("labels", _labels(), route=True)
    before = old.read_shard(2)
    real_put = storage_mod.upload

    def failing_switch(data: storage_mod.Staged, f: pafs.FileSystem, path: str) -> None:
        if (
            path == "shards/gen/dataset.json"
        ):  # the switch (the generation's own manifest goes through)
            raise OSError("AWS Error NETWORK_CONNECTION during PutObject operation: curlCode: 7")
        real_put(data, f, path)

    monkeypatch.setattr(storage_mod, "upload", failing_switch)
    with pytest.raises(DataFileError, match="unreachable"):
        ShardsetDataset.create(
            "s3://shards/gen",
            _table().slice(0, 50),
            uid="uid",
            shardset="base",
            shard_size=10,
            overwrite=True,
        )
    monkeypatch.undo()
    kept = ShardsetDataset(
        "s3://shards/gen", cache_dir=tmp_path / "c"
    )  # the previous dataset, whole
    assert (
        kept.shardsets == ["base", "labels"]
        and len(kept) == N
        and kept.read_shard(2).equals(before)
    )
    orphans = {k.split("/")[0] for k in _keys(fs, "shards/gen") if k.startswith(".gen-")}
    assert len(orphans) == 1  # the unfinished generation, not listed anywhere

    new = ShardsetDataset.create(
        "s3://shards/gen",
        _table().slice(0, 50),
        uid="uid",
        shardset="base",
        shard_size=10,
        overwrite=True,
    )
    gen = new.manifest["data_dir"]
    assert gen.startswith(".gen-") and gen not in orphans
    assert new.num_shards == 5 and len(new) == 50 and new.shardsets == ["base"]
    keys = _keys(
        fs, "shards/gen"
    )  # the old dataset and the orphan are gone; one manifest, at the root
    assert keys == sorted(
        [
            "dataset.json",
            f"{gen}/samples.parquet",
            *[f"{gen}/base/shard.{k:05d}.parquet" for k in range(5)],
        ]
    )
    assert new.read_shard(4).column("uid").to_pylist() == (np.arange(40, 50) * 3).tolist()

    added = new.add(
        "labels", _labels().filter(pa.compute.less(_labels().column("uid"), 150)), route=True
    )
    assert added.shardsets == ["base", "labels"] and added.manifest["data_dir"] == gen
    assert f"{gen}/labels/shard.00000.parquet" in _keys(fs, "shards/gen")
    fresh = ShardsetDataset("s3://shards/gen", cache_dir=tmp_path / "c2")
    assert fresh.read_shard(0).column("label").null_count == 5  # uids 0..27: 5 of 10 labelled
    assert (
        sum(b["uid"].shape[0] for b in Loader(fresh, 16, seed=1, batching=Batching(shuffle=True)))
        == 50
    )
    assert check_dataset(fresh.loc) == []
    assert main(["-q", "shards", "check", "s3://shards/gen"]) == 0
    assert "OK" in capsys.readouterr().out
    desc = fresh.describe()
    assert (
        desc["shardsets"][0]["bytes"]
        == sum(
            i.size
            for i in fs.get_file_info(pafs.FileSelector(f"shards/gen/{gen}/base", recursive=True))
            if i.type == pafs.FileType.File
        )
        > 0
    )
    with fs.open_output_stream("shards/gen/stray.txt") as f:  # an object the overwrite did not list
        f.write(b"x")
    assert any(
        "not listed" in str(e) and e.path == "s3://shards/gen/stray.txt"
        for e in check_dataset(fresh.loc)
    )

    third = ShardsetDataset.create(
        "s3://shards/gen", _table(), uid="uid", shardset="base", shard_size=250, overwrite=True
    )
    assert third.manifest["data_dir"] != gen and len(third) == N
    assert not [k for k in _keys(fs, "shards/gen") if k.startswith(gen) or k == "stray.txt"]

    bad = dict(third.manifest, data_dir="../other")  # a manifest naming a path outside: refused
    with fs.open_output_stream("shards/gen/dataset.json") as f:
        f.write(json.dumps(bad).encode())
    with pytest.raises(ShardsetError, match="data_dir"):
        ShardsetDataset("s3://shards/gen", cache_dir=tmp_path / "c3")


def test_kill_9_between_upload_and_switch_keeps_the_previous_dataset(
    store: tuple[pafs.S3FileSystem, ShardsetDataset], tmp_path: Path
) -> None:
    """``datamill shards create --overwrite`` killed (SIGKILL) after the new generation is uploaded
    and before ``dataset.json`` switches: the previous dataset is intact; the next overwrite
    succeeds and leaves only the new dataset."""
    import os
    import signal
    import subprocess
    import sys

    import pyarrow.parquet as pq

    fs, _ = store
    old = ShardsetDataset.create(
        "s3://shards/killed", _table(), uid="uid", shardset="base", shard_size=100
    )
    pq.write_table(_table().slice(0, 60), tmp_path / "small.parquet")
    argv = [
        sys.executable,
        "-c",
        "import sys; from datamill.cli import run; run()",
        "-q",
        "shards",
        "create",
        "s3://shards/killed",
        str(tmp_path / "small.parquet"),
        "--uid",
        "uid",
        "--shardset",
        "base",
        "--shard-size",
        "20",
        "--overwrite",
    ]
    env = {**os.environ, "DATAMILL_FAULT": "shards.remote_before_switch"}
    proc = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    kept = ShardsetDataset("s3://shards/killed", cache_dir=tmp_path / "c")
    assert kept.manifest == old.manifest and kept.read_shard(4).num_rows == 100
    assert any(k.startswith(".gen-") for k in _keys(fs, "shards/killed"))  # the unlisted generation
    env.pop("DATAMILL_FAULT")
    subprocess.run(argv, check=True, env=env, capture_output=True, text=True, timeout=120)
    new = ShardsetDataset("s3://shards/killed", cache_dir=tmp_path / "c2")
    assert len(new) == 60 and new.num_shards == 3
    assert {k.split("/")[0] for k in _keys(fs, "shards/killed")} == {
        "dataset.json",
        new.manifest["data_dir"],
    }


def test_a_generation_dataset_copied_to_disk_reads_there_and_refuses_a_local_add(
    store: tuple[pafs.S3FileSystem, ShardsetDataset], tmp_path: Path
) -> None:
    fs, _ = store
    ShardsetDataset.create(
        "s3://shards/copied", _table(), uid="uid", shardset="base", shard_size=100
    )
    remote = ShardsetDataset.create(
        "s3://shards/copied", _table(), uid="uid", shardset="base", shard_size=125, overwrite=True
    )
    assert remote.manifest["data_dir"].startswith(".gen-")
    for key in _keys(fs, "shards/copied"):  # as `aws s3 sync` would copy it
        (tmp_path / "ds" / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "ds" / key).write_bytes(fs.open_input_stream(f"shards/copied/{key}").read())
    local = ShardsetDataset(tmp_path / "ds")
    assert local.num_shards == 4 and local.read_shard(3).equals(remote.read_shard(3))
    with pytest.raises(ShardsetError, match="keeps its files in") as info:
        local.add("labels", _labels(), route=True)
    assert info.value.path == str(tmp_path / "ds")
    assert ShardsetDataset(tmp_path / "ds").shardsets == ["base"]  # nothing changed


@pytest.mark.parametrize(("fmt", "folder"), [("mds", "mds"), ("webdataset", "wds")])
def test_shards_create_from_a_peer_folder_on_s3(
    store: tuple[pafs.S3FileSystem, ShardsetDataset], tmp_path: Path, fmt: str, folder: str
) -> None:
    """``datamill shards create --from mds s3://...``: peer imports read through the seam."""
    from datamill.shards.peers import read_peer

    fs, _ = store
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / folder
    for f in sorted(fixture.iterdir()):
        with fs.open_output_stream(f"shards/peer-{fmt}/{f.name}") as out:
            out.write(f.read_bytes())
    out_root = tmp_path / "ds"
    args = ["-q", "shards", "create", str(out_root), "--uid", "uid", "--shardset", "s"]
    args += ["--shard-size", "5", "--from", fmt, f"s3://shards/peer-{fmt}"]
    assert main(args + (["--add-uid"] if fmt == "webdataset" else [])) == 0
    got = ShardsetDataset(out_root).to_table()
    want = read_peer(fmt, fixture)
    assert got.drop_columns(["uid"] if fmt == "webdataset" else []).equals(
        want.select([c for c in got.column_names if c != "uid" or fmt != "webdataset"])
    )
    with pytest.raises(DataFileNotFoundError, match="index.json"):
        read_peer("mds", "s3://shards/no-such-peer")
