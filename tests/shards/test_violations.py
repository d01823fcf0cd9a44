"""Every constraint violation is caught by ``add`` (raised) and by ``check`` (listed), with
location."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.errors import DataFileError, DatamillError, SchemaError, ShardsetError
from datamill.shards import ShardsetDataset, check_dataset

K, PER = 4, 5  # shard k holds uids 10k .. 10k+4


@pytest.fixture()
def ds(tmp_path: Path) -> ShardsetDataset:
    t = pa.table(
        {
            "uid": np.concatenate([np.arange(10 * k, 10 * k + PER) for k in range(K)]),
            "x": np.arange(K * PER),
        }
    )
    return ShardsetDataset.create(tmp_path / "ds", t, uid="uid", shardset="image", shard_size=PER)


def shard_tables(**override: pa.Table) -> list[pa.Table]:
    out = [
        pa.table({"uid": np.arange(10 * k, 10 * k + PER), "cap": [f"c{k}"] * PER}) for k in range(K)
    ]
    for k, t in override.items():
        out[int(k[1:])] = t
    return out


def write(tmp: Path, tables: list[pa.Table], ext: str = "parquet") -> list[Path]:
    tmp.mkdir(exist_ok=True)
    paths = []
    for k, t in enumerate(tables):
        p = tmp / f"{k}.{ext}"
        pq.write_table(t, p) if ext == "parquet" else pcsv.write_csv(t, p)
        paths.append(p)
    return paths


def test_add_rejects_uid_in_wrong_shard(ds: ShardsetDataset, tmp_path: Path) -> None:
    bad = pa.table({"uid": [30, 31, 12, 33, 34], "cap": ["c"] * 5})
    files = write(tmp_path / "in", shard_tables(k3=bad))
    with pytest.raises(ShardsetError) as exc:
        ds.add("caption", files)
    e = exc.value
    assert (e.path, e.uid, e.shard, e.row) == (str(files[3]), 12, 3, 2)
    assert "belongs to shard 1 (as in image/shard.00001.parquet)" in str(e)


@pytest.mark.parametrize(
    ("case", "err", "attrs"),
    [
        ("missing_uid", SchemaError, {"column": "uid", "shard": 2}),
        ("duplicate", ShardsetError, {"uid": 21, "shard": 2, "row": 1}),
        ("unknown", ShardsetError, {"uid": 999, "shard": 2}),
        ("csv_columns", SchemaError, {"shard": 2}),
        ("corrupt", DataFileError, {}),
        ("truncated", DataFileError, {}),
    ],
)
def test_add_rejects_bad_shard_files(
    ds: ShardsetDataset, tmp_path: Path, case: str, err: type, attrs: dict[str, object]
) -> None:
    ext = "csv" if case == "csv_columns" else "parquet"
    bad = {
        "missing_uid": pa.table({"id": np.arange(20, 25), "cap": ["c"] * 5}),
        "duplicate": pa.table({"uid": [20, 21, 21, 23, 24], "cap": ["c"] * 5}),
        "unknown": pa.table({"uid": [20, 21, 999], "cap": ["c"] * 3}),
        "csv_columns": pa.table({"uid": np.arange(20, 25), "cap": ["c"] * 5, "other": [1] * 5}),
    }.get(case, shard_tables()[2])
    files = write(tmp_path / "in", shard_tables(k2=bad), ext)
    if case == "corrupt":
        files[2].write_bytes(b"PAR1 this is not parquet PAR1")
    if case == "truncated":
        files[2].write_bytes(files[2].read_bytes()[:-30])
    before = sorted(p.name for p in Path(ds.loc.path).iterdir())
    with pytest.raises(err) as exc:
        ds.add("caption", files)
    assert exc.value.path == str(files[2])
    for k, v in attrs.items():
        assert getattr(exc.value, k) == v, k
    assert sorted(p.name for p in Path(ds.loc.path).iterdir()) == before


def test_add_shard_count_mismatch_and_route_errors(ds: ShardsetDataset, tmp_path: Path) -> None:
    files = write(tmp_path / "in", shard_tables()[:3])
    with pytest.raises(ShardsetError, match="got 3 shard files, the dataset has 4 shards") as exc:
        ds.add("caption", files)
    assert exc.value.path == ds.loc.display
    with pytest.raises(
        ShardsetError, match=r"2 UIDs are not in the sample mapping: \[77, 78\]"
    ) as exc:
        ds.add("caption", pa.table({"uid": [10, 77, 78], "c": [1, 2, 3]}), route=True)
    assert (exc.value.uid, exc.value.row) == (77, 1)
    with pytest.raises(ShardsetError, match="duplicate") as exc:
        ds.add("caption", pa.table({"uid": [10, 11, 10], "c": [1, 2, 3]}), route=True)
    assert (exc.value.uid, exc.value.row) == (10, 2)
    with pytest.raises(SchemaError) as exc:
        ds.add("caption", pa.table({"uid": [10], "x": [1]}), route=True)
    assert exc.value.column == "x"
    with pytest.raises(ShardsetError, match="already exists"):
        ds.add("image", pa.table({"uid": [10], "y": [1]}), route=True)


def test_create_rejects_duplicate_and_missing_uid(tmp_path: Path) -> None:
    files = write(tmp_path / "in", [pa.table({"u": [1, 2]}), pa.table({"u": [3, 1]})])
    with pytest.raises(ShardsetError) as exc:
        ShardsetDataset.create(tmp_path / "d1", files, uid="u", shardset="a")
    assert (exc.value.uid, exc.value.shard, exc.value.row, exc.value.path) == (
        1,
        1,
        1,
        str(files[1]),
    )
    with pytest.raises(SchemaError) as exc:
        ShardsetDataset.create(tmp_path / "d2", files, uid="uid", shardset="a")
    assert (exc.value.column, exc.value.path) == ("uid", str(files[0]))
    assert not (tmp_path / "d1").exists() and not (tmp_path / "d2").exists()


def _tamper(ds: ShardsetDataset, shardset: str, k: int, table: pa.Table | bytes) -> str:
    path = ds.loc.join(ds.shard_path(shardset, k))
    if isinstance(table, bytes):
        Path(path).write_bytes(table)
    else:
        pq.write_table(table, path)
    return path


def test_check_lists_every_violation(ds: ShardsetDataset) -> None:
    ds = ds.add("caption", pa.table({"uid": [0, 1, 10, 20, 30], "cap": list("abcde")}), route=True)
    assert check_dataset(ds.loc) == []
    p_wrong = _tamper(ds, "caption", 3, pa.table({"uid": [30, 12], "cap": ["e", "z"]}))
    p_dup = _tamper(ds, "caption", 0, pa.table({"uid": [0, 1, 1], "cap": ["a", "b", "b"]}))
    p_nouid = _tamper(ds, "caption", 1, pa.table({"id": [10], "cap": ["c"]}))
    p_corrupt = _tamper(ds, "image", 2, b"garbage")
    (Path(ds.loc.path) / "image" / "shard.00004.parquet").write_bytes(b"")
    problems = check_dataset(ds.loc.path)
    where = {(type(p).__name__, p.path, p.uid, p.shard) for p in problems}
    assert ("ShardsetError", p_wrong, 12, 3) in where
    assert any(
        "caption/shard.00003.parquet, shard 3, row 1, uid 12: uid belongs to shard 1 "
        "(as in image/shard.00001.parquet)" in str(p)
        for p in problems
    )
    assert ("ShardsetError", p_dup, 1, 0) in where
    assert ("SchemaError", p_nouid, None, 1) in where
    assert ("DataFileError", p_corrupt, None, None) in where
    assert any("unexpected shard file" in str(p) for p in problems)
    row_counts = [p for p in problems if "rows (manifest)" in str(p)]
    assert {p.path for p in row_counts} == {p_wrong, p_dup}  # 1 -> 2 rows, 2 -> 3 rows
    assert all(isinstance(p, DatamillError) for p in problems)


def test_check_manifest_mismatch(ds: ShardsetDataset) -> None:
    root = Path(ds.loc.path)
    m = json.loads((root / "dataset.json").read_text())
    m["shardsets"][0]["num_shards"] = 5
    (root / "dataset.json").write_text(json.dumps(m))
    (root / "image" / "shard.00001.parquet").unlink()
    (root / "orphan").mkdir()
    msgs = [str(p) for p in check_dataset(root)]
    assert any("the manifest says 5 shards, the dataset has 4" in s for s in msgs)
    assert any("shard.00001.parquet, shard 1: shard file is missing" in s for s in msgs)
    assert any(s.startswith(f"{root}/orphan: not listed in the manifest") for s in msgs)


@given(
    n=st.integers(1, 60),
    n_shards=st.integers(1, 7),
    seed=st.integers(0, 2**32 - 1),
    p_missing=st.lists(st.floats(0, 1), min_size=1, max_size=3),
    string_uids=st.booleans(),
)
def test_read_shard_equals_pandas_merge(
    n: int, n_shards: int, seed: int, p_missing: list[float], string_uids: bool
) -> None:
    rng = np.random.default_rng(seed)
    raw = rng.choice(10 * n + 10, size=n, replace=False)
    uids = [f"id{u}" for u in raw] if string_uids else raw.astype(np.int64)
    base = pd.DataFrame({"uid": uids, "x": rng.normal(size=n)})
    shard_of = rng.integers(0, n_shards, size=n)
    files_tables = [
        pa.Table.from_pandas(base[shard_of == k], preserve_index=False) for k in range(n_shards)
    ]
    tmp = Path(tempfile.mkdtemp())
    try:
        files = write(tmp / "in", files_tables)
        ds = ShardsetDataset.create(tmp / "ds", files, uid="uid", shardset="s0")
        frames = [base]
        for i, p in enumerate(p_missing):
            keep = rng.random(n) >= p
            df = pd.DataFrame(
                {"uid": base["uid"][keep], f"c{i}": rng.integers(0, 100, size=int(keep.sum()))}
            )
            df = df.sample(frac=1, random_state=int(rng.integers(1 << 30)))
            ds = ds.add(f"s{i + 1}", pa.Table.from_pandas(df, preserve_index=False), route=True)
            frames.append(df)
        merged = frames[0]
        for f in frames[1:]:
            merged = merged.merge(f, on="uid", how="left")
        got = pd.concat([ds.read_shard(k).to_pandas() for k in range(n_shards)], ignore_index=True)
        assert len(got) == n == int(ds.shard_sizes().sum())
        assert sorted(got["uid"].tolist()) == sorted(base["uid"].tolist())
        np.testing.assert_array_equal(
            np.diff(shard_of[pd.Index(base["uid"]).get_indexer(got["uid"])]) >= 0, True
        )
        exp = merged.set_index("uid").loc[got["uid"]].reset_index()
        for c in exp.columns:
            if c.startswith("c"):
                exp[c] = exp[c].astype("Int64")
                got[c] = got[c].astype("Int64")
        pd.testing.assert_frame_equal(got, exp, check_dtype=False)
        inner = pd.concat(
            [ds.read_shard(k, join="inner").to_pandas() for k in range(n_shards)], ignore_index=True
        )
        assert len(inner) == len(merged.dropna())
    finally:
        shutil.rmtree(tmp)


def test_add_from_files_stores_rows_in_mapping_order(ds: ShardsetDataset, tmp_path: Path) -> None:
    tables = [t.take(pa.array(np.arange(t.num_rows)[::-1])) for t in shard_tables()]
    ds = ds.add("caption", write(tmp_path / "in", tables))
    stored = pq.read_table(ds.loc.join(ds.shard_path("caption", 2))).column("uid").to_pylist()
    assert stored == [20, 21, 22, 23, 24]
    assert ds.read_shard(2).column("cap").to_pylist() == ["c2"] * 5


def test_uid_type_mismatch_is_a_schema_error_and_widths_are_cast(
    ds: ShardsetDataset, tmp_path: Path
) -> None:
    with pytest.raises(SchemaError, match="do not match the mapping's int64") as exc:
        ds.add("caption", pa.table({"uid": ["x10"], "c": [1]}), route=True)
    assert exc.value.path == "<table>"
    ds = ds.add(
        "caption", pa.table({"uid": pa.array([31, 10], pa.int32()), "c": [1, 2]}), route=True
    )
    assert ds.get(31) == {"uid": 31, "x": 16, "c": 1}
    assert pq.read_schema(ds.loc.join(ds.shard_path("caption", 3))).field("uid").type == pa.int64()


def test_check_catches_csv_column_set_and_truncated_parquet(tmp_path: Path) -> None:
    t = pa.table({"uid": np.arange(6), "x": np.arange(6)})
    ds = ShardsetDataset.create(
        tmp_path / "ds", t, uid="uid", shardset="a", shard_size=3, fmt="csv"
    )
    ds = ds.add("b", pa.table({"uid": np.arange(6), "y": np.arange(6)}), route=True)
    csv1 = Path(ds.loc.join(ds.shard_path("a", 1)))
    csv1.write_text("uid,x,z\n3,3,0\n4,4,0\n5,5,0\n")
    pq1 = Path(ds.loc.join(ds.shard_path("b", 1)))
    pq1.write_bytes(pq1.read_bytes()[:-20])
    problems = check_dataset(tmp_path / "ds")
    assert {(type(p), p.path) for p in problems} == {
        (SchemaError, str(csv1)),
        (DataFileError, str(pq1)),
    }
    with pytest.raises(DataFileError) as exc:
        ShardsetDataset(tmp_path / "ds").read_shard(1)
    assert exc.value.path == str(pq1) and exc.value.shard == 1


@given(n=st.integers(0, 80), n_shards=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_positions_near_equals_global_positions(n: int, n_shards: int, seed: int) -> None:
    from datamill.shards._mapping import Mapping

    rng = np.random.default_rng(seed)
    uids = rng.choice(1000, size=n, replace=False).astype(np.int64)
    shard = np.sort(rng.integers(0, n_shards, size=n))
    m = Mapping(pa.array(uids), shard, n_shards)
    query = pa.array(rng.integers(0, 1000, size=30).astype(np.int64))
    for k in range(n_shards):
        assert m.positions_near(query, k).to_pylist() == m.positions(query).to_pylist()


def test_empty_shard_reads_and_joins(tmp_path: Path) -> None:
    files = write(
        tmp_path / "in",
        [
            pa.table({"uid": [1, 2]}),
            pa.table({"uid": pa.array([], pa.int64())}),
            pa.table({"uid": [3]}),
        ],
    )
    ds = ShardsetDataset.create(tmp_path / "ds", files, uid="uid", shardset="a")
    ds = ds.add("b", pa.table({"uid": [3], "y": ["c"]}), route=True)
    assert ds.shard_sizes().tolist() == [2, 0, 1]
    assert ds.read_shard(1, join="inner").num_rows == 0 and ds.last_dropped == {"a": 0, "b": 0}
    assert ds.read_shard(2, join="inner").to_pydict() == {"uid": [3], "y": ["c"]}
    assert check_dataset(ds.loc) == []


def test_route_from_malformed_csv_names_the_file(ds: ShardsetDataset, tmp_path: Path) -> None:
    bad = tmp_path / "cap.csv"
    bad.write_text("uid,cap\n10,a\n11,b,extra\n")
    with pytest.raises(DataFileError) as exc:
        ds.add("caption", bad, route=True)
    assert exc.value.path == str(bad) and "11,b,extra" in str(
        exc.value
    )  # core read_table: line not set here


@pytest.mark.parametrize(
    "shard",
    [pa.array([str(i // PER) for i in range(K * PER)]), pa.array([None] * (K * PER), pa.int32())],
    ids=["strings", "nulls"],
)
def test_a_mapping_whose_shard_column_is_not_numbers_is_a_located_error(
    ds: ShardsetDataset, shard: pa.Array
) -> None:
    """The mapping's shard column read from its buffer: a column of another type, or with nulls,
    is a ShardsetError naming samples.parquet, not a bare TypeError."""
    path = Path(ds.loc.join(ds.samples_path))
    table = pq.read_table(path)
    pq.write_table(table.set_column(table.schema.get_field_index("shard"), "shard", shard), path)
    with pytest.raises(ShardsetError, match="mapping is unusable") as err:
        ShardsetDataset(ds.loc.join(""))
    assert "samples.parquet" in str(err.value)
