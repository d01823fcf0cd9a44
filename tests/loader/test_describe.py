"""``datamill describe`` and :mod:`datamill.loader.describe` (the UI dataset page's facts)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamill.cli import main
from datamill.core.errors import SchemaError
from datamill.core.source import TableSource
from datamill.loader.describe import column_values, describe, footer_stats, values_stats
from datamill.shards.dataset import ShardsetDataset


def test_shardset_dataset_text_json_and_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ds"
    table = pa.table({"id": [1, 2, 3, 4], "x": [50_000, None, 2, 7], "s": ["a", "b", "a", None]})
    ds = ShardsetDataset.create(root, table, uid="id", shardset="a", shard_size=2)
    assert main(["-q", "describe", str(root), "--column", "s"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("shardset dataset: 4 samples in 2 shards, ")
    assert "a/x             1  2 .. 50,000" in out
    assert "check: OK" in out
    assert out[-2:] == ["s: 4 values, 1 missing", "  top: 'a' (2), 'b' (1)"]
    # a shard whose UIDs are out of order: check names it; --no-check skips the reading
    pq.write_table(pa.table({"id": [4, 3]}), root / "a" / ds.shard_path("a", 1).split("/")[-1])
    assert main(["-q", "describe", str(root), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["num_samples"] == 4 and d["describe"]["shardsets"][0]["name"] == "a"
    assert d["check"] and all(v["shard"] == 1 for v in d["check"])
    assert "check" not in describe(root, check=False)
    assert main(["-q", "describe", str(root)]) == 0
    assert f"check: {len(d['check'])} violations" in capsys.readouterr().out


def test_parquet_file_footer_schema_and_unknown_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.parquet"
    pq.write_table(
        pa.table({"f": pa.array([0.1, None, 2.5], pa.float32()), "b": [b"xy", b"", None]}), path
    )
    d = describe(path)
    assert d["kind"] == "Parquet" and d["bytes"] == path.stat().st_size
    assert d["schema"] == [{"name": "f", "type": "float"}, {"name": "b", "type": "binary"}]
    assert (d["footer"]["f"]["min_text"], d["footer"]["f"]["nulls"]) == ("0.1", 1)
    assert d["footer"]["b"]["min"] is None  # binary min/max left out
    assert main(["-q", "describe", str(path), "--column", "nope"]) == 2
    assert "unknown column 'nope'" in capsys.readouterr().err


def test_column_values_reports_each_shard_and_histograms_lengths() -> None:
    src = TableSource(pa.table({"l": [[1], [1, 2], [], None]}), shard_size=1)
    seen: list[int] = []
    v = column_values(src, "l", on_shard=seen.append)
    assert seen == [1, 2, 3, 4]
    assert (v["count"], v["nulls"], v["of"], v["top"]) == (4, 1, "length", [])
    assert sum(v["histogram"]["counts"]) == 3
    with pytest.raises(SchemaError) as err:
        column_values(src, "x")
    assert err.value.column == "x"
    assert values_stats(pa.array(["b", "a", "b"]))["top"][0] == {"value": "b", "count": 2}
    assert footer_stats(src) is None  # not Parquet


def test_rows_print_a_page_as_the_web_ui_shows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ds"
    table = pa.table({"id": [7, 8, 9], "f": [0.123456, None, 2e5], "l": [[1], list(range(9)), []]})
    ShardsetDataset.create(root, table, uid="id", shardset="a", shard_size=2)
    assert main(["-q", "describe", str(root), "--no-check", "--rows", "1:5"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-3:] == [
        "rows 1 to 3 of 3:",
        "  row 1 uid 8  id=8 f=missing l=[0, 1, 2, 3, 4, 5, 6, 7, …]",
        "  row 2 uid 9  id=9 f=200,000 l=[]",
    ]
    assert main(["-q", "describe", str(root), "--rows", "two"]) == 2
    assert "--rows expects [OFFSET:]LIMIT" in capsys.readouterr().err
