"""Bad input: each error has its type and names file, line/row and column; the CLI prints one
line."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamill.cli import main
from datamill.core.errors import ConfigError, DataFileError, DataFileNotFoundError, SchemaError
from datamill.preprocessing.api import preprocess

CFG = {"input_features": [{"name": "age", "type": "number"}, {"name": "city", "type": "category"}]}


def test_missing_column_csv(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text("age,town\n1,a\n")
    with pytest.raises(SchemaError) as info:
        preprocess(p, CFG)
    assert info.value.path == str(p) and info.value.column == "city"
    assert "town" in str(info.value)


def test_unparsable_number_names_file_line_column_value(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text("age,city\n1,a\n2,b\nforty,c\n4,d\n")
    with pytest.raises(DataFileError) as info:
        preprocess(p, CFG)
    err = info.value
    assert (err.path, err.line, err.column) == (str(p), 4, "age")
    assert "'forty'" in str(err)


def test_unparsable_number_in_memory_and_parquet_use_rows(tmp_path: Path) -> None:
    t = pa.table({"age": ["1", "x2"], "city": ["a", "b"]})
    with pytest.raises(DataFileError) as info:
        preprocess(t, CFG)
    assert (info.value.row, info.value.column, info.value.line) == (1, "age", None)
    p = tmp_path / "d.parquet"
    pq.write_table(t, p)
    with pytest.raises(DataFileError) as info:
        preprocess(p, CFG)
    assert (info.value.path, info.value.row, info.value.column) == (str(p), 1, "age")


def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text("")
    with pytest.raises(DataFileError) as info:
        preprocess(p, CFG)
    assert info.value.path == str(p) and "empty" in str(info.value)
    p.write_text("age,city\n")
    with pytest.raises(DataFileError) as info:
        preprocess(p, CFG)
    assert info.value.path == str(p) and "no rows" in str(info.value)


def test_non_utf8_file(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_bytes(b"age,city\n1,Z\xfcrich\n")
    with pytest.raises(DataFileError) as info:
        preprocess(p, CFG)
    assert info.value.path == str(p) and "UTF-8" in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataFileNotFoundError) as info:
        preprocess(tmp_path / "nope.csv", CFG)
    assert info.value.path == str(tmp_path / "nope.csv")


def test_bad_config_file(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text("age,city\n1,a\n")
    c = tmp_path / "c.yaml"
    c.write_text(
        "input_features:\n  - {name: age, type: number, preprocessing: {normalisation: zscore}}\n"
    )
    with pytest.raises(ConfigError) as info:
        preprocess(p, c)
    assert info.value.path == str(c) and "input_features[0].preprocessing.normalisation" in str(
        info.value
    )


def test_cli_prints_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "d.csv"
    p.write_text("age,city\n1,a\nforty,c\n")
    c = tmp_path / "c.yaml"
    c.write_text("input_features:\n  - {name: age, type: number}\n")
    assert main(["preprocess", str(p), "--config", str(c)]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and "line 3" in err and 'column "age"' in err
    assert not (tmp_path / "d.meta.json").exists()


def test_fixed_split_bad_value(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text("age,city,s\n1,a,train\n2,b,oops\n")
    cfg = {**CFG, "preprocessing": {"split": {"type": "fixed", "column": "s"}}}
    with pytest.raises(DataFileError) as info:
        preprocess(p, cfg)
    assert (info.value.line, info.value.column) == (3, "s")


def test_line_numbers_survive_drop_row(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text("c,b\n,Y\nx,N\ny,maybe\n")
    cfg = {
        "input_features": [
            {
                "name": "c",
                "type": "category",
                "preprocessing": {"missing_value_strategy": "drop_row"},
            },
            {"name": "b", "type": "binary"},
        ]
    }
    with pytest.raises(DataFileError) as info:
        preprocess(p, cfg)
    assert (info.value.line, info.value.column) == (4, "b") and "'maybe'" in str(info.value)
