"""ShardsetWriter (worker processes, commit, discard), describe(), check_report(), read_shard
arguments."""

from __future__ import annotations

import ast
import hashlib
import json
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamill.core.errors import ConfigError, SchemaError, ShardsetError
from datamill.shards import ShardsetDataset, check_dataset
from datamill.shards.check import VIOLATION_KEYS, check_report
from datamill.shards.writer import ShardsetWriter

SRC = Path(__file__).resolve().parents[2] / "src" / "datamill"


def files_of(root: Path) -> dict[str, str]:
    """Content hash of every file under ``root``, hidden ones included."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def shard(k: int, per: int = 10) -> pa.Table:
    uids = np.arange(k * 100, k * 100 + per, dtype=np.int64)
    return pa.table({"uid": uids, "x": uids.astype(np.float64) / 2})


@pytest.fixture(scope="module")
def spawn_pool() -> mp.pool.Pool:  # type: ignore[misc]  # generator fixture
    with mp.get_context("spawn").Pool(2) as pool:
        yield pool


def test_worker_processes_write_shards_and_the_driver_commits(
    tmp_path: Path, spawn_pool: mp.pool.Pool
) -> None:
    root = tmp_path / "ds"
    with ShardsetWriter(root, uid="uid", shardset="base") as w:
        rows = spawn_pool.starmap(
            w.sink.write_shard, [(k, shard(k, per=3 + k)) for k in reversed(range(5))]
        )
        assert sorted(rows) == [3, 4, 5, 6, 7] and not (root / "dataset.json").exists()
    ds = w.dataset
    assert ds is not None and ds.shard_sizes().tolist() == [3, 4, 5, 6, 7]
    assert ds.read_shard(2).to_pydict() == shard(2, per=5).to_pydict()
    assert sorted(p.name for p in root.iterdir()) == ["base", "dataset.json", "samples.parquet"]
    assert sorted(p.name for p in (root / "base").iterdir()) == [
        f"shard.{k:05d}.parquet" for k in range(5)
    ]
    # a second shardset, written by workers that validate against the mapping
    with ShardsetWriter(root, uid="uid", shardset="extra") as w2:
        tables = [
            pa.table({"uid": shard(k, per=3 + k)["uid"][::-2], "y": [f"y{k}"] * ((3 + k + 1) // 2)})
            for k in range(5)
        ]
        spawn_pool.starmap(w2.sink.write_shard, list(enumerate(tables)))
    ds = ShardsetDataset(root)
    assert ds.shardsets == ["base", "extra"] and check_dataset(root) == []
    stored = pq.read_table(root / "extra" / "shard.00004.parquet").column("uid").to_pylist()
    assert stored == [400, 402, 404, 406]  # rows stored in mapping order
    assert ds.get(402) == {"uid": 402, "x": 201.0, "y": "y4"} and ds.get(401)["y"] is None


def test_a_worker_writing_a_misplaced_uid_fails_and_nothing_is_left(
    tmp_path: Path, spawn_pool: mp.pool.Pool
) -> None:
    root = tmp_path / "ds"
    ShardsetDataset.create(
        root, pa.concat_tables([shard(k) for k in range(3)]), uid="uid", shardset="a", shard_size=10
    )
    before = files_of(root)
    bad = [pa.table({"uid": [0]}), pa.table({"uid": [100, 5]}), pa.table({"uid": [200]})]
    with pytest.raises(ShardsetError) as exc, ShardsetWriter(root, uid="uid", shardset="b") as w:
        spawn_pool.starmap(w.sink.write_shard, list(enumerate(bad)))
    assert (exc.value.uid, exc.value.shard, exc.value.row) == (5, 1, 1)
    assert "belongs to shard 0" in str(exc.value)
    assert files_of(root) == before


def test_an_exception_in_the_with_block_leaves_the_dataset_unchanged(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    with (
        pytest.raises(RuntimeError, match="boom"),
        ShardsetWriter(root, uid="uid", shardset="a") as w,
    ):
        w.write_shard(0, shard(0))
        raise RuntimeError("boom")
    assert not root.exists()  # the writer made the folder, so it removes it
    ShardsetDataset.create(root, shard(0), uid="uid", shardset="a", shard_size=4)
    before = files_of(root)
    with (
        pytest.raises(RuntimeError, match="boom"),
        ShardsetWriter(root, uid="uid", shardset="b") as w,
    ):
        for k in range(3):
            w.write_shard(k, pa.table({"uid": [4 * k], "z": [k]}))
        assert any(p.name.startswith(".tmp-b") for p in root.iterdir())
        raise RuntimeError("boom")
    assert files_of(root) == before and ShardsetDataset(root).shardsets == ["a"]
    with pytest.raises(ShardsetError, match="closed"):
        w.write_shard(0, pa.table({"uid": [0], "z": [0]}))


def test_commit_validates_every_shard(tmp_path: Path, spawn_pool: mp.pool.Pool) -> None:
    root = tmp_path / "ds"
    with (
        pytest.raises(ShardsetError, match=r"shards \[1\] were not written"),
        ShardsetWriter(root, uid="uid", shardset="a") as w,
    ):
        w.write_shard(0, shard(0))
        w.write_shard(2, shard(2))
    with pytest.raises(SchemaError) as exc, ShardsetWriter(root, uid="uid", shardset="a") as w:
        spawn_pool.starmap(
            w.sink.write_shard,
            [(0, shard(0)), (1, shard(1).set_column(1, "x", pa.array(["s"] * 10)))],
        )
    assert exc.value.shard == 1
    with pytest.raises(ShardsetError) as exc, ShardsetWriter(root, uid="uid", shardset="a") as w:
        spawn_pool.starmap(w.sink.write_shard, [(0, shard(0)), (1, shard(0).slice(3, 2))])
    assert (exc.value.uid, exc.value.shard, exc.value.row) == (3, 1, 0) and "duplicate uid" in str(
        exc.value
    )
    with (
        pytest.raises(ConfigError, match="no shards"),
        ShardsetWriter(root, uid="uid", shardset="a"),
    ):
        pass
    assert not root.exists()
    ShardsetDataset.create(root, shard(0), uid="uid", shardset="a", shard_size=5)
    with pytest.raises(ConfigError) as cexc:
        ShardsetWriter(root, uid="id", shardset="b")
    assert "'uid'" in str(cexc.value)
    with pytest.raises(ConfigError) as cexc, ShardsetWriter(root, uid="uid", shardset="b") as w:
        w.write_shard(2, pa.table({"uid": [1]}))
    assert cexc.value.shard == "2"
    with pytest.raises(ConfigError, match="invalid shardset name"):
        ShardsetWriter(root, uid="uid", shardset="../evil")
    assert sorted(p.name for p in root.iterdir()) == ["a", "dataset.json", "samples.parquet"]


def test_describe_counts_missing_samples_from_the_manifest(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    ds = ShardsetDataset.create(
        root, pa.concat_tables([shard(k) for k in range(4)]), uid="uid", shardset="a", shard_size=10
    )
    ds = ds.add(
        "b",
        pa.table({"uid": [0, 1, 105, 309], "label": pa.array([1, 0, 1, 1], pa.int8())}),
        route=True,
    )
    with pytest.raises(SchemaError, match="CSV shard cannot hold"):
        ds.add(
            "c",
            pa.table({"uid": np.arange(300, 310), "t": [[1.0, 2.0]] * 10}),
            route=True,
            fmt="csv",
        )
    ds = ds.add(
        "c", pa.table({"uid": np.arange(300, 310), "t": np.arange(10) * 0.5}), route=True, fmt="csv"
    )
    d = json.loads(json.dumps(ds.describe()))  # plain JSON
    assert (d["num_samples"], d["num_shards"], d["uid_column"], d["uid_type"]) == (
        40,
        4,
        "uid",
        "int64",
    )
    got = {
        s["name"]: (s["format"], s["num_shards"], s["rows"], s["missing"]) for s in d["shardsets"]
    }
    assert got == {"a": ("parquet", 4, 40, 0), "b": ("parquet", 4, 4, 36), "c": ("csv", 4, 10, 30)}
    assert d["shardsets"][0]["columns"] == [{"name": "x", "type": "double"}]
    assert d["shardsets"][1]["columns"] == [{"name": "label", "type": "int8"}]
    sizes = {s["name"]: s["bytes"] for s in d["shardsets"]}
    for name in "abc":
        assert sizes[name] == sum(p.stat().st_size for p in (root / name).iterdir())
    assert d["bytes"] == sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert d["root"] == str(root) and d["fingerprint"] == ds.fingerprint()


def test_check_report_gives_one_plain_dict_per_violation(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    ds = ShardsetDataset.create(
        root, pa.concat_tables([shard(k) for k in range(3)]), uid="uid", shardset="a", shard_size=10
    )
    assert check_report(root) == []
    pq.write_table(
        pa.table({"uid": [100, 101, 7], "x": [0.0, 0.0, 0.0]}), root / "a" / "shard.00001.parquet"
    )
    (root / "a" / "shard.00002.parquet").unlink()
    report = check_report(ds.loc)
    assert json.loads(json.dumps(report)) == report
    assert all(tuple(v) == VIOLATION_KEYS for v in report)
    assert len(report) == len(check_dataset(root)) == 3
    by_message = {v["message"]: v for v in report}
    wrong = by_message["uid belongs to shard 0 (as in a/shard.00000.parquet)"]
    assert (wrong["kind"], wrong["path"], wrong["shard"], wrong["uid"], wrong["row"]) == (
        "ShardsetError",
        str(root / "a" / "shard.00001.parquet"),
        1,
        7,
        2,
    )
    assert by_message["expected 10 rows (manifest), got 3"]["shard"] == 1
    assert by_message["shard file is missing"]["path"] == str(root / "a" / "shard.00002.parquet")


def test_read_shard_checks_its_arguments_like_every_source(tmp_path: Path) -> None:
    ds = ShardsetDataset.create(tmp_path / "ds", shard(0), uid="uid", shardset="a", shard_size=4)
    for bad in (3, -1):
        with pytest.raises(ConfigError) as exc:
            ds.read_shard(bad)
        assert exc.value.shard == bad
    with pytest.raises(SchemaError) as sexc:
        ds.read_shard(0, columns=["x", "nope"])
    assert sexc.value.column == "nope"
    with pytest.raises(ConfigError):
        ds.read_shard(0, join="outer")
    assert ds.uid_column == "uid" and ds.read_shard(np.int64(2), columns="x").column_names == ["x"]


def _imports(path: Path) -> set[str]:
    """Every module a file imports, top-level or inside functions (``from a import b`` counts a and
    a.b); imports for type checkers only (``if TYPE_CHECKING:``) left out, as the package-level
    graph of ``tests/test_architecture.py`` leaves them out."""
    out: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_shards_import_graph_has_no_cycle_and_private_modules_stay_inside() -> None:
    modules = {
        f"datamill.shards.{p.stem}": p
        for p in (SRC / "shards").glob("*.py")
        if p.stem != "__init__"
    }
    graph = {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        if state.get(m) == 1:
            raise AssertionError(f"import cycle: {' -> '.join([*trail, m])}")
        if state.get(m) == 2:
            return
        state[m] = 1
        for n in sorted(graph[m]):
            visit(n, [*trail, m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])
    outside = [p for p in SRC.rglob("*.py") if (SRC / "shards") not in p.parents]
    leaks = [(str(p), i) for p in outside for i in _imports(p) if i.startswith("datamill.shards._")]
    assert leaks == []


@pytest.mark.parametrize(
    "uids, dup",
    [
        ([5, 1, 9, 2], None),
        ([0, 1, 2, 3], None),
        ([4, 1, 4, 2], 4),
        (["b", "a", "c"], None),
        (["b", "a", "b"], "b"),
    ],
)
def test_uniqueness_check_of_integer_and_string_uids(uids: list, dup: object) -> None:  # type: ignore[type-arg]
    from datamill.shards.writer import _check_unique

    sizes = np.array([2, len(uids) - 2])
    if dup is None:
        _check_unique(pa.array(uids), sizes, ["a", "b"])
        return
    with pytest.raises(ShardsetError) as exc:
        _check_unique(pa.array(uids), sizes, ["a", "b"])
    assert exc.value.uid == dup and exc.value.shard == 1
