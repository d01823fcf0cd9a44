"""The shard cache's download path: a per-thread reused buffer, then one write into the copy."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pytest

from datamill.core import objstore
from datamill.core.objstore import ShardFileCache


def _objects(folder: Path, sizes: list[int]) -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(0)
    out = []
    for i, n in enumerate(sizes):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        (folder / f"o{i}.bin").write_bytes(data)
        out.append((str(folder / f"o{i}.bin"), data))
    return out


def test_downloads_give_the_same_bytes_through_one_buffer_per_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sizes up and down (a smaller object after a larger one reuses the larger buffer), an empty
    # object, one above SCRATCH_MAX (through a buffer of its own); 4 threads at once
    monkeypatch.setattr(objstore, "SCRATCH_MAX", 50_000)
    objs = _objects(tmp_path, [30_000, 1_000, 0, 45_000, 7, 80_000, 12_345, 49_999] * 3)
    cache = ShardFileCache(pafs.LocalFileSystem(), tmp_path / "c")
    buffers: dict[int, set[int]] = {}
    calls: list[int] = []
    real = objstore._scratch

    def spy(size: int) -> memoryview:
        view = real(size)
        calls.append(size)
        buffers.setdefault(threading.get_ident(), set()).add(id(objstore._SCRATCH.buf))
        return view

    monkeypatch.setattr(objstore, "_scratch", spy)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda o: bytes(cache.read_buffer(o[0])), objs))
    assert got == [data for _, data in objs]
    assert cache.stats()["downloads"] == len({p for p, _ in objs})
    # the objects above SCRATCH_MAX and the empty ones skip the buffer; a thread's buffer is
    # grown to a new largest size (6 sizes at most), never one per download
    assert len(calls) == 18
    assert all(len(ids) <= 6 for ids in buffers.values())
    assert sum(len(ids) for ids in buffers.values()) < len(calls)
    for path, data in objs:  # the copies on disk, read back (cache hits, hashes checked)
        assert bytes(cache.read_buffer(path)) == data
    assert cache.stats()["rejected"] == 0


def test_write_behind_serves_from_memory_and_writes_the_same_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 30 KB objects, at most 100 KB waiting: the writer is held back until the reads are done, so
    # the first 3 copies wait in memory (and are read from there) and the others are written by
    # their reader, as without write-behind
    monkeypatch.setattr(objstore, "WRITE_BEHIND_MAX", 100_000)
    objs = _objects(tmp_path, [30_000] * 6 + [0])
    hold, priority = threading.Event(), []
    real_write = objstore.write_at

    def held(fd: int, data: memoryview) -> None:
        if threading.current_thread().name.startswith("datamill-cache-write"):
            priority.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            assert hold.wait(10)
        real_write(fd, data)

    monkeypatch.setattr(objstore, "write_at", held)
    cache = ShardFileCache(pafs.LocalFileSystem(), tmp_path / "c", write_behind=True)
    got = [bytes(cache.read_buffer(p)) for p, _ in objs]
    assert got == [data for _, data in objs]
    assert len(cache._pending) == 3 and cache.flush(timeout=0.01) is False
    assert [bytes(cache.read_buffer(p)) for p, _ in objs[:3]] == [d for _, d in objs[:3]]
    assert cache.stats()["downloads"] == 7 and cache.stats()["hits"] == 3  # from memory
    hold.set()
    assert cache.flush(timeout=10) and not cache._pending and cache._pending_bytes == 0
    assert priority and all(p == 19 for p in priority)  # the writer runs at the lowest priority
    again = ShardFileCache(pafs.LocalFileSystem(), tmp_path / "c")  # every copy, checked, on disk
    assert [bytes(again.read_buffer(p)) for p, _ in objs] == [d for _, d in objs]
    assert again.stats()["hits"] == 7 and again.stats()["rejected"] == 0
    assert not list((tmp_path / "c").glob(f".*{objstore.TMP_SUFFIX}"))


def test_write_behind_failed_write_leaves_the_file_uncached_and_bounded_cache_evicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = _objects(tmp_path, [20_000] * 4)
    real_write = objstore.write_at

    def full(fd: int, data: memoryview) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(objstore, "write_at", full)
    cache = ShardFileCache(pafs.LocalFileSystem(), tmp_path / "c", write_behind=True)

    def read_and_flush() -> bytes:
        got = bytes(cache.read_buffer(objs[0][0]))
        assert cache.flush(timeout=10)
        return got

    with pytest.warns(RuntimeWarning, match="could not write the local copy"):  # said once
        got = read_and_flush()
    assert got == objs[0][1]  # the read itself succeeds
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == []  # nothing half-written
    monkeypatch.setattr(objstore, "write_at", real_write)
    assert bytes(cache.read_buffer(objs[0][0])) == objs[0][1]
    assert cache.stats()["downloads"] == 2  # downloaded again, now cached
    # a bound of 2 copies: the writes finish, then the least recently used are evicted
    small = ShardFileCache(
        pafs.LocalFileSystem(), tmp_path / "s", cache_limit=40_000, write_behind=True
    )
    for p, data in objs:
        assert bytes(small.read_buffer(p)) == data
    assert small.flush(timeout=10)  # no more waiting than the bound: 2 copies at most
    assert small.stats()["bytes_cached"] <= 40_000
    assert 1 <= len(list((tmp_path / "s").glob("*.json"))) <= 2
    assert not list((tmp_path / "s").glob(f".*{objstore.TMP_SUFFIX}"))


def test_write_behind_in_a_forked_child_forgets_the_parents_waiting_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = _objects(tmp_path, [10_000] * 2)
    hold = threading.Event()
    real_write = objstore.write_at

    def held(fd: int, data: memoryview) -> None:
        assert hold.wait(10)
        real_write(fd, data)

    monkeypatch.setattr(objstore, "write_at", held)
    cache = ShardFileCache(pafs.LocalFileSystem(), tmp_path / "c", write_behind=True)
    assert bytes(cache.read_buffer(objs[0][0])) == objs[0][1]
    assert cache.flush(timeout=0.01) is False  # the parent's writer is held
    parent_writer = objstore._writer()
    child = os.getpid() + 1  # as after a fork: another process id, the parent's writer not ours
    monkeypatch.setattr(objstore.os, "getpid", lambda: child)
    assert cache.flush(timeout=0.01)  # nothing of this "process" waits
    hold.set()
    assert bytes(cache.read_buffer(objs[1][0])) == objs[1][1]  # written by a new writer
    assert cache.flush(timeout=10)
    assert objstore._WRITER[0][0] == child
    parent_writer.submit(int).result(timeout=10)  # the parent's queue (its copy of o0) is done
    assert cache._pending_bytes == 0
    monkeypatch.undo()
    again = ShardFileCache(pafs.LocalFileSystem(), tmp_path / "c")
    assert [bytes(again.read_buffer(p)) for p, _ in objs] == [d for _, d in objs]
    assert again.stats()["hits"] == 2
