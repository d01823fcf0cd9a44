"""A journal you can trust: private permissions, checked at start, one error line for bad state,
backup/restore."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from datamill.serve.http.auth import KeyStore, create_key
from datamill.serve.journal.schema import DB_NAME, StateError
from datamill.serve.journal.store import Journal, backup
from tests.serve._proc import env, free_port, start_server, stop

pytestmark = pytest.mark.server


def _filled(state: Path) -> tuple[Journal, str]:
    j = Journal(state)
    _, key = create_key(j, role="read", note="filled")
    j.add_iteration("it-1", "k", 0, {"dataset": "ds-1"})
    j.add_done("it-1", [(i, i + 1) for i in range(200)], lease="l.1")
    j.add_audit("k", "rewind iteration", "it-1")
    return j, key


def _serve(root: Path, state: Path) -> subprocess.CompletedProcess[str]:
    """Start a server on bad state: it must exit by itself (it never starts)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "datamill.cli",
            "serve",
            str(root),
            "--state",
            str(state),
            "--port",
            str(free_port()),
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _one_line_naming(res: subprocess.CompletedProcess[str], path: Path) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(path) in lines[0], res.stderr
    assert "Traceback" not in res.stderr and "sqlite3." not in res.stderr


def test_state_folder_is_0700_and_database_0600(tmp_path: Path) -> None:
    j, _ = _filled(tmp_path / "state")
    j.close()
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    for f in (tmp_path / "state").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    Journal(loose).close()
    assert stat.S_IMODE(loose.stat().st_mode) == 0o700  # an existing folder is made private


def _flip(db: Path, offsets: range) -> None:
    data = bytearray(db.read_bytes())
    for i in offsets:
        data[i] ^= 0x5A
    db.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        "flipped-header",
        "flipped-schema",
        "flipped-data",
        "truncated-mid-page",
        "truncated-at-page",
        "truncated-to-zero",
        "folder-as-file",
        "state-is-file",
        "empty-garbage",
    ],
)
def test_bad_state_is_one_error_line_naming_the_path_and_no_server(
    tmp_path: Path, damage: str
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    state = tmp_path / "state"
    j, _ = _filled(state)
    j.close()
    db = state / DB_NAME
    for side in state.glob(DB_NAME + "-*"):  # a checkpointed journal: the damage is in the one file
        side.unlink()
    size = db.stat().st_size
    named = db
    if damage == "flipped-header":
        _flip(db, range(16, 100))
    elif damage == "flipped-schema":
        _flip(db, range(100, 4096, 3))
    elif damage == "flipped-data":
        _flip(db, range(size - 3 * 4096, size, 5))
    elif damage == "truncated-mid-page":
        db.write_bytes(db.read_bytes()[: size // 2 + 100])
    elif damage == "truncated-at-page":
        db.write_bytes(db.read_bytes()[: 4096 * 2])
    elif damage == "truncated-to-zero":
        db.write_bytes(b"")
    elif damage == "folder-as-file":
        db.unlink()
        db.mkdir()
    elif damage == "state-is-file":
        shutil.rmtree(state)
        state.write_text("not a folder")
        named = state
    elif damage == "empty-garbage":
        db.write_bytes(b"\0" * 4096)
    with pytest.raises(StateError) as err:
        Journal(named if damage == "state-is-file" else state).close()
    assert str(named) in str(err.value)
    _one_line_naming(_serve(root, named if damage == "state-is-file" else state), named)


def test_backup_of_a_running_server_restores_keys_iterations_and_acks(tmp_path: Path) -> None:
    state = tmp_path / "state"
    j, key = _filled(state)
    out = tmp_path / "backup.sqlite3"
    res = subprocess.run(
        [sys.executable, "-m", "datamill.cli", "serve", "backup", "--state", str(state), str(out)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # the journal is open meanwhile
    assert res.returncode == 0, res.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    again = subprocess.run(
        [sys.executable, "-m", "datamill.cli", "serve", "backup", "--state", str(state), str(out)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 2 and "overwrite" in again.stderr  # never over a user's file
    expected = (j.list_keys(), j.iterations(), j.done("it-1"), j.audit())
    j.close()
    restored = tmp_path / "restored"
    restored.mkdir(mode=0o700)
    shutil.copyfile(out, restored / DB_NAME)
    r = Journal(restored)
    try:
        assert (r.list_keys(), r.iterations(), r.done("it-1"), r.audit()) == expected
        info = KeyStore(r).check(key)
        assert info is not None and info.role == "read"
    finally:
        r.close()
    with pytest.raises(StateError):
        backup(tmp_path / "missing-file-as-state" / "x", out)


def test_a_restored_journal_serves(tmp_path: Path, server: dict[str, Any]) -> None:
    from datamill.client import Client

    with Client(server["url"], server["read"]) as c:
        live = [
            d["name"] for d in c.datasets()
        ]  # the module's other tests may have registered more
    out = tmp_path / "live.sqlite3"
    backup(server["state"], out)  # the package's server is running on this state
    restored = tmp_path / "restored"
    restored.mkdir()
    shutil.copyfile(out, restored / DB_NAME)
    port = free_port()
    proc = start_server(server["root"], restored, port)
    try:
        with Client(f"http://127.0.0.1:{port}", server["read"]) as c:
            assert [d["name"] for d in c.datasets()] == live and "ds" in live
    finally:
        stop(proc)


def test_a_journal_of_the_previous_release_is_migrated(tmp_path: Path) -> None:
    import sqlite3

    state = tmp_path / "old"
    state.mkdir()
    db = sqlite3.connect(state / DB_NAME)
    db.execute(
        "CREATE TABLE keys (id TEXT PRIMARY KEY, hash TEXT NOT NULL, role TEXT NOT NULL, "
        "created REAL NOT NULL,"
        " revoked REAL, note TEXT NOT NULL DEFAULT '')"
    )
    db.execute("INSERT INTO keys VALUES ('abc', 'h', 'read', 1.0, NULL, 'old')")
    db.commit()
    db.close()
    j = Journal(state)
    try:
        assert j.list_keys() == [
            {
                "id": "abc",
                "hash": "h",
                "role": "read",
                "created": 1.0,
                "revoked": None,
                "note": "old",
                "datasets": None,
                "expires": None,
            }
        ]
    finally:
        j.close()
