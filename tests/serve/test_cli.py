"""``datamill serve`` on the command line: keys, the one-time admin key, --no-auth only on loopback,
iterate."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from datamill.cli import main
from datamill.core.errors import ConfigError
from datamill.serve.http.run import INITIAL_KEY_FILE, serve
from datamill.serve.journal.store import Journal
from tests.serve._proc import env, free_port, start_server, stop


def test_keys_create_list_revoke_store_only_a_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    assert (
        main(["serve", "keys", "create", "--state", str(state), "--role", "admin", "--note", "ci"])
        == 0
    )
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


def test_bad_root_or_config_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "serve.yaml"
    bad.write_text("roots: [data]\ntypo: 1\n")
    assert main(["serve", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "serve.yaml" in err and "typo" in err


@pytest.mark.server
def test_first_start_prints_a_one_time_admin_key_and_iterate_runs(
    tmp_path: Path, server: dict[str, Any]
) -> None:
    state, port = tmp_path / "state", free_port()
    log = tmp_path / "server.log"
    proc = start_server(server["root"], state, port, log=log)
    try:
        # not on a terminal: the key is in a 0600 file of the state folder, never in the log
        assert "dmk_" not in log.read_text() and str(state / INITIAL_KEY_FILE) in log.read_text()
        key = (state / INITIAL_KEY_FILE).read_text().strip()
        assert key.startswith("dmk_") and (state / INITIAL_KEY_FILE).stat().st_mode & 0o777 == 0o600
        out = subprocess.run(
            [sys.executable, "-m", "datamill.cli", "serve", "keys", "list", "--state", str(state)],
            env=env(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "admin\tactive\t" in out and key.split(".")[1] not in out
        url = f"http://127.0.0.1:{port}"
        code = (
            "import sys; from datamill.client import Client; Client(sys.argv[1], "
            "sys.argv[2]).register('ds', name='ds')"
        )
        reg = subprocess.run(
            [sys.executable, "-c", code, url, key],
            env=env(),
            capture_output=True,
            text=True,
            check=False,
        )
        assert reg.returncode == 0, reg.stderr
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "datamill.cli",
                "serve",
                "iterate",
                "--url",
                url,
                "--key",
                key,
                "ds",
                "--batch-size",
                "500",
            ],
            env=env(),
            capture_output=True,
            text=True,
            check=False,
        )
        assert res.returncode == 0, res.stderr
        assert "12 batches, 6,000 samples" in res.stdout
        # `datamill iterate DATASET --url URL` is the same command (the loader CLI forwards it)
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "datamill.cli",
                "iterate",
                "ds",
                "--url",
                url,
                "--key",
                key,
                "--batch-size",
                "500",
                "--name",
                "via-iterate",
            ],
            env=env(),
            capture_output=True,
            text=True,
            check=False,
        )
        assert res.returncode == 0, res.stderr
        assert "12 batches, 6,000 samples" in res.stdout
    finally:
        stop(proc)
    # a second start with keys present prints none
    proc = start_server(server["root"], state, port, log=tmp_path / "again.log")
    stop(proc)
    assert "admin key" not in (tmp_path / "again.log").read_text()
    assert "dmk_" not in (tmp_path / "again.log").read_text()


@pytest.mark.server
def test_demo_section_serves_cifar10_tiny_to_two_clients(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`datamill demo` starts a loopback server, two client processes share the epoch, the server
    stops."""
    from datamill.serve import demo

    demo.run(data_dir, tmp_path)
    out = capsys.readouterr().out
    counts = [
        int(line.split(":")[1].split()[0]) for line in out.splitlines() if "client rank" in line
    ]
    assert sorted(counts) == [50, 50]  # 100 images, each served once across the two ranks
    row = next(line.split() for line in out.splitlines() if line.startswith("demo "))
    assert row[1] == row[2] and row[3:] == ["0", "0"]  # total == done, nothing leased or pending
    assert "server stopped" in out


@pytest.mark.parametrize(
    "argv, shown",
    [
        (
            ["serve", "--help"],
            [
                "--host",
                "--port",
                "--allowed-hosts",
                "--lease-timeout",
                "keys",
                "audit",
                "backup",
                "iterate",
            ],
        ),
        (["serve", "keys", "--help"], ["create", "list", "revoke"]),
        (["serve", "keys", "create", "--help"], ["--role", "--datasets", "--expires", "--state"]),
        (
            ["serve", "iterate", "--help"],
            ["--url", "--batch-size", "--world-size", "--reconnect-timeout"],
        ),
        (["serve", "backup", "--help"], ["--state", "out"]),
    ],
)
def test_serve_help_shows_real_options(
    argv: list[str], shown: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert all(word in out for word in shown), out
    assert "args" not in out.split()


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "ROOT", "--port", "99999"],
        ["serve", "ROOT", "--port", "0"],
        ["serve", "--port", "-1", "ROOT"],
        ["serve", "ROOT", "--lease-timeout", "-5"],
        ["serve", "ROOT", "--lease-timeout", "nan"],
        ["serve", "ROOT", "--lease-timeout", "100000"],
        ["serve", "iterate", "ds", "--url", "http://x", "--batch-size", "0"],
        ["serve", "iterate", "ds", "--url", "http://x", "--reconnect-timeout", "inf"],
        ["serve", "ROOT", "--allowed-hosts", ","],
        ["serve", "ROOT", "--allowed-hosts", "evil.example/x"],
    ],
)
def test_ports_timeouts_and_counts_are_validated(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2  # argparse's error: one line, exit 2 (main returns it)
    err = capsys.readouterr().err
    said = "expected" in err or "must be" in err  # the option's own words, or its Limit's (cliargs)
    assert said and len([x for x in err.splitlines() if "error:" in x]) == 1


def _run_cli(cmd: list[str]) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "datamill.cli", *cmd],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return res, time.monotonic() - t0


def test_iterate_against_a_dead_server_is_one_located_line_once_its_retries_end(
    tmp_path: Path,
) -> None:
    """The client retries an unreachable server for about 4 s, then gives up with one line: the
    command ends within 6 s of twice its own start-up (measured just before as ``iterate --help``:
    a loaded machine's slower start does not count against the retry budget)."""
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for cmd in (["iterate", "ds", "--url", url], ["serve", "iterate", "ds", "--url", url]):
        start_up = _run_cli([*cmd[:-3], "--help"])[1]
        res, took = _run_cli(cmd)
        assert res.returncode == 2 and took < 2 * start_up + 6, (res.returncode, took, start_up)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: cannot reach " + url), res.stderr


def test_keys_limited_and_expiring_from_the_cli_and_the_audit_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = str(tmp_path / "state")
    assert (
        main(["serve", "keys", "create", "--state", state, "--datasets", "a,b", "--expires", "30d"])
        == 0
    )
    key = capsys.readouterr().out.strip()
    key_id = key.removeprefix("dmk_").split(".")[0]
    assert main(["serve", "keys", "list", "--state", state]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(key_id))
    assert "datasets a,b" in row and "expires 20" in row and "\tactive\t" in row
    assert main(["serve", "keys", "create", "--state", state, "--expires", "soon"]) == 2
    assert "expected a duration" in capsys.readouterr().err
    assert main(["serve", "keys", "revoke", key_id, "--state", state]) == 0
    capsys.readouterr()
    assert main(["serve", "audit", "--state", state]) == 0
    log = capsys.readouterr().out.splitlines()
    assert any(f"create key\t{key_id}" in line for line in log) and any(
        f"revoke key\t{key_id}" in line for line in log
    )
