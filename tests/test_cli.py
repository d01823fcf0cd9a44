"""The CLI: help, version, one-line errors without tracebacks."""

from __future__ import annotations

import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "datamill.cli", *args], capture_output=True, text=True, check=False
    )


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
    code = (
        "import time,sys; t=time.perf_counter(); import datamill; print(time.perf_counter()-t); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[1] == "False"
    assert float(out[0]) < 2.0  # generous in tests; the benchmark records the real figure


def _commands() -> list[str]:
    import argparse

    from datamill.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def test_quiet_before_or_after_every_command(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Regression: `datamill word2vec ... --quiet` was a usage error while `preprocess ... --quiet`
    worked."""
    import pytest

    from datamill import cli
    from datamill.core import progress

    commands = _commands()
    assert {"bert", "word2vec", "corpus", "preprocess"} <= set(commands)
    for command in commands:
        for argv in (
            [command, "--quiet", "--help"],
            ["-q", command, "--help"],
            [command, "--help", "-q"],
        ):
            with pytest.raises(SystemExit) as exc:  # --help exits 0 after parsing the whole line
                cli.main(argv)
            assert exc.value.code == 0, (argv, exc.value.code)
    seen: list[bool] = []
    monkeypatch.setattr(progress, "set_quiet", seen.append)
    for argv, want in (
        [["demo", "--data", "/nowhere", "--quiet"], True],
        [["-q", "demo", "--data", "/nowhere"], True],
        [["demo", "--data", "/nowhere"], False],
    ):
        assert cli.main(argv) == 2  # the data folder is missing: a one-line error, after set_quiet
        assert seen.pop() is want


def test_split_quiet_stops_at_the_separator() -> None:
    from datamill.cli import split_quiet

    assert split_quiet(["-q", "bert", "x", "--quiet"]) == (["bert", "x"], True)
    assert split_quiet(["bert", "--", "--quiet"]) == (["bert", "--", "--quiet"], False)


def test_console_script_keeps_python_shutdown_and_skips_native_teardown(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # `run` ends with os._exit after Python's own shutdown (pyarrow can abort in C++ static
    # destructors at exit, apache/arrow#34314): the error line, the status, a non-daemon thread's
    # work and atexit handlers must all survive that.
    code = (
        "import atexit, sys, threading, time\n"
        "from datamill import cli\n"
        "atexit.register(lambda: print('atexit ran', flush=True))\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread done', "
        "flush=True))).start()\n"
        f"sys.argv = ['datamill', 'shards', 'info', {str(tmp_path / 'nope')!r}]\n"
        "cli.run()\n"
        "print('not reached')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1 and "nope" in out.stderr
    assert out.stdout.splitlines() == ["thread done", "atexit ran"]
