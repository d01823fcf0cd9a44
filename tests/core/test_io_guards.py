"""Output guards and litter cleaning in core.io: nothing of the user's is replaced, nothing
half-written stays."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from datamill.core.errors import DataFileError
from datamill.core.io import atomic_dir, atomic_path, check_output, clean_stale_temps


def test_check_output_refuses_a_users_file_and_folder(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("precious")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "notes.md").write_text("precious")
    for target in (tmp_path / "mine.txt", tmp_path / "dir"):
        with pytest.raises(DataFileError) as info:
            check_output(target, is_own=lambda p: False, what="corpus folder")
        assert info.value.path == os.fspath(target)
        assert "not a datamill corpus folder" in str(info.value)
    assert (tmp_path / "mine.txt").read_text() == "precious"
    assert (tmp_path / "dir" / "notes.md").read_text() == "precious"


def test_check_output_allows_absent_empty_and_own(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "corpus.json").write_text("{}")
    assert check_output(tmp_path / "absent", is_own=lambda p: False) == tmp_path / "absent"
    assert check_output(tmp_path / "empty", is_own=lambda p: False) == tmp_path / "empty"
    own = check_output(tmp_path / "own", is_own=lambda p: (p / "corpus.json").is_file())
    assert own == tmp_path / "own"


def test_check_output_refuses_the_input_or_a_folder_holding_it(tmp_path: Path) -> None:
    data = tmp_path / "d" / "x.txt"
    data.parent.mkdir()
    data.write_text("text")
    for target in (data, data.parent, tmp_path):
        with pytest.raises(DataFileError, match="overwrite an input"):
            check_output(target, is_own=lambda p: True, inputs=[data])
    with pytest.raises(DataFileError, match="overwrite an input"):  # archive members name their zip
        check_output(
            tmp_path / "a.zip", is_own=lambda p: True, inputs=[f"{tmp_path / 'a.zip'}:member.txt"]
        )


def test_atomic_dir_never_replaces_a_file(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.write_text("a user's file")
    with pytest.raises(DataFileError, match="is a file"), atomic_dir(target) as tmp:
        (tmp / "x").write_text("new")
    assert target.read_text() == "a user's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


_WRITER = textwrap.dedent("""
    import sys, time
    from datamill.core.io import atomic_path
    with atomic_path(sys.argv[1]) as tmp:
        tmp.write_bytes(b"partial")
        print("ready", flush=True)
        time.sleep(60)
""")


def test_kill_9_leaves_litter_that_the_next_write_removes(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"previous good output")
    with subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(target)], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
    litter = [p for p in tmp_path.iterdir() if p.name != "out.bin"]
    assert len(litter) == 1 and litter[0].name.startswith(".out.bin.tmp-")
    assert target.read_bytes() == b"previous good output"  # the previous output is intact

    with atomic_path(target) as tmp:
        tmp.write_bytes(b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]
    assert target.read_bytes() == b"new"


def test_clean_stale_temps_leaves_live_writers_and_other_names_alone(tmp_path: Path) -> None:
    mine = tmp_path / f".out.bin.tmp-{os.getpid()}-0123abcd"  # a live process (this one)
    other = tmp_path / ".other.bin.tmp-999999999-0123abcd"
    dead = tmp_path / ".out.bin.tmp-999999999-0123abcd"
    for p in (mine, other, dead):
        p.write_bytes(b"x")
    (tmp_path / ".out.bin.tmp-999999998-fedcba98").mkdir()
    start = time.perf_counter()
    removed = clean_stale_temps(tmp_path / "out.bin")
    assert time.perf_counter() - start < 5
    assert sorted(p.name for p in removed) == [".out.bin.tmp-999999998-fedcba98", dead.name]
    assert mine.exists() and other.exists() and not dead.exists()


# ---------------------------------------------------------------- located read errors


def test_jsonl_type_change_names_line_and_column(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"a": 1, "b": "x"}\n\n{"a": 2, "b": "y"}\n{"a": "three", "b": "z"}\n')
    from datamill.core.io import read_table

    with pytest.raises(DataFileError) as info:
        read_table(p)
    assert (info.value.line, info.value.column) == (4, "a")


@pytest.mark.parametrize("suffix", ["csv", "parquet", "jsonl"])
def test_a_missing_column_is_a_located_schema_error(tmp_path: Path, suffix: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datamill.core.errors import SchemaError
    from datamill.core.io import read_table

    p = tmp_path / f"t.{suffix}"
    if suffix == "csv":
        p.write_text("a,b\n1,2\n")
    elif suffix == "parquet":
        pq.write_table(pa.table({"a": [1], "b": [2]}), p)
    else:
        p.write_text('{"a": 1, "b": 2}\n')
    with pytest.raises(SchemaError) as info:
        read_table(p, columns=["a", "zz"])
    assert (info.value.column, info.value.path) == ("zz", os.fspath(p))


def test_a_zip_member_with_a_bad_crc_is_a_located_error(tmp_path: Path) -> None:
    import zipfile

    from datamill.core.io import read_bytes, read_table, read_text

    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("t.csv", "a,b\n" + "1,2\n" * 200)
    raw = bytearray(archive.read_bytes())
    raw[raw.index(b"1,2\n") + 2] = ord(
        "9"
    )  # flip one content byte: the stored CRC no longer matches
    archive.write_bytes(bytes(raw))
    for read in (read_bytes, read_text, read_table):
        with pytest.raises(DataFileError, match="corrupt") as info:
            read(f"{archive}:t.csv")
        assert info.value.path == os.fspath(archive)
