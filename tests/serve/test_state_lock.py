"""The state folder's lock (issue #37): one server per ``--state``; kill -9 releases it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from datamill.serve.journal.schema import LOCK_NAME, StateLockedError, lock_state, unlock_state
from datamill.serve.journal.store import Journal

from ._proc import env, free_port, start_server, stop

pytestmark = pytest.mark.server


def _second(root: Path, state: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "datamill.cli", "serve", str(root), "--state", str(state)]
    port = ["--port", str(free_port())]
    return subprocess.run(
        cmd + port, env=env(), capture_output=True, text=True, timeout=60, check=False
    )


def test_a_second_server_on_a_locked_state_exits_2_and_kill_9_releases_it(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    state = tmp_path / "state"
    first = start_server(server["root"], state, free_port())
    try:
        res = _second(server["root"], state)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2, res.stderr
        assert len(lines) == 1 and str(state) in lines[0] and f"pid {first.pid}" in lines[0]
        gc = subprocess.run(
            [
                sys.executable,
                "-m",
                "datamill.cli",
                "serve",
                "gc",
                "--state",
                str(state),
                "--older-than",
                "1d",
            ],
            env=env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )  # gc (like keys and backup) writes beside a running server
        assert gc.returncode == 0, gc.stderr
    finally:
        stop(first, kill=True)  # kill -9: the OS releases the lock, no manual step
    again = start_server(server["root"], state, free_port())
    stop(again)


def test_the_lock_names_its_holder_and_is_released_on_close(tmp_path: Path) -> None:
    j = Journal(tmp_path, lock="server")
    with pytest.raises(StateLockedError) as err:
        Journal(tmp_path, lock="gc")
    assert err.value.holder == (os.getpid(), "server")
    beside = Journal(tmp_path, lock="keys", beside=True)  # a key written beside the server
    beside.close()
    j.close()
    unlock_state(lock_state(tmp_path, "gc"))
    assert (tmp_path / LOCK_NAME).exists()
    Journal(tmp_path, lock="server").close()  # the lock file is the folder's own
