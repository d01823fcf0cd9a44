"""datamill diff on real shared data modified in known ways: each kind of change is found, none
invented."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.cli import main
from datamill.core.errors import ConfigError
from datamill.lineage.diff import diff
from datamill.lineage.hashcache import read_sidecar_header
from datamill.lineage.rowhash import column_hash, row_hash
from datamill.preprocessing.api import preprocess
from datamill.shards.dataset import ShardsetDataset

CONFIG = {
    "input_features": [
        {"name": "LotArea", "type": "number"},
        {"name": "Neighborhood", "type": "category"},
        {"name": "MSZoning", "type": "category"},
    ],
    "output_features": [{"name": "SalePrice", "type": "number"}],
}


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAMILL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def houses(data_dir: Path) -> pa.Table:
    return pacsv.read_csv(data_dir / "house_prices_train.csv")


def test_shardset_diff_finds_added_removed_changed_samples_columns_and_drift(
    houses: pa.Table, tmp_path: Path
) -> None:
    ShardsetDataset.create(tmp_path / "a", houses, uid="Id", shardset="raw", shard_size=300)
    t = houses.slice(10)  # Ids 1..10 removed
    ids = t.column("Id").to_numpy()
    price = t.column("SalePrice").to_numpy().copy()
    price[:20] += 1  # 20 prices changed (Ids 11..30)
    t = t.set_column(t.schema.get_field_index("SalePrice"), "SalePrice", pa.array(price))
    t = t.set_column(
        t.schema.get_field_index("LotArea"), "LotArea", pc.multiply(t.column("LotArea"), 3)
    )  # every LotArea changed, and drifted
    t = t.drop_columns(["Fence"]).append_column("Note", pa.array(["x"] * t.num_rows))
    t = t.set_column(
        t.schema.get_field_index("YrSold"), "YrSold", pc.cast(t.column("YrSold"), pa.float64())
    )
    extra = houses.slice(0, 5).set_column(0, "Id", pa.array(np.arange(5000, 5005)))
    extra = extra.drop_columns(["Fence"]).append_column("Note", pa.array(["x"] * 5))
    extra = extra.set_column(
        extra.schema.get_field_index("YrSold"),
        "YrSold",
        pc.cast(extra.column("YrSold"), pa.float64()),
    )
    extra = extra.set_column(
        extra.schema.get_field_index("LotArea"), "LotArea", pc.multiply(extra.column("LotArea"), 3)
    )
    ShardsetDataset.create(
        tmp_path / "b", pa.concat_tables([t, extra]), uid="Id", shardset="raw", shard_size=250
    )
    assert len(ids) == 1450
    r = diff(tmp_path / "a", tmp_path / "b")
    assert r.keyed_by == "uid column 'Id'"
    assert r.columns == {
        "added": ["Note"],
        "removed": ["Fence"],
        "retyped": [["YrSold", "int64", "double"]],
    }
    s = r.samples
    assert (s["added"], s["removed"], s["changed"], s["unchanged"]) == (5, 10, 1450, 0)
    assert s["changed_by_column"] == {"LotArea": 1450, "SalePrice": 20}
    assert s["examples"]["added"] == [5000, 5001, 5002, 5003, 5004]
    assert s["examples"]["removed"] == [1, 2, 3, 4, 5]
    drifted = {d["column"] for d in r.drift if d["drifted"]}
    assert drifted == {"LotArea"}
    assert r.changed and "DRIFT LotArea" in r.as_text()


def test_identical_builds_report_no_difference_and_the_cache_is_used(
    houses: pa.Table, tmp_path: Path
) -> None:
    ShardsetDataset.create(tmp_path / "a", houses, uid="Id", shardset="raw", shard_size=300)
    ShardsetDataset.create(
        tmp_path / "b", houses, uid="Id", shardset="raw", shard_size=100
    )  # other shards
    r = diff(tmp_path / "a", tmp_path / "b")
    assert not r.changed and r.samples["unchanged"] == houses.num_rows
    assert "no differences" in r.as_text()
    # the row hashes are kept beside each build (not in the temp cache)
    assert (tmp_path / "a" / ".rowhash.npz").is_file() and (
        tmp_path / "b" / ".rowhash.npz"
    ).is_file()
    assert main(["shards", "check", str(tmp_path / "a")]) == 0  # (a hidden file: not a stray)
    assert not (tmp_path / "cache").exists()
    again = diff(tmp_path / "a", tmp_path / "b")
    assert again.as_dict() == r.as_dict()


def test_row_hash_sidecar_is_reused_goes_stale_with_the_build_and_spares_a_users_file(
    houses: pa.Table, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datamill.shards.dataset import ShardsetDataset as DS

    ShardsetDataset.create(tmp_path / "a", houses, uid="Id", shardset="raw", shard_size=300)
    ShardsetDataset.create(tmp_path / "b", houses, uid="Id", shardset="raw", shard_size=300)
    diff(tmp_path / "a", tmp_path / "b")
    side = tmp_path / "b" / ".rowhash.npz"
    first = side.stat().st_mtime_ns
    reads: list[int] = []
    real = DS.read_shard

    def counting(self: DS, k: int, **kw: object) -> pa.Table:
        reads.append(len(kw.get("columns") or []))  # type: ignore[arg-type]  # (a count only)
        return real(self, k, **kw)  # type: ignore[arg-type]  # (passes the keywords through)

    monkeypatch.setattr(DS, "read_shard", counting)
    diff(tmp_path / "a", tmp_path / "b")
    assert reads and all(n == 1 for n in reads)  # only the UID column is read: hashes reused
    assert side.stat().st_mtime_ns == first
    # rebuilt with a change: the sidecar is stale, so b is hashed again and the change is seen
    changed = houses.set_column(
        houses.schema.get_field_index("LotArea"), "LotArea", pc.add(houses.column("LotArea"), 1)
    )
    ShardsetDataset.create(
        tmp_path / "b", changed, uid="Id", shardset="raw", shard_size=300, overwrite=True
    )
    r = diff(tmp_path / "a", tmp_path / "b")
    assert r.samples["changed_by_column"] == {"LotArea": houses.num_rows}
    # a file build X.hdf5 keeps X.rowhash.npz beside it; rebuilt in place, the sidecar is stale
    for name, table in (("x", houses), ("y", houses)):
        (tmp_path / name).mkdir()
        pacsv.write_csv(table, tmp_path / name / "hp.csv")
        preprocess(tmp_path / name / "hp.csv", CONFIG)
    assert not diff(tmp_path / "x" / "hp.hdf5", tmp_path / "y" / "hp.hdf5").changed
    y_side = tmp_path / "y" / "hp.rowhash.npz"
    assert read_sidecar_header(y_side)["format"] == "datamill.rowhash/1"  # type: ignore[index]
    area = houses.column("LotArea").to_numpy().copy()
    area[:20] += 1000  # (not a shift of every row: the number feature is z-scored)
    pacsv.write_csv(
        houses.set_column(houses.schema.get_field_index("LotArea"), "LotArea", pa.array(area)),
        tmp_path / "y" / "hp.csv",
    )
    preprocess(tmp_path / "y" / "hp.csv", CONFIG)
    assert y_side.is_file()  # (still there: the new build's fingerprint no longer matches it)
    r = diff(tmp_path / "x" / "hp.hdf5", tmp_path / "y" / "hp.hdf5")
    assert r.changed and r.samples["added"] == r.samples["removed"] > 0
    # a user's file of the sidecar's name is never replaced: the temp cache is used instead
    mine = tmp_path / "x" / "hp.rowhash.npz"
    mine.write_text("my notes")
    diff(tmp_path / "x" / "hp.hdf5", tmp_path / "y" / "hp.hdf5")
    assert mine.read_text() == "my notes"
    assert len(list((tmp_path / "cache" / "datamill-rowhash").iterdir())) == 1  # the fallback


def test_hdf5_diff_reports_vocabulary_changes(houses: pa.Table, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    pacsv.write_csv(houses, tmp_path / "a" / "hp.csv")
    hood = houses.column("Neighborhood").to_pylist()
    hood = ["Brandnew" if h == "Blueste" else h for h in hood]  # a token renamed
    zoning = houses.column("MSZoning").to_pylist()
    changed = houses.set_column(
        houses.schema.get_field_index("Neighborhood"), "Neighborhood", pa.array(hood)
    )
    changed = changed.set_column(
        changed.schema.get_field_index("MSZoning"), "MSZoning", pa.array(zoning)
    )
    pacsv.write_csv(changed, tmp_path / "b" / "hp.csv")
    preprocess(tmp_path / "a" / "hp.csv", CONFIG)
    preprocess(tmp_path / "b" / "hp.csv", CONFIG)
    r = diff(tmp_path / "a" / "hp.hdf5", tmp_path / "b" / "hp.hdf5")
    assert r.kind == "HDF5Source"
    v = r.vocab["Neighborhood"]
    assert (v["added"], v["removed"]) == (1, 1)
    assert v["examples"]["added"] == ["Brandnew"] and v["examples"]["removed"] == ["Blueste"]
    assert (
        r.vocab["MSZoning"]["added"]
        == r.vocab["MSZoning"]["removed"]
        == r.vocab["MSZoning"]["moved"]
        == 0
    )
    same = diff(tmp_path / "a" / "hp.hdf5", tmp_path / "a" / "hp.hdf5")
    assert not same.changed


def test_word2vec_outputs_and_kinds(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = (data_dir / "timemachine.txt").read_text(encoding="utf-8").splitlines()
    (tmp_path / "a.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("\n".join(lines[:1500] + lines[1600:]) + "\n", encoding="utf-8")
    for x in "ab":
        assert (
            main(["-q", "word2vec", str(tmp_path / f"{x}.txt"), "--out", str(tmp_path / f"w{x}")])
            == 0
        )
    capsys.readouterr()
    assert main(["diff", str(tmp_path / "wa"), str(tmp_path / "wb"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    va = json.loads((tmp_path / "wa" / "vocab.json").read_text())["idx2str"]
    vb = json.loads((tmp_path / "wb" / "vocab.json").read_text())["idx2str"]
    v = out["vocab"]["vocab.json"]
    assert v["removed"] == len(set(va) - set(vb)) > 0 and v["added"] == len(set(vb) - set(va))
    assert v["moved"] == sum(1 for t in vb if t in va and va.index(t) != vb.index(t))
    assert main(["diff", str(tmp_path / "wa"), str(tmp_path / "wb"), "--exit-code"]) == 1
    ShardsetDataset.create(
        tmp_path / "s", pa.table({"u": [1]}), uid="u", shardset="x", shard_size=1
    )
    with pytest.raises(ConfigError, match="same kind") as err:
        diff(tmp_path / "s", tmp_path / "wa")
    assert err.value.path == str(tmp_path / "wa")


@given(
    st.lists(st.one_of(st.none(), st.text(max_size=6)), max_size=40),
    st.integers(0, 10),
    st.integers(0, 10),
)
def test_column_hash_of_a_slice_is_the_slice_of_the_hash(
    values: list[str | None], lo: int, n: int
) -> None:
    arr = pa.array(values, type=pa.string())
    h = column_hash(arr)
    np.testing.assert_array_equal(column_hash(arr.slice(lo, n)), h[lo : lo + n])
    for i in range(len(values)):  # equal values hash equal; different ones (almost surely) not
        for j in range(i + 1, len(values)):
            assert (h[i] == h[j]) == (values[i] == values[j])


@given(st.lists(st.lists(st.integers(-3, 3), max_size=4), max_size=20))
def test_list_hashes_follow_equality(rows: list[list[int]]) -> None:
    t = pa.table(
        {"a": pa.array(rows, type=pa.list_(pa.int64())), "b": pa.array([len(r) for r in rows])}
    )
    h = row_hash(t)
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert (h[i] == h[j]) == (rows[i] == rows[j])


@given(
    st.lists(st.text(max_size=4), unique=True, max_size=40),
    st.lists(st.text(max_size=4), unique=True, max_size=40),
    st.integers(0, 3),
)
def test_uid_matching_by_cached_hashes_is_exact_even_when_hashes_collide(
    a: list[str], b: list[str], buckets: int
) -> None:
    from datamill.lineage.diff import _match

    ua, ub = pa.array(a, pa.string()), pa.array(b, pa.string())
    ha, hb = column_hash(ua), column_hash(ub)
    if buckets:  # force collisions: few distinct hash values for many UIDs
        ha, hb = ha % np.uint64(buckets), hb % np.uint64(buckets)
    found, pos = _match(ua, ub, ha, hb)
    index = {u: i for i, u in enumerate(a)}
    assert found.tolist() == [u in index for u in b]
    assert [int(p) for p, f in zip(pos, found) if f] == [index[u] for u in b if u in index]


def test_the_build_points_at_its_row_hashes_and_a_second_diff_hashes_nothing(
    houses: pa.Table, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dataset.json / meta.json record the sidecar (name + the key it was computed for): the next
    diff reads it without hashing a row; a rebuilt build's record is stale and is rewritten."""
    from datamill.lineage import summary as diff_module

    calls: list[int] = []
    real = diff_module.column_hash

    def counting(col: Any) -> Any:
        calls.append(len(col))
        return real(col)

    monkeypatch.setattr(diff_module, "column_hash", counting)
    ShardsetDataset.create(tmp_path / "a", houses, uid="Id", shardset="raw", shard_size=300)
    fp = ShardsetDataset(tmp_path / "a").fingerprint()
    for name in ("x", "y"):
        (tmp_path / name).mkdir()
        pacsv.write_csv(houses, tmp_path / name / "hp.csv")
        preprocess(tmp_path / name / "hp.csv", CONFIG)
    builds = [tmp_path / "a", tmp_path / "x" / "hp.hdf5"]
    diff(builds[0], builds[0])
    diff(builds[1], tmp_path / "y" / "hp.hdf5")
    assert calls
    manifest = json.loads((tmp_path / "a" / "dataset.json").read_text())
    record = manifest["row_hashes"]
    assert record["file"] == ".rowhash.npz" and record["format"] == "datamill.rowhash/1"
    assert read_sidecar_header(tmp_path / "a" / record["file"])["key"] == record["key"]  # type: ignore[index]
    meta = json.loads((tmp_path / "x" / "hp.meta.json").read_text())
    assert meta["datamill"]["row_hashes"]["file"] == "hp.rowhash.npz"
    assert ShardsetDataset(tmp_path / "a").fingerprint() == fp  # (the pointer is not the data)
    assert main(["shards", "check", str(tmp_path / "a")]) == 0
    # the second diff: every summary comes from where the records point, no row is hashed
    calls.clear()
    before = (tmp_path / "a" / ".rowhash.npz").stat().st_mtime_ns
    assert not diff(builds[0], builds[0]).changed
    assert not diff(builds[1], tmp_path / "y" / "hp.hdf5").changed
    assert calls == [] and (tmp_path / "a" / ".rowhash.npz").stat().st_mtime_ns == before
    # a record pointing at another file is followed (the name comes from the record)
    (tmp_path / "a" / ".rowhash.npz").rename(tmp_path / "a" / ".moved.npz")
    manifest["row_hashes"]["file"] = ".moved.npz"
    (tmp_path / "a" / "dataset.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    diff(builds[0], builds[0])
    assert calls == []
    # rebuilt with a change, its new manifest given the old record: the record's key is stale, so
    # the build is hashed again (the change is seen) and the record is rewritten
    changed = houses.set_column(
        houses.schema.get_field_index("LotArea"), "LotArea", pc.add(houses.column("LotArea"), 1)
    )
    ShardsetDataset.create(tmp_path / "b", houses, uid="Id", shardset="raw", shard_size=300)
    ShardsetDataset.create(
        tmp_path / "a", changed, uid="Id", shardset="raw", shard_size=300, overwrite=True
    )
    rebuilt = json.loads((tmp_path / "a" / "dataset.json").read_text())
    assert "row_hashes" not in rebuilt
    rebuilt["row_hashes"] = {**record, "key": "an earlier build"}
    (tmp_path / "a" / "dataset.json").write_text(json.dumps(rebuilt, indent=2, sort_keys=True))
    np.savez(tmp_path / "a" / ".rowhash.npz", meta=np.array(json.dumps(rebuilt["row_hashes"])))
    calls.clear()
    r = diff(builds[0], tmp_path / "b")
    assert calls and r.samples["changed_by_column"] == {"LotArea": houses.num_rows}
    again = json.loads((tmp_path / "a" / "dataset.json").read_text())["row_hashes"]
    assert again["key"] == read_sidecar_header(tmp_path / "a" / ".rowhash.npz")["key"]  # type: ignore[index]
    assert again["key"] != "an earlier build" and again["file"] == ".rowhash.npz"
