"""Delta, Iceberg and Lance tables on S3 (the session's SeaweedFS on loopback): read through the
shard cache (Delta, Iceberg), the same rows as the local build, and a pinned version resumed after
an append."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from datamill.loader import Loader
from datamill.sources import open_source
from datamill.tables import pinned_version
from tests.contracts import assert_same_items
from tests.tables.formats import FORMATS, rows

pytestmark = pytest.mark.server

BUCKET = "tables"


@pytest.fixture(scope="module")
def s3(s3_bucket: tuple[Any, dict[str, str]]) -> dict[str, str]:
    """Bucket ``tables`` (tests/conftest.py); the AWS_* variables point at the server."""
    return s3_bucket[1]


def _writer(kind: str, s3: dict[str, str], tmp: Path) -> Any:
    root = f"s3://{BUCKET}/{tmp.name}"
    if kind == "delta":
        return FORMATS["delta"](
            root,  # type: ignore[arg-type]
            {
                "AWS_ENDPOINT_URL": s3["endpoint"],
                "AWS_ACCESS_KEY_ID": s3["key"],
                "AWS_SECRET_ACCESS_KEY": s3["secret"],
                "AWS_REGION": "us-east-1",
                "AWS_ALLOW_HTTP": "true",
                "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
            },
        )
    if kind == "iceberg":
        return FORMATS["iceberg"](
            tmp,
            {
                "warehouse": f"{root}/wh",
                "s3.endpoint": s3["endpoint"],
                "s3.access-key-id": s3["key"],
                "s3.secret-access-key": s3["secret"],
                "s3.region": "us-east-1",
            },
        )
    return FORMATS["lance"](
        root,  # type: ignore[arg-type]
        {
            "endpoint": s3["endpoint"],
            "access_key_id": s3["key"],
            "secret_access_key": s3["secret"],
            "region": "us-east-1",
            "allow_http": "true",
        },
    )


@pytest.mark.parametrize("kind", list(FORMATS))
def test_a_table_on_s3_reads_through_the_cache_and_resumes_its_pinned_version(
    kind: str, s3: dict[str, str], tmp_path: Path
) -> None:
    t = _writer(kind, s3, tmp_path)
    for i in range(3):
        t.write(rows(i * 20, (i + 1) * 20))
    location = t.path
    assert location.startswith("s3://")
    cache = tmp_path / "cache"
    src = open_source(f"{kind}+{location}", cache_dir=cache)
    assert src.shard_sizes().tolist() == [20, 20, 20]
    table = pa.concat_tables(src.read_shard(k) for k in range(3))
    assert sorted(table["uid"].to_pylist()) == list(range(60))
    again = open_source(f"{kind}+{location}", cache_dir=cache)
    assert again.fingerprint() == src.fingerprint()
    _ = [again.read_shard(k, columns=["x"]) for k in range(3)]
    if kind == "lance":  # the version's manifest and 3 data files, mirrored once
        assert (src.fetched, again.fetched) == (4, 0)
    else:
        assert src.cache.stats()["downloads"] == 3
        assert again.cache.stats()["hits"] == 3 and again.cache.stats()["downloads"] == 0

    loader = Loader(src, 8, seed=9)
    it = iter(loader)
    _ = [next(it) for _ in range(2)]
    state = json.loads(json.dumps(loader.state_dict()))
    tail = list(it)
    t.write(rows(60, 70))
    _, version = pinned_version(state)
    query = "snapshot_id" if kind == "iceberg" else "version"
    pinned = open_source(f"{kind}+{location}?{query}={version}", cache_dir=cache)
    resumed = Loader(pinned, 8, seed=9)
    resumed.load_state_dict(state)
    assert_same_items(list(resumed), tail, "tail after resuming on S3")


def test_lance_fragments_mirrored_from_s3_by_several_readers_at_once(
    s3: dict[str, str], tmp_path: Path
) -> None:
    """Regression: the shard readers fetch fragments at once, and each first fetch links the
    version's manifest too: two threads renamed one temporary name (FileNotFoundError)."""
    t = _writer("lance", s3, tmp_path)
    for i in range(6):
        t.write(rows(i * 10, (i + 1) * 10))
    src = open_source(f"lance+{t.path}", cache_dir=tmp_path / "cache")
    barrier = threading.Barrier(6)

    def read(k: int) -> pa.Table:
        barrier.wait(timeout=30)
        return src.read_shard(k)

    with ThreadPoolExecutor(6) as pool:
        tables = list(pool.map(read, range(6)))
    assert sorted(pa.concat_tables(tables)["uid"].to_pylist()) == list(range(60))
