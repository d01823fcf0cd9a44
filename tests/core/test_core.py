"""errors, io (formats, zip members, UTF-8, atomic writes), fingerprints, rng."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from datamill import DataFileError, DataFileNotFoundError, DatamillError
from datamill.core.errors import ConfigError, format_location
from datamill.core.fingerprint import chain, fingerprint_file, fingerprint_obj
from datamill.core.io import atomic_dir, atomic_path, atomic_write, read_table, read_text
from datamill.core.rng import rng_for


def test_error_family_inherits_builtins_and_keeps_location() -> None:
    err = DataFileError(
        "expected a number, got 'n/a'", path="train.csv", line=1205, column="age", hint="fix it"
    )
    assert isinstance(err, DatamillError) and isinstance(err, ValueError)
    assert (err.path, err.line, err.column) == ("train.csv", 1205, "age")
    assert str(err).startswith('train.csv, line 1,205, column "age": expected a number')
    assert "\n" not in err.one_line() and "Fix: fix it" in err.one_line()
    assert isinstance(DataFileNotFoundError("x", path="a"), FileNotFoundError)
    assert format_location(None) == ""


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("t.csv", "a,b\n1,x\n,y\n", {"a": [1, None], "b": ["x", "y"]}),
        ("t.tsv", "a\tb\n1\tx\n", {"a": [1], "b": ["x"]}),
        ("t.jsonl", '{"a": 1, "b": "x"}\n{"a": 2, "b": null}\n', {"a": [1, 2], "b": ["x", None]}),
    ],
)
def test_read_table_formats(
    tmp_path: Path, name: str, content: str, expected: dict[str, list[object]]
) -> None:
    p = tmp_path / name
    p.write_text(content)
    assert read_table(p).to_pydict() == expected


def test_read_table_parquet_and_zip_member(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "t.parquet")
    assert read_table(tmp_path / "t.parquet").to_pydict() == {"x": [1, 2]}
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as zf:
        zf.writestr("d/t.csv", "x\n5\n")
    assert read_table(f"{tmp_path}/a.zip:d/t.csv").to_pydict() == {"x": [5]}
    with pytest.raises(DataFileNotFoundError, match="no member"):
        read_table(f"{tmp_path}/a.zip:d/nope.csv")


def test_read_errors_name_file_and_line(tmp_path: Path) -> None:
    empty = tmp_path / "e.csv"
    empty.write_text("")
    with pytest.raises(DataFileError, match="empty") as ei:
        read_table(empty)
    assert ei.value.path == str(empty)
    bad = tmp_path / "b.csv"
    bad.write_bytes("a,b\nok,1\ncaf\xe9,2\n".encode("latin-1"))
    with pytest.raises(DataFileError, match="UTF-8") as ei:
        read_table(bad)
    assert ei.value.line == 3
    ragged = tmp_path / "r.csv"
    ragged.write_text("a,b\n1,2\n3\n")
    with pytest.raises(DataFileError) as ei:
        read_table(ragged)
    assert ei.value.path == str(ragged)
    badjson = tmp_path / "j.jsonl"
    badjson.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(DataFileError) as ei:
        read_table(badjson)
    assert ei.value.line == 2
    with pytest.raises(DataFileNotFoundError):
        read_table(tmp_path / "missing.csv")
    with pytest.raises(DataFileError, match="suffix"):
        read_table(tmp_path / "x.weird")
    txt = tmp_path / "t.txt"
    txt.write_bytes(b"hello\n\xff\n")
    with pytest.raises(DataFileError) as ei:
        read_text(txt)
    assert ei.value.line == 2


@pytest.mark.parametrize(
    ("name", "content", "line"),
    [
        ("t.csv", "a,b\n1,2\n3,4\n5,6,7\n8,9\n", 4),
        ("t.tsv", "a\tb\n1\t2\n3\n", 3),
        ("q.csv", 'a,b\n"x\ny",2\n3,4,5\n', 4),  # a quoted value spanning two lines
    ],
)
def test_csv_with_a_wrong_field_count_names_the_line(
    tmp_path: Path, name: str, content: str, line: int
) -> None:
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(DataFileError) as info:
        read_table(p)
    assert (info.value.path, info.value.line) == (str(p), line)
    assert "Expected 2 columns" in str(info.value)


def test_atomic_write_leaves_nothing_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "meta.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(target) as f:
        f.write("half")
        raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["meta.json"]
    with atomic_path(tmp_path / "x.bin") as tmp:
        tmp.write_bytes(b"1")
    assert (tmp_path / "x.bin").read_bytes() == b"1"
    with pytest.raises(ValueError), atomic_dir(tmp_path / "d") as d:
        (d / "f").write_text("x")
        raise ValueError("boom")
    assert not (tmp_path / "d").exists()
    with atomic_dir(tmp_path / "d") as d:
        (d / "f").write_text("x")
    with atomic_dir(tmp_path / "d") as d:
        (d / "g").write_text("y")
    assert os.listdir(tmp_path / "d") == ["g"]
    assert sorted(os.listdir(tmp_path)) == ["d", "meta.json", "x.bin"]


def test_atomic_write_killed_process_leaves_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    code = (
        "import os, sys\nfrom datamill.core.io import atomic_write\n"
        f"with atomic_write({str(target)!r}) as f:\n    f.write('partial'); f.flush(); "
        "os._exit(9)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], check=False)
    assert proc.returncode == 9
    assert target.read_text() == "old"


def test_fingerprints_are_content_based_and_stable(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    p.write_text("a\n1\n")
    fp = fingerprint_file(p)
    os.utime(p, (0, 0))
    assert fingerprint_file(p) == fp
    p.write_text("a\n2\n")
    assert fingerprint_file(p) != fp
    assert fingerprint_obj({"b": 1, "a": [1, 2]}) == fingerprint_obj({"a": [1, 2], "b": 1})
    assert chain("x", "t@1", {"a": 1}) != chain("x", "t@2", {"a": 1})
    # stable across processes (no salted hash())
    code = (
        "from datamill.core.fingerprint import fingerprint_obj; print(fingerprint_obj({'a': 'b'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == fingerprint_obj({"a": "b"})


def test_rng_for_is_pure() -> None:
    a = rng_for(3, "shuffle", 1).integers(0, 1 << 30, 10)
    np.testing.assert_array_equal(a, rng_for(3, "shuffle", 1).integers(0, 1 << 30, 10))
    assert not np.array_equal(a, rng_for(3, "shuffle", 2).integers(0, 1 << 30, 10))
    assert not np.array_equal(a, rng_for(4, "shuffle", 1).integers(0, 1 << 30, 10))


def test_config_error_is_value_error() -> None:
    assert issubclass(ConfigError, ValueError)
