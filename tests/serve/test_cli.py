"""``datamill serve`` on the command line: keys, the one-time admin key, --no-auth only on loopback, iterate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from datamill.cli import main
from datamill.core.errors import ConfigError
from datamill.serve.journal import Journal
from datamill.serve.run import serve
from tests.serve._proc import env, free_port, start_server, stop


def test_keys_create_list_revoke_store_only_a_digest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    assert main(["serve", "keys", "create", "--state", str(state), "--role", "admin", "--note", "ci"]) == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("dmk_")
    key_id, secret = key.removeprefix("dmk_").split(".")
    db = b"".join(p.read_bytes() for p in state.iterdir())  # the database and its WAL
    assert secret.encode() not in db  # only sha256(secret) is stored
    assert main(["serve", "keys", "list", "--state", str(state)]) == 0
    assert f"{key_id}\tadmin\tactive" in capsys.readouterr().out
    assert main(["serve", "keys", "revoke", key_id, "--state", str(state)]) == 0
    assert main(["serve", "keys", "revoke", key_id, "--state", str(state)]) == 1
    journal = Journal(state)
    assert [k["revoked"] is not None for k in journal.list_keys()] == [True]
    journal.close()


def test_no_auth_is_refused_off_loopback(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="loopback"):
        serve(tmp_path, host="0.0.0.0", auth=False, state=tmp_path / "state")


def test_bad_root_or_config_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "serve.yaml"
    bad.write_text("roots: [data]\ntypo: 1\n")
    assert main(["serve", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "serve.yaml" in err and "typo" in err


@pytest.mark.server
def test_first_start_prints_a_one_time_admin_key_and_iterate_runs(tmp_path: Path, server: dict[str, Any]) -> None:
    state, port = tmp_path / "state", free_port()
    log = tmp_path / "server.log"
    proc = start_server(server["root"], state, port, log=log)
    try:
        key = next(line.split(": ")[-1] for line in log.read_text().splitlines() if "admin key" in line)
        out = subprocess.run([sys.executable, "-m", "datamill.cli", "serve", "keys", "list", "--state", str(state)],
                             env=env(), capture_output=True, text=True, check=True).stdout
        assert "admin\tactive\t" in out and key.split(".")[1] not in out
        url = f"http://127.0.0.1:{port}"
        code = "import sys; from datamill.serve import Client; Client(sys.argv[1], sys.argv[2]).register('ds', name='ds')"
        reg = subprocess.run([sys.executable, "-c", code, url, key],
                             env=env(), capture_output=True, text=True, check=False)
        assert reg.returncode == 0, reg.stderr
        res = subprocess.run([sys.executable, "-m", "datamill.cli", "serve", "iterate", "--url", url, "--key", key,
                              "ds", "--batch-size", "500"], env=env(), capture_output=True, text=True, check=False)
        assert res.returncode == 0, res.stderr
        assert "12 batches, 6,000 samples" in res.stdout
        # `datamill iterate DATASET --url URL` is the same command (the loader CLI forwards it)
        res = subprocess.run([sys.executable, "-m", "datamill.cli", "iterate", "ds", "--url", url, "--key", key,
                              "--batch-size", "500", "--name", "via-iterate"], env=env(), capture_output=True,
                             text=True, check=False)
        assert res.returncode == 0, res.stderr
        assert "12 batches, 6,000 samples" in res.stdout
    finally:
        stop(proc)
    # a second start with keys present prints none
    proc = start_server(server["root"], state, port, log=tmp_path / "again.log")
    stop(proc)
    assert "admin key" not in (tmp_path / "again.log").read_text()


@pytest.mark.server
def test_demo_section_serves_cifar10_tiny_to_two_clients(data_dir: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`datamill demo` starts a loopback server, two client processes share the epoch, the server stops."""
    from datamill.serve import demo

    demo.run(data_dir, tmp_path)
    out = capsys.readouterr().out
    counts = [int(line.split(":")[1].split()[0]) for line in out.splitlines() if "client rank" in line]
    assert sorted(counts) == [50, 50]  # 100 images, each served once across the two ranks
    row = next(line.split() for line in out.splitlines() if line.startswith("demo "))
    assert row[1] == row[2] and row[3:] == ["0", "0"]  # total == done, nothing leased or pending
    assert "server stopped" in out
