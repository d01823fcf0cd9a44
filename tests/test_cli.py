"""The CLI: help, version, one-line errors without tracebacks."""

from __future__ import annotations

import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "datamill.cli", *args], capture_output=True, text=True, check=False)


def test_help_lists_commands() -> None:
    out = run("--help")
    assert out.returncode == 0 and "demo" in out.stdout


def test_version() -> None:
    assert run("--version").stdout.startswith("datamill ")


def test_error_is_one_line_no_traceback(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = run("demo", "--data", str(tmp_path / "nowhere"))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1
    assert "nowhere" in out.stderr


def test_import_is_fast_and_lazy() -> None:
    code = "import time,sys; t=time.perf_counter(); import datamill; print(time.perf_counter()-t); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[1] == "False"
    assert float(out[0]) < 2.0  # generous in tests; the benchmark records the real figure
