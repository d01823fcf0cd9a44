"""Delta, Iceberg and Lance sources: the Source contract, exact resume of a pinned version across an
append and a compaction, elastic resume, deletes, schema evolution and vacuumed versions."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from datamill.core.errors import DataFileError, DataFileNotFoundError, ResumeStateError
from datamill.loader import Loader
from datamill.sources import open_source
from datamill.tables import pinned_version
from tests.contracts import assert_same_items, check_resume, check_source
from tests.tables.formats import FORMATS, add_deletion_vector, add_iceberg_deletes, build, rows

KINDS = list(FORMATS)


def _uids(batches: list[dict[str, Any]]) -> list[int]:
    return [int(u) for b in batches for u in b["uid"]]


@pytest.mark.parametrize("kind", KINDS)
def test_source_contract(kind: str, tmp_path: Path) -> None:
    t = build(kind, tmp_path / "a")
    other = build(kind, tmp_path / "b", parts=2)
    src = t.open()
    assert src.num_shards == 3 and src.shard_sizes().tolist() == [20, 20, 20]
    check_source(src, reopen=lambda: t.open(src.version), different=other.open())
    assert src.fingerprint().startswith(f"{kind}@v{src.version}-")
    # the same version through the registry: its folder, its pinned URL
    assert open_source(src.pinned_url).fingerprint() == src.fingerprint()
    assert open_source(t.path).fingerprint() == src.fingerprint()
    # spawned DataLoader workers and Ray tasks get the source pickled
    copy = pickle.loads(pickle.dumps(src))
    assert copy.read_shard(2).equals(src.read_shard(2)) and copy.fingerprint() == src.fingerprint()


@pytest.mark.parametrize("kind", KINDS)
def test_exact_resume_mid_epoch_after_an_append_an_overwrite_and_a_compaction(
    kind: str, tmp_path: Path
) -> None:
    t = build(kind, tmp_path)
    src = t.open()
    loader = Loader(src, 7, seed=5)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    record = loader.run_record()
    tail = list(it)
    assert sorted(_uids(head + tail)) == list(range(60))

    t.write(rows(60, 75))  # the table moves on: an append, an overwrite, then a compaction
    t.write(rows(100, 130), mode="overwrite")
    t.write(rows(130, 140))
    t.compact()
    latest = t.open()
    assert latest.version != src.version and int(latest.shard_sizes().sum()) == 40
    with pytest.raises(ResumeStateError, match="dataset_fingerprint"):
        Loader(latest, 7, seed=5).load_state_dict(state)

    assert pinned_version(state) == pinned_version(record) == (kind, src.version)
    resumed = Loader(t.open(pinned_version(state)[1]), 7, seed=5)
    resumed.load_state_dict(state)
    assert_same_items(list(resumed), tail, "tail after resuming the pinned version")


@pytest.mark.parametrize("kind", KINDS)
def test_elastic_resume_over_another_world_size(kind: str, tmp_path: Path) -> None:
    src = build(kind, tmp_path).open()
    old = [Loader(src, 4, seed=2, rank=r, world_size=2) for r in range(2)]
    seen = [u for ld in old for u in _uids([next(iter(ld))])]
    states = [json.loads(json.dumps(ld.state_dict())) for ld in old]
    new = [Loader(src, 4, seed=2, rank=r, world_size=3) for r in range(3)]
    rest = []
    for ld in new:
        ld.load_state_dict(states)
        rest += _uids(list(ld))
    assert sorted(seen + rest) == list(range(60))


@pytest.mark.parametrize("kind", KINDS)
def test_a_vacuumed_version_is_refused_naming_it(kind: str, tmp_path: Path) -> None:
    t = build(kind, tmp_path)
    old = t.open().version
    t.compact()
    t.vacuum()
    what = "snapshot" if kind == "iceberg" else "version"
    with pytest.raises(DataFileNotFoundError, match=f"{what} {old}") as info:
        t.open(old)
    assert info.value.shard == f"{what} {old}" and info.value.path is not None
    assert int(t.open().shard_sizes().sum()) == 60  # the current version still reads


@pytest.mark.parametrize("kind", KINDS)
def test_deletes_are_honoured_and_earlier_versions_keep_the_rows(kind: str, tmp_path: Path) -> None:
    t = build(kind, tmp_path)
    before = t.open()
    t.delete("uid < 5 or uid = 33")
    after = t.open()
    assert int(after.shard_sizes().sum()) == 54
    got = sorted(
        int(u) for k in range(after.num_shards) for u in after.read_shard(k)["uid"].to_pylist()
    )
    assert got == [u for u in range(60) if not (u < 5 or u == 33)]
    assert int(before.shard_sizes().sum()) == 60  # the version opened before still has them
    assert sorted(_uids(list(Loader(after, 8, seed=1)))) == got


def test_delta_deletion_vectors_are_applied(tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    path = tmp_path / "dv"
    config = {"delta.enableDeletionVectors": "true"}
    write_deltalake(str(path), rows(0, 20), configuration=config)
    write_deltalake(str(path), rows(20, 30), mode="append")
    adds = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).to_pylist()
    first = next(a["path"] for a in adds if a["num_records"] == 20)
    add_deletion_vector(path, {first: [0, 3, 7]})
    src = open_source(path)
    assert sorted(src.shard_sizes().tolist()) == [10, 17]
    uids = sorted(u for k in range(src.num_shards) for u in src.read_shard(k)["uid"].to_pylist())
    assert uids == [u for u in range(30) if u not in (0, 3, 7)]
    assert src.read_shard(0, columns=["label"]).num_rows == src.shard_sizes()[0]
    old = open_source(f"delta://{path}?version=1")
    assert int(old.shard_sizes().sum()) == 30 and old.fingerprint() != src.fingerprint()


def test_iceberg_positional_deletes_are_applied_and_equality_deletes_refused(
    tmp_path: Path,
) -> None:
    t = build("iceberg", tmp_path)
    first = min(task.file.file_path for task in t.table.scan().plan_files())
    add_iceberg_deletes(t.table, first, [1, 4, 19])
    src = t.open()
    want = sorted(t.table.scan().to_arrow()["uid"].to_pylist())  # pyiceberg's own reading
    got = sorted(u for k in range(src.num_shards) for u in src.read_shard(k)["uid"].to_pylist())
    assert got == want and len(got) == 57 and int(src.shard_sizes().sum()) == 57
    assert sorted(_uids(list(Loader(src, 8, seed=1)))) == want
    add_iceberg_deletes(t.table, first, [30], equality=True)
    with pytest.raises(DataFileError, match="equality deletes") as info:
        t.open()
    assert info.value.path == t.path
    assert int(t.open(src.snapshot_id).shard_sizes().sum()) == 57  # the snapshot before them


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_an_added_column_reads_as_nulls_in_older_files_and_is_absent_before(
    kind: str, tmp_path: Path
) -> None:
    t = build(kind, tmp_path, parts=2)
    before = t.open()
    t.add_column(rows(40, 45, extra=True))
    after = t.open()
    assert "extra" not in before.columns and after.columns[-1] == "extra"
    table = pa.concat_tables(after.read_shard(k) for k in range(after.num_shards))
    extra = dict(zip(table["uid"].to_pylist(), table["extra"].to_pylist()))
    assert [extra[u] for u in range(40, 45)] == [u * 10 for u in range(40, 45)]
    assert all(extra[u] is None for u in range(40))
    assert after.read_shard(0, columns=["extra", "uid"]).column_names == ["extra", "uid"]


def test_row_group_shards_and_partition_columns(tmp_path: Path) -> None:
    from datamill.tables import DeltaSource
    from tests.tables.formats import Delta

    t = Delta(tmp_path)
    t.write(rows(0, 30), partition_by=["label"])
    src = DeltaSource(t.path, shard_by="row_group")
    table = pa.concat_tables(src.read_shard(k) for k in range(src.num_shards))
    assert src.num_shards == 4 and sorted(table["uid"].to_pylist()) == list(range(30))
    assert all(
        lab == f"c{u % 4}" for u, lab in zip(table["uid"].to_pylist(), table["label"].to_pylist())
    )
    assert np.array_equal(src.shard_sizes(), [8, 8, 7, 7])


def test_auto_cuts_only_large_files_into_row_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq
    from deltalake import WriterProperties

    from datamill.tables import DeltaSource, common
    from tests.tables.formats import Delta

    t = Delta(tmp_path)
    t.write(rows(0, 10))
    t.write(rows(10, 2010), writer_properties=WriterProperties(max_row_group_size=500))
    sizes = {Path(f.path).stat().st_size: f for f in DeltaSource(t.path).files}
    big = max(sizes)
    groups = pq.read_metadata(sizes[big].path).num_row_groups
    assert groups > 1
    assert DeltaSource(t.path).num_shards == 2  # every file under the threshold: one shard each
    monkeypatch.setattr(common, "LARGE_FILE_BYTES", big - 1)
    src = DeltaSource(t.path)
    assert src.num_shards == 1 + groups and int(src.shard_sizes().sum()) == 2010


def test_table_urls_and_their_errors(tmp_path: Path) -> None:
    from datamill.core.errors import ConfigError
    from datamill.tables import parse_table_url

    t = build("delta", tmp_path, parts=2)
    assert open_source(f"delta://{t.path}?version=0").shard_sizes().tolist() == [20]
    version_file = Path(t.path) / "_delta_log" / f"{0:020d}.json"
    assert (
        open_source(version_file).fingerprint()
        == open_source(f"delta://{t.path}?version=0").fingerprint()
    )
    for bad in ("delta://x?snapshot_id=3", "iceberg://x?version=1", "delta+gs://b/t", "delta://"):
        with pytest.raises(ConfigError):
            parse_table_url(bad)
    with pytest.raises(DataFileNotFoundError, match="version 9"):
        open_source(f"delta://{t.path}?version=9")
    with pytest.raises(DataFileNotFoundError):
        open_source(f"lance://{tmp_path}/nothing.lance")


@pytest.mark.parametrize("kind", KINDS)
def test_diff_compares_two_versions_of_a_table(kind: str, tmp_path: Path) -> None:
    from datamill.lineage.diff import diff

    t = build(kind, tmp_path, parts=2)
    v0 = t.open().version
    t.write(rows(40, 45))
    t.delete("uid < 3")
    query = "snapshot_id" if kind == "iceberg" else "version"
    report = diff(f"{kind}://{t.path}?{query}={v0}&uid=uid", f"{kind}://{t.path}?uid=uid")
    assert report.rows == (40, 42) and "uid" in report.keyed_by
    assert report.samples["added"] == 5 and report.samples["removed"] == 3


def test_a_mix_of_a_delta_and_a_lance_version_resumes_exactly(tmp_path: Path) -> None:
    from datamill.loader import Mix

    delta, lance = build("delta", tmp_path / "d"), build("lance", tmp_path / "l", parts=2)

    def make(state: dict[str, Any] | None) -> Loader:
        mix = Mix([(delta.open(0), 0.5), (lance.open(1), 0.5)], epoch_size=40, names=["d", "l"])
        loader = Loader(mix, 8, seed=3)
        if state is not None:
            loader.load_state_dict(state)
        return loader

    delta.write(rows(60, 80))  # both tables move on; the mix reads the versions it names
    lance.write(rows(40, 50))
    check_resume(make, 2)
