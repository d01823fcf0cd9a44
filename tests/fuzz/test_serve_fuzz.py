"""Generated ``datamill serve ROOT_OR_CONFIG [options]`` command lines, each in a child process.

The server blocks, so it is not a leaf of the in-process walk (tests/fuzz/commands.py). Here each
generated line must either be refused (exit 2, one ``error:`` line, no traceback) or start a server
that answers ``/health`` on loopback and exits 0 on SIGTERM; nothing outside the command's own state
folder may change (the same workspace checks as the other fuzzers).
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.commands import argv_repr
from tests.fuzz.runner import COUNTS, Outcome, _restore, check_output_text, snapshot
from tests.fuzz.workspace import Workspace

pytestmark = [pytest.mark.fuzz, pytest.mark.server, pytest.mark.slow]

EXAMPLES = int(os.environ.get("DATAMILL_FUZZ_SERVE_EXAMPLES", "12"))
START_LIMIT_S = 30.0
"""How long a line may take to either exit or answer /health (a server start imports FastAPI)."""
STOP_LIMIT_S = 20.0
"""How long SIGTERM may take with no lease in flight, whatever --drain-timeout says."""

FREE = "{free}"  # replaced by a free loopback port when the line runs


def _values(ws: Workspace) -> dict[str, list[str]]:
    """Each option's menu: good values first, then hostile ones (never a non-loopback address)."""
    p = ws.p
    files = [p("inputs/table.csv"), p("missing"), p("user/notes.txt"), "", "\x7f", "x" * 300]
    return {
        "--host": ["127.0.0.1", "localhost", "", "-1", "127.0.0.1:80", "::1"],
        "--port": [FREE, "0", "65536", "x", "-1", "1e3"],
        "--state": [
            p("fresh_dir"),
            p("user/mydir"),
            p("user/notes.txt"),
            p("ro"),
            p("under_file"),
            "",
        ],
        "--lease-timeout": ["5", "0", "-1", "nan", "1e9", "inf"],
        "--allowed-hosts": ["*", "", ",,", "a" * 300, "127.0.0.1:1:2"],
        "--log-format": ["json", "text", "xml"],
        "--log-level": ["debug", "warning", "loud"],
        "--ssl-certfile": files,
        "--ssl-keyfile": files,
        "--forwarded-allow-ips": ["*", "", "not-an-ip", "127.0.0.1"],
        "--drain-timeout": ["0", "3600", "-1", "nan", "x"],
        "--build-workers": ["0", "1", "-1", "65", "x"],
    }


def _roots(ws: Workspace) -> list[str]:
    p = ws.p
    return [
        p("outputs/ds"),
        os.path.dirname(p("outputs/ds")),
        p("inputs/table.csv"),
        p("inputs/table.yaml"),
        p("missing_dir"),
        p("user/mydir"),
        p("bad/dataset.json") if "bad/dataset.json" in ws.paths else p("missing"),
        "",
        "-",
    ]


@st.composite
def serve_lines(draw: st.DrawFn, ws: Workspace) -> list[str]:
    values = _values(ws)
    argv = ["serve", draw(st.sampled_from(_roots(ws)))]
    for flag in draw(st.lists(st.sampled_from(sorted(values)), unique=True, max_size=5)):
        argv += [flag, draw(st.sampled_from(values[flag]))]
    argv += draw(st.lists(st.sampled_from(["--no-auth", "--metrics-no-auth"]), unique=True))
    if "--port" not in argv:
        argv += ["--port", FREE]
    if "--state" not in argv:
        argv += ["--state", ws.p("fresh_dir")]
    return argv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _health(port: int) -> bool:
    for host in ("127.0.0.1", "::1"):
        try:
            conn = http.client.HTTPConnection(host, port, timeout=2)
            conn.request("GET", "/health", headers={"Host": f"127.0.0.1:{port}"})
            ok = conn.getresponse().status < 500
            conn.close()
            if ok:
                return True
        except OSError:
            continue
    return False


def run_server_checked(ws: Workspace, pristine: Path, argv: list[str]) -> Outcome:
    """Start the line; refused, or started and stopped by SIGTERM; then the workspace checks."""
    port = _free_port()
    argv = [a.replace(FREE, str(port)) for a in argv]
    ports = [int(a) for a in argv if a.isdigit() and 0 < int(a) < 65536]
    before = snapshot(ws.root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "datamill.cli", *argv],
        cwd=ws.cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env=env,
    )
    problems: list[str] = []
    try:
        deadline = time.monotonic() + START_LIMIT_S
        started = False
        while proc.poll() is None and time.monotonic() < deadline:
            if any(_health(p) for p in ports):
                started = True
                break
            time.sleep(0.2)
        if started:
            COUNTS["serve started"] += 1
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_LIMIT_S)
            except subprocess.TimeoutExpired:
                problems.append(f"did not exit within {STOP_LIMIT_S:g} s of SIGTERM")
        elif proc.poll() is None:
            problems.append(f"neither refused nor answering /health within {START_LIMIT_S:g} s")
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate(timeout=30)
    o = Outcome(argv, proc.returncode, out, err, time.perf_counter() - start)
    o.problems += problems
    if o.status == -signal.SIGKILL:
        o.status = None
    check_output_text(o)
    _restore(ws, before, pristine, o)
    COUNTS["serve start lines (subprocess)"] += 1
    return o


def test_fuzz_serve_start(fuzz_ws: tuple[Workspace, Path]) -> None:
    ws, pristine = fuzz_ws

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(argv=serve_lines(ws))
    def run(argv: list[str]) -> None:
        o = run_server_checked(ws, pristine, argv)
        if o.problems:
            COUNTS["failures"] += 1
            pytest.fail(f"{argv_repr(o.argv)}\n  -> " + "\n  -> ".join(o.problems), pytrace=False)

    run()


def test_a_good_serve_line_starts_and_stops(fuzz_ws: tuple[Workspace, Path]) -> None:
    """The generator's good line really starts a server (so the fuzz test is not all refusals)."""
    ws, pristine = fuzz_ws
    o = run_server_checked(
        ws, pristine, ["serve", ws.p("outputs/ds"), "--port", FREE, "--state", ws.p("fresh_dir")]
    )
    assert o.problems == [] and o.status == 0, (o.problems, o.stderr[-2000:])
