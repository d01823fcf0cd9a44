"""Running datamill commands in a subprocess with a fault: SIGKILL at a named point, or a file-size
limit."""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from datamill.core.faults import FAULT_ENV, FAULT_SIGNAL_ENV

_MAIN = "import sys; from datamill.cli import main; sys.exit(main())"
_LITTER_MARKS = (".tmp-", ".old-", ".bert-scratch-", ".uncommitted")


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def run(
    args: Sequence[str],
    *,
    cwd: Path,
    fault: str | None = None,
    fsize: int | None = None,
    timeout: float = 120,
    signal_name: str = "KILL",
) -> Result:
    """``datamill ARGS`` in a fresh interpreter; ``fault`` kills it at that point, ``fsize`` limits
    file sizes."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", DATAMILL_THREADS="1")
    env.pop(FAULT_ENV, None)
    if fault is not None:
        env[FAULT_ENV] = fault
        env[FAULT_SIGNAL_ENV] = signal_name

    def limit() -> None:  # in the child, before exec
        if fsize is not None:
            signal.signal(
                signal.SIGXFSZ, signal.SIG_IGN
            )  # writes fail with EFBIG instead of killing
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    proc = subprocess.run(
        [sys.executable, "-c", _MAIN, "-q", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
        check=False,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def snapshot(root: Path, *, skip: Callable[[Path], bool] = lambda p: False) -> dict[str, str]:
    """sha256 of every file under ``root`` (or of ``root`` itself), keyed by relative path; litter
    left out."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    out: dict[str, str] = {}
    for p in files:
        rel = p.name if p == root else os.fspath(p.relative_to(root))
        if is_litter(rel) or skip(p):
            continue
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def is_litter(name: str) -> bool:
    return any(mark in name for mark in _LITTER_MARKS)


def litter(folder: Path) -> list[str]:
    """Every temporary/uncommitted name under ``folder`` (recursively)."""
    return sorted(os.fspath(p.relative_to(folder)) for p in folder.rglob("*") if is_litter(p.name))


def assert_one_line_error(res: Result, *, path: str) -> None:
    """Exit 2, no traceback, one ``error:`` line naming ``path``."""
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr[-2000:]
    assert path in lines[0], (path, lines[0])
