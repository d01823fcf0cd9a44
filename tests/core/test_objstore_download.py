"""The shard cache's download path: a per-thread reused buffer, then one write into the copy."""

from __future__ import annotations

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
