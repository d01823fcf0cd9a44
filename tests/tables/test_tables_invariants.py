"""Invariants of the shared table reader (:class:`datamill.tables.common.ParquetFilesSource`) and
of table URLs, with hypothesis."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from hypothesis import given
from hypothesis import strategies as st

from datamill.tables.common import ParquetFilesSource, TableFile, parse_table_url


@given(
    files=st.lists(
        st.tuples(st.integers(1, 40), st.integers(1, 9), st.integers(0, 2**32 - 1)),
        min_size=1,
        max_size=4,
    ),
    shard_by=st.sampled_from(["file", "row_group"]),
)
def test_shards_are_the_files_rows_in_order_minus_the_deleted(
    files: list[tuple[int, int, int]], shard_by: str
) -> None:
    """Whatever the files, row groups and deletes: shard sizes count the kept rows, and the shards
    in order are every file's kept rows in order (a column missing from older files as nulls)."""
    with tempfile.TemporaryDirectory() as tmp:
        table_files, want = [], []
        start = 0
        for i, (n, group, seed) in enumerate(files):
            uid = np.arange(start, start + n, dtype=np.int64)
            start += n
            cols = {"uid": uid} if i == 0 else {"uid": uid, "extra": uid * 2}
            path = str(Path(tmp) / f"f{i}.parquet")
            pq.write_table(pa.table(cols), path, row_group_size=group)
            keep = np.random.default_rng(seed).random(n) < 0.7
            table_files.append(TableFile(path, Path(path).stat().st_size, n, keep))
            want += [(int(u), None if i == 0 else int(u) * 2) for u in uid[keep]]
        schema = pa.schema([("uid", pa.int64()), ("extra", pa.int64())])
        src = ParquetFilesSource(
            tmp,
            table_files,
            schema,
            fs=pafs.LocalFileSystem(),
            root=tmp,
            table=("delta", 0, "t"),
            shard_by=shard_by,  # type: ignore[arg-type]
        )
        got = [src.read_shard(k) for k in range(src.num_shards)]
        assert [t.num_rows for t in got] == src.shard_sizes().tolist()
        rows = [(r["uid"], r["extra"]) for t in got for r in t.to_pylist()]
        assert rows == want


@given(
    kind=st.sampled_from(["delta", "iceberg", "lance"]),
    store=st.sampled_from(["", "s3"]),
    path=st.lists(st.sampled_from(["a", "data", "t_1", "x9.lance"]), min_size=1, max_size=4).map(
        "/".join
    ),
    version=st.none() | st.integers(0, 2**62),
)
def test_table_urls_parse_back(kind: str, store: str, path: str, version: int | None) -> None:
    query = "snapshot_id" if kind == "iceberg" else "version"
    head = f"{kind}+{store}://" if store else f"{kind}:///"
    url = head + path + ("" if version is None else f"?{query}={version}")
    t = parse_table_url(url)
    assert (t.kind, t.version) == (kind, version)
    assert t.location == (f"s3://{path}" if store else f"/{path}")
