"""core.output: the atomic folder switch, its repair, litter, full disks, and
check_output(overwrite=)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from datamill.core import output
from datamill.core.errors import DataFileError, OutputError
from datamill.core.output import (
    as_output_error,
    atomic_dir,
    atomic_path,
    check_output,
    clean_stale_temps,
    find_litter,
    is_datamill_output,
)


def test_atomic_dir_replaces_the_whole_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.npy").write_text("old")
    with atomic_dir(out) as tmp:
        (tmp / "new.npy").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["new.npy"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_atomic_dir_without_exchange_uses_two_renames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "_exchange", lambda a, b: False)
    out = tmp_path / "out"
    out.mkdir()
    (out / "a").write_text("old")
    with atomic_dir(out) as tmp:
        (tmp / "a").write_text("new")
    assert (out / "a").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == [
        "out"
    ]


def test_a_switch_killed_between_its_renames_is_undone(tmp_path: Path) -> None:
    old = (
        tmp_path / ".out.old-999999999-0123abcd"
    )  # what a dead process left: the previous output aside
    old.mkdir()
    (old / "corpus.json").write_text("{}")
    (tmp_path / ".out.tmp-999999999-89abcdef").mkdir()  # and its unfinished new one
    removed = clean_stale_temps(tmp_path / "out")
    assert [p.name for p in removed] == [".out.tmp-999999999-89abcdef"]
    assert (tmp_path / "out" / "corpus.json").exists() and not old.exists()


def test_failed_block_leaves_the_old_output(tmp_path: Path) -> None:
    out = tmp_path / "out.bin"
    out.write_text("old")
    with pytest.raises(OutputError) as info, atomic_path(out) as tmp:
        tmp.write_text("partial")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert info.value.path == os.fspath(out) and "disk is full" in str(info.value)
    assert out.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


@pytest.mark.parametrize(
    ("exc", "what"),
    [
        (OSError(errno.EFBIG, "File too large"), "size limit"),
        (
            RuntimeError(
                "Can't write data (file write failed: errno = 28, error message = 'No space left')"
            ),
            "full",
        ),
        (OSError("9928 requested and 4968 written"), "full"),
    ],
)
def test_as_output_error_recognises_full_disks(exc: BaseException, what: str) -> None:
    err = as_output_error(exc, "x")
    assert err is not None and what in str(err)
    assert as_output_error(OSError(errno.ENOENT, "No such file"), "x") is None
    denied = as_output_error(
        OSError(errno.EACCES, "Permission denied"), "x"
    )  # issue 27: also a located line
    assert denied is not None and denied.path == "x" and "permission denied" in str(denied)


def test_find_litter_keeps_live_processes_temporaries(tmp_path: Path) -> None:
    live = tmp_path / f".out.tmp-{os.getpid()}-0123abcd"
    dead = [
        tmp_path / ".out.tmp-999999999-0123abcd",
        tmp_path / ".tmp-train-999999999-0123abcd",
        tmp_path / ".bert-scratch-999999999-xyz",
    ]
    for p in [live, *dead]:
        p.mkdir()
    (tmp_path / ".hidden-of-yours").write_text("mine")
    assert find_litter(tmp_path, remove=True) == sorted(dead)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".hidden-of-yours", live.name])


def test_overwrite_allows_other_datamill_outputs_only(tmp_path: Path) -> None:
    (tmp_path / "w2v").mkdir()
    (tmp_path / "w2v" / "skipgram.json").write_text('{"format": "datamill.word2vec/1"}')
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.md").write_text("mine")
    assert is_datamill_output(tmp_path / "w2v") and not is_datamill_output(tmp_path / "mine")
    with pytest.raises(DataFileError, match="another kind of datamill output"):
        check_output(tmp_path / "w2v", is_own=lambda p: False, what="corpus folder")
    assert (
        check_output(tmp_path / "w2v", is_own=lambda p: False, overwrite=True) == tmp_path / "w2v"
    )
    with pytest.raises(DataFileError, match="not a datamill"):
        check_output(tmp_path / "mine", is_own=lambda p: False, overwrite=True)
    with pytest.raises(DataFileError, match="input"):
        check_output(
            tmp_path / "w2v",
            is_own=lambda p: True,
            inputs=[tmp_path / "w2v" / "skipgram.json"],
            overwrite=True,
        )
