"""The storage contract, run against every scheme of ``datamill.core.storage.SCHEMES``.

Each scheme gets a fresh root URL (a local folder, the same folder as ``file://``, an in-memory
bucket, a bucket on SeaweedFS on loopback) and must: give a filesystem and a path for it, publish
with ``upload``, translate a missing object into a located ``DataFileNotFoundError``, and carry the
real readers and writers: a shardset dataset created, added to and reopened, a Parquet object opened
by ``open_source``, a BERT Parquet written there and read back, a preprocessing input read from
there. A new scheme passes by adding its row to ``SCHEMES`` and a root below.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from datamill.core.errors import ConfigError, DataFileNotFoundError, DatamillError, ShardsetError
from datamill.core.memfs import reset_memory
from datamill.core.storage import (
    SCHEMES,
    filesystem_for,
    is_remote,
    new_generation,
    publish,
    scheme_of,
    storage_error,
    upload,
)
from datamill.loader import Loader, open_source, read_batches
from datamill.shards import ShardsetDataset

ROOTS = ["file", "file-url", "memory", "s3"]


@pytest.fixture(scope="module")
def s3_root(seaweed: tuple[str, str, str]) -> Iterator[str]:
    from datamill.core.s3 import s3_filesystem

    endpoint, key, secret = seaweed
    s3_filesystem(
        endpoint=endpoint, access_key=key, secret_key=secret, allow_bucket_creation=True
    ).create_dir("contract")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ACCESS_KEY_ID", key)
        mp.setenv("AWS_SECRET_ACCESS_KEY", secret)
        mp.setenv("AWS_ENDPOINT_URL", endpoint)
        yield "s3://contract"


@pytest.fixture(params=ROOTS)
def root(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A fresh, empty root URL of one scheme (the shard cache in tmp_path)."""
    monkeypatch.setenv("DATAMILL_CACHE_DIR", str(tmp_path / "cache"))
    name = request.param
    if name == "s3":
        request.applymarker(pytest.mark.slow)
        yield f"{request.getfixturevalue('s3_root')}/{uuid.uuid4().hex}"
    elif name == "memory":
        yield f"memory://bucket/{uuid.uuid4().hex}"
        reset_memory()
    else:
        (tmp_path / "root").mkdir()
        yield str(tmp_path / "root") if name == "file" else f"file://{tmp_path / 'root'}"


def test_every_scheme_has_a_root_here() -> None:
    assert {scheme_of(r).name for r in ("/x", "file:///x", "memory://b/x", "s3://b/x")} == set(
        SCHEMES
    )


def test_filesystem_upload_and_errors(root: str, tmp_path: Path) -> None:
    fs, path = filesystem_for(f"{root}/a/b.bin")
    assert is_remote(root) == SCHEMES[scheme_of(root).name].remote
    if not is_remote(root):
        Path(path).parent.mkdir(parents=True)
    upload(b"hello", fs, path)
    local = tmp_path / "local.bin"
    local.write_bytes(b"x" * (9 << 20))  # more than one upload chunk
    upload(local, fs, path + ".big")
    with fs.open_input_file(path) as f:
        assert f.read() == b"hello"
    assert fs.get_file_info(path + ".big").size == 9 << 20
    missing = f"{root}/nothing/here.parquet"
    mfs, mpath = filesystem_for(missing)
    with pytest.raises(OSError) as info:
        mfs.open_input_file(mpath)
    err = storage_error(info.value, missing)
    assert isinstance(err, DataFileNotFoundError) and err.path == missing


def test_unknown_scheme_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="memory://") as info:
        filesystem_for("gs://bucket/x")
    assert "s3://" in str(info.value) and not is_remote("gs://bucket/x")


def test_shardset_dataset_written_added_and_read_back(root: str) -> None:
    url = f"{root}/ds"
    table = pa.table({"uid": np.arange(50), "x": np.arange(50) * 2})
    ds = ShardsetDataset.create(url, table, uid="uid", shardset="a", shard_size=16)
    ds = ds.add(
        "b", pa.table({"uid": np.arange(50)[::-1].copy(), "y": np.arange(50)[::-1] * 3}), route=True
    )
    again = open_source(url)
    assert isinstance(again, ShardsetDataset) and again.num_shards == 4
    got = pa.concat_tables(again.read_shard(k) for k in range(again.num_shards)).sort_by("uid")
    assert got.column("x").to_pylist() == table.column("x").to_pylist()
    assert got.column("y").to_pylist() == [3 * u for u in range(50)]
    seen = sorted(u for b in Loader(again, 8, seed=1) for u in b["uid"].tolist())
    assert seen == list(range(50))


def test_parquet_object_opens_as_a_source(root: str, tmp_path: Path) -> None:
    table = pa.table({"a": np.arange(30), "b": [f"s{i}" for i in range(30)]})
    local = tmp_path / "t.parquet"
    pq.write_table(table, local, row_group_size=10)
    url = f"{root}/pq/t.parquet"
    fs, path = filesystem_for(url)
    if not is_remote(url):
        Path(path).parent.mkdir(parents=True)
    upload(local, fs, path)
    src = open_source(url)
    got = pa.concat_tables(src.read_shard(k) for k in range(src.num_shards))
    assert got.column("a").to_pylist() == list(range(30))


def test_bert_output_written_there_and_read_back(root: str, tmp_path: Path) -> None:
    from datamill.pretrain.bert import build_bert_samples

    raw = tmp_path / "raw.txt"
    raw.write_text(
        " = A = \n the cat sat on the mat . \n the dog ran far away . \n"
        " = B = \n a bird sang in the old tree . \n the sun rose over the hill . \n" * 3,
        encoding="utf-8",
    )
    out = f"{root}/bert/b.parquet"
    if not is_remote(out):
        Path(filesystem_for(out)[1]).parent.mkdir(parents=True)
    build_bert_samples(raw, out=out, vocab_size=60, max_seq_length=16, dupe_factor=2)
    fs, path = filesystem_for(out)
    assert fs.get_file_info(path).type == pafs.FileType.File
    assert fs.get_file_info(path.replace(".parquet", ".tokenizer.json")).type == pafs.FileType.File
    if not is_remote(out):  # (object stores: the loader reads Parquet objects through the cache)
        batch = next(iter(read_batches(out, 2, seed=0)))
        assert batch["tokens"].shape == (2, 16)


def test_preprocessing_input_read_from_there(root: str, tmp_path: Path) -> None:
    from datamill.preprocessing.api import preprocess

    table = pa.table({"size": np.arange(40) * 1.0, "label": np.arange(40) % 2 == 0})
    local = tmp_path / "in.parquet"
    pq.write_table(table, local)
    url = f"{root}/in/in.parquet"
    fs, path = filesystem_for(url)
    if not is_remote(url):
        Path(path).parent.mkdir(parents=True)
    upload(local, fs, path)
    config = {
        "input_features": [{"name": "size", "type": "number"}],
        "output_features": [{"name": "label", "type": "binary"}],
        "preprocessing": {"split": {"type": "none"}},
    }
    got = preprocess(url if is_remote(url) else path, config, skip_save=True).data
    want = preprocess(local, config, skip_save=True).data
    assert all(np.array_equal(got[k], want[k]) for k in want)


# ------------------------------------------------------------------------------ the write side
def _fs_root(root: str) -> tuple[pafs.FileSystem, str]:
    fs, path = filesystem_for(root)
    if not is_remote(root):
        Path(path).mkdir(parents=True, exist_ok=True)
    return fs, path


def _read(fs: pafs.FileSystem, path: str) -> bytes | None:
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(path) as f:
        return bytes(f.read())


def test_publish_puts_the_commit_marker_after_every_object(root: str, tmp_path: Path) -> None:
    fs, path = _fs_root(root)
    gen = new_generation()
    staged = tmp_path / "shard.bin"
    staged.write_bytes(b"s" * 1000)
    objects = [(b"a", f"{path}/{gen}/a.bin"), (staged, f"{path}/{gen}/shard.bin")]
    seen: list[tuple[bytes | None, ...]] = []

    def before() -> None:  # every object is there, the marker not yet
        seen.append(tuple(_read(fs, p) for _, p in objects) + (_read(fs, f"{path}/done"),))

    publish(fs, objects, (gen.encode(), f"{path}/done"), url=root, before_commit=before)
    assert seen == [(b"a", b"s" * 1000, None)]
    # the marker names the generation: a reader finds the objects through it
    marker = _read(fs, f"{path}/done")
    assert marker == gen.encode() and _read(fs, f"{path}/{marker.decode()}/a.bin") == b"a"


def test_a_failed_publish_leaves_the_previous_output_whole(root: str, tmp_path: Path) -> None:
    fs, path = _fs_root(root)
    upload(b"old", fs, f"{path}/done")
    gen = new_generation()
    first, kept = f"{path}/{gen}/a.bin", f"{path}/.marker"
    # an upload fails part-way (a staged file is gone): what was uploaded is removed, but `keep`
    with pytest.raises(DatamillError) as info:
        publish(
            fs,
            [(b"m", kept), (b"a", first), (tmp_path / "gone.bin", f"{path}/{gen}/b.bin")],
            (b"new", f"{path}/done"),
            url=root,
            keep=[kept],
        )
    assert str(tmp_path / "gone.bin") in str(info.value) or root in str(info.value)
    assert _read(fs, first) is None and _read(fs, kept) == b"m"
    assert _read(fs, f"{path}/done") == b"old"
    # the last check refuses (somebody else committed meanwhile): its error, nothing committed
    refused = ShardsetError("the manifest changed meanwhile", path=root)

    def changed() -> None:
        raise refused

    with pytest.raises(ShardsetError) as again:
        publish(fs, [(b"a", first)], (b"new", f"{path}/done"), url=root, before_commit=changed)
    assert again.value is refused and _read(fs, first) is None
    assert _read(fs, f"{path}/done") == b"old"
