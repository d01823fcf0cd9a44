"""A malformed dataset.json is a located ShardsetError on open, and `shards check` diagnoses it."""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.errors import DatamillError, ShardsetError
from datamill.shards import ShardsetDataset, check_dataset, check_report


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp())
    ds = ShardsetDataset.create(
        tmp / "ds",
        pa.table({"uid": np.arange(6), "x": np.arange(6) * 1.5}),
        uid="uid",
        shardset="a",
        shard_size=3,
    )
    ds.add("b", pa.table({"uid": [4, 1], "y": ["four", "one"]}), route=True)
    yield tmp / "ds"
    shutil.rmtree(tmp)


def good(root: Path) -> dict[str, Any]:
    return json.loads((root / "dataset.json").read_text())  # type: ignore[no-any-return]  # JSON object


def with_manifest(root: Path, manifest: object) -> Path:
    """A copy of the dataset whose dataset.json is ``manifest``."""
    out = Path(tempfile.mkdtemp()) / "ds"
    shutil.copytree(root, out)
    (out / "dataset.json").write_text(json.dumps(manifest))
    return out


def _set(m: dict[str, Any], path: tuple[Any, ...], value: object) -> dict[str, Any]:
    m = copy.deepcopy(m)
    target: Any = m
    for p in path[:-1]:
        target = target[p]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return m


_DELETE = object()
CASES = [
    ((), "list", "(top level): expected a JSON object, got list"),
    (("uid_column",), _DELETE, "uid_column: Field required"),
    (("num_shards",), "five", "num_shards: Input should be a valid integer, got 'five'"),
    (("num_shards",), 3, "shardsets[0].num_shards: the manifest says 2 shards, the dataset has 3"),
    (("shardsets", 1, "shard_rows"), [1], "shardsets[1].shard_rows: 1 row counts for 2 shards"),
    (
        ("shardsets", 1, "shard_rows", 0),
        -1,
        "shardsets[1].shard_rows[0]: Input should be greater than or equal to 0",
    ),
    (
        ("shardsets", 1, "name"),
        "",
        "shardsets[1].name: a shardset name must be a plain folder name, got ''",
    ),
    (
        ("shardsets", 1, "name"),
        "../a",
        "shardsets[1].name: a shardset name must be a plain folder name, got '../a'",
    ),
    (
        ("shardsets", 1, "format"),
        "xls",
        "shardsets[1].format: expected 'parquet' or 'csv', got 'xls'",
    ),
    (
        ("shardsets", 1, "columns"),
        ["x"],
        "shardsets[1].columns: column 'x' is not in the shardset's schema",
    ),
    (
        ("shardsets", 1, "schema"),
        "bm90IGEgc2NoZW1h",
        "shardsets[1].schema: not a serialized Arrow schema",
    ),
    (("shardsets",), [], "shardsets: List should have at least 1 item"),
]


@pytest.mark.parametrize(("path", "value", "expected"), CASES)
def test_malformed_manifest_is_a_located_error_and_check_lists_it(
    root: Path, path: tuple[Any, ...], value: object, expected: str
) -> None:
    manifest = [good(root)] if value == "list" else _set(good(root), path, value)
    bad = with_manifest(root, manifest)
    with pytest.raises(ShardsetError) as exc:
        ShardsetDataset(bad)
    assert exc.value.path == str(bad / "dataset.json")
    assert str(exc.value).startswith(f"{bad / 'dataset.json'}: {expected}")
    report = check_report(bad)
    assert any(v["message"].startswith(expected) for v in report)
    assert all(
        v["kind"] == "ShardsetError" for v in report if v["path"] == str(bad / "dataset.json")
    )


def test_cli_check_diagnoses_a_broken_manifest(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from datamill.cli import main

    bad = with_manifest(root, _set(good(root), ("num_shards",), "five"))
    assert main(["shards", "check", str(bad)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(
        f"{bad}/dataset.json: num_shards: Input should be a valid integer, got 'five'"
    )
    assert out[-1] == f"{bad}: 1 violations"
    assert main(["shards", "check", "--json", str(bad)]) == 1
    assert json.loads(capsys.readouterr().out)[0]["message"].startswith(
        "num_shards: Input should be"
    )
    assert main(["shards", "info", "--json", str(root)]) == 0
    assert json.loads(capsys.readouterr().out)["shardsets"][1]["missing"] == 4


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10) | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@given(data=st.data())
def test_any_mutated_manifest_opens_or_raises_a_datamill_error(
    root: Path, data: st.DataObject
) -> None:
    manifest = good(root)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = _paths(manifest)
        if not paths:
            break
        path = data.draw(st.sampled_from(paths), label="path")
        value = data.draw(st.just(_DELETE) | _json_values, label="value")
        manifest = _set(manifest, path, value)
    bad = with_manifest(root, manifest)
    try:
        try:
            ds = ShardsetDataset(bad)
        except DatamillError:
            pass
        else:
            ds.info()
            ds.describe()
        problems = check_dataset(bad)  # never raises
        assert all(isinstance(p, DatamillError) for p in problems)
    finally:
        shutil.rmtree(bad.parent)
