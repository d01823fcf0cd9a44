"""Direct clients verify what they read (issue #43 point 3): the server records the content
identity of a dataset registered with a client location, and a direct client checks its copy
against it before it builds a batch: another dataset's copy of the same shape is a located error
and no batch, an unchanged copy trains as before."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from datamill.client import Client, Leases, RemoteLoader, Transport
from datamill.core.errors import DataFileError
from datamill.shards.dataset import ShardsetDataset

pytestmark = pytest.mark.server

ROWS = 400


def _table(scale: float) -> pa.Table:
    """The same shape whatever ``scale`` (same UIDs, columns, types and row counts)."""
    uid = np.arange(ROWS, dtype=np.int64)
    return pa.table({"uid": uid, "x": (uid * scale).astype(np.float32)})


@pytest.fixture(scope="module")
def pair(server: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Datasets ``ida`` and ``idb`` of one shape and other values; ``ida`` registered with a
    client location holding a copy of it."""
    root, copies = server["root"], tmp_path_factory.mktemp("client-copies")
    for name, scale in (("ida", 1.0), ("idb", -3.0)):
        ShardsetDataset.create(
            root / name, _table(scale), uid="uid", shardset="main", shard_size=100
        )
    copy = copies / "ida"
    shutil.copytree(root / "ida", copy)
    with Client(server["url"], server["admin"]) as c:
        c.register("ida", name="ida", client_location=str(copy))
    return {**server, "copy": copy}


def _loader(srv: dict[str, Any], name: str) -> RemoteLoader:
    return RemoteLoader(
        srv["url"],
        srv["read"],
        "ida",
        batch_size=50,
        seed=1,
        collate="arrow",
        leases=Leases(name=name, size=4),
        transport=Transport("direct", reconnect_s=10),
    )


def test_an_unchanged_copy_trains_and_another_datasets_copy_is_refused(
    pair: dict[str, Any],
) -> None:
    with Client(pair["url"], pair["read"]) as c:
        info = c.location_info("ida")
    ident = info["identity"]
    assert info["location"] == str(pair["copy"]) and ident["format"] == "datamill.identity/1"
    assert any(name.endswith(".parquet") for name in ident["files"])  # one entry per shard file
    # an unchanged copy: the server-built batches, as before
    built = RemoteLoader(
        pair["url"], pair["read"], "ida", batch_size=50, seed=1, collate="arrow",
        leases=Leases(name="id-built", size=4),
    )  # fmt: skip
    want = [b.column("x").to_pylist() for b in built]
    got = [b.column("x").to_pylist() for b in _loader(pair, "id-same")]
    assert got == want and len(got) == ROWS // 50
    # the location now holds dataset B's copy (same shape, same UIDs, other values)
    shutil.rmtree(pair["copy"])
    shutil.copytree(pair["root"] / "idb", pair["copy"])
    loader = _loader(pair, "id-other")
    yielded: list[Any] = []
    with pytest.raises(DataFileError) as err:
        yielded.extend(loader)
    assert yielded == []
    e = err.value
    assert e.path == str(pair["copy"]) and e.shard is not None and e.shard.endswith(".parquet")
    text = str(e)
    assert "'ida'" in text and "expected size" in text and "found size" in text
    assert e.hint is not None and "client_location" in e.hint
    # a copy of A again: trains again
    shutil.rmtree(pair["copy"])
    shutil.copytree(pair["root"] / "ida", pair["copy"])
    assert [b.column("x").to_pylist() for b in _loader(pair, "id-back")] == want


def test_a_shard_rewritten_between_epochs_is_refused_at_the_next_epoch(
    pair: dict[str, Any], tmp_path: Path
) -> None:
    loader = _loader(pair, "id-epochs")
    assert len(list(loader)) == ROWS // 50  # epoch 0 from an unchanged copy
    shard = min(pair["copy"].rglob("*.parquet"))
    twin = min((pair["root"] / "idb").rglob("*.parquet"))  # same shape, other values
    saved = tmp_path / "saved.parquet"
    shutil.copy(shard, saved)
    shutil.copy(twin, shard)
    try:
        with pytest.raises(DataFileError, match="not the data the server registered"):
            next(iter(loader))  # epoch 1: checked again before its first batch
    finally:
        shutil.copy(saved, shard)


def test_an_epoch_rereads_the_copy_only_when_a_files_stat_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-epoch recheck of a local copy: unchanged files (same inode, size, mtime, ctime) are
    not read again; a file rewritten since is checked by content (and refused), as is every file
    while one changed within the racy interval."""
    from datamill.client import direct
    from datamill.core.identity import content_identity
    from datamill.loader.runs import SERVICE_FIELDS, service_key

    copy = tmp_path / "copy"
    ShardsetDataset.create(copy, _table(1.0), uid="uid", shardset="main", shard_size=100)
    ident = content_identity(copy)
    from datamill.core import identity

    reads: list[int] = []
    check = identity.check_identity  # imported by the client where it is used: patched here

    def counted(*args: Any, **kwargs: Any) -> None:
        reads.append(1)
        check(*args, **kwargs)

    monkeypatch.setattr(identity, "check_identity", counted)
    cfg = dict.fromkeys((*SERVICE_FIELDS, "plan_world"), 0)
    builds = direct.DirectBuilds(cache_dir=None, cache_limit=0)
    builds._service = (service_key(cfg, 0), None)
    builds._checked = (str(copy), ident)
    assert direct._stamp(str(copy), ident) is None  # just written: racy, read by content
    assert builds.recheck(cfg, name="d") and len(reads) == 1
    monkeypatch.setattr(direct, "_RACY_NS", 0)
    assert builds.recheck(cfg, name="d") and len(reads) == 2  # no stamp yet: read, stamped
    assert builds.recheck(cfg, name="d") and len(reads) == 2  # unchanged: no file read
    shard = min(copy.rglob("*.parquet"))
    data = shard.read_bytes()
    shard.write_bytes(data[:-20] + bytes(20))  # same size, another footer
    with pytest.raises(DataFileError, match="not the data the server registered"):
        builds.recheck(cfg, name="d")
    assert len(reads) == 3
