"""Run one command line in process (or in a subprocess) and check what the issue asks of every run.

Checks: exit status 0 or 2 (argparse's own usage errors are 2 as well); no ``Traceback`` and no
exception escaping :func:`datamill.cli.main`; with 2, exactly one ``error:`` line on stderr; done
within :data:`TIME_LIMIT_S`; no file that existed in the workspace before was changed or removed,
except a good output replaced by another good output (it must still load; it is then put back);
whatever the command created is removed afterwards so the next command sees the same folder.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.fuzz.workspace import Workspace

__all__ = [
    "COUNTS",
    "TIME_LIMIT_S",
    "WALL_LIMIT_S",
    "Outcome",
    "run_checked",
    "run_subprocess_checked",
]

TIME_LIMIT_S = float(os.environ.get("DATAMILL_FUZZ_TIME_LIMIT", "20"))
"""Most CPU time a single fuzzed command may use (seconds, all its threads)."""
WALL_LIMIT_S = float(os.environ.get("DATAMILL_FUZZ_WALL_LIMIT", "120"))
"""Longest a single fuzzed command may take on the clock (seconds): a hang that sleeps uses no
CPU."""

COUNTS: Counter[str] = Counter()
"""Commands and calls run by the fuzzers, by kind (printed in the session summary)."""


STATUS_1 = (["shards", "check"], ["serve", "keys", "revoke"])
"""Commands whose documented exit status 1 means "found nothing wrong to fix"/"no such key", not a
failure."""


class CommandTimeout(BaseException):
    """Raised in the main thread by SIGALRM when a command runs past the time limit."""


@dataclass
class Outcome:
    argv: list[str]
    status: int | None
    stdout: str
    stderr: str
    seconds: float
    escaped: BaseException | None = None
    problems: list[str] = field(default_factory=list)


Snapshot = dict[str, tuple[int, int, int, int]]


def snapshot(root: Path) -> Snapshot:
    """``relpath -> (mode, size, mtime_ns, inode)`` of everything under ``root`` except ``cwd/``."""
    out: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == "cwd" or rel.startswith("cwd" + os.sep):
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            is_dir = name in dirnames
            out[os.path.relpath(full, root)] = (
                st.st_mode,
                0 if is_dir else st.st_size,
                0 if is_dir else st.st_mtime_ns,
                st.st_ino,
            )
    return out


def _alarm(signum: int, frame: object) -> None:
    raise CommandTimeout


@contextlib.contextmanager
def time_limit(seconds: float, *, wall_seconds: float | None = None) -> Iterator[None]:
    """Raise :class:`CommandTimeout` in the main thread after ``seconds`` of CPU time
    (``ITIMER_PROF``: a runaway computation, whatever the machine's load) or ``wall_seconds`` of
    wall time (a sleeping
    hang)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wall = WALL_LIMIT_S if wall_seconds is None else wall_seconds
    previous = {sig: signal.signal(sig, _alarm) for sig in (signal.SIGALRM, signal.SIGPROF)}
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, wall)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.setitimer(signal.ITIMER_PROF, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


def check_output_text(o: Outcome) -> None:
    if o.escaped is not None:
        o.problems.append(f"exception escaped: {type(o.escaped).__name__}: {o.escaped}"[:2000])
    if "Traceback" in o.stderr or "Traceback" in o.stdout:
        o.problems.append("a traceback was printed:\n" + o.stderr[-3000:])
    documented_1 = o.status == 1 and any(o.argv[: len(c)] == c for c in STATUS_1)
    if o.status not in (0, 2) and o.escaped is None and not documented_1:
        o.problems.append(f"exit status {o.status} (expected 0 or 2); stderr: {o.stderr[-1500:]}")
    if o.status == 2 and len(_error_lines(o.stderr)) != 1:
        o.problems.append(
            f"exit 2 with {len(_error_lines(o.stderr))} error: lines; stderr: {o.stderr[-1500:]}"
        )


def _restore(ws: Workspace, before: Snapshot, pristine: Path, o: Outcome) -> None:
    """Compare with ``before``; check and restore good outputs; remove what the command created."""
    after = snapshot(ws.root)
    changed = {p for p, v in before.items() if after.get(p) != v}
    created = {p for p in after if p not in before}
    slots = {os.path.relpath(k, ws.root): k for k in ws.outputs}
    named = _named_paths(ws, o.argv)
    overwrite = "--overwrite" in o.argv
    for entry in sorted(
        (ws.root / "bad").iterdir()
    ):  # a damaged output named as the output: replaceable
        rel = os.path.relpath(entry, ws.root)
        if rel in named and rel not in slots:
            slots[rel] = os.fspath(entry)
        for (
            n
        ) in named:  # --overwrite of one file of a damaged output (its HDF5 beside its meta.json)
            if overwrite and n.startswith(rel + os.sep) and n not in slots:
                slots[n] = os.fspath(ws.root / n)
    for slot_rel, slot_abs in slots.items():
        touched = [p for p in changed | created if p == slot_rel or p.startswith(slot_rel + os.sep)]
        if not touched:
            continue
        target_inside = any(n.startswith(slot_rel + os.sep) for n in named)
        check = slot_abs in ws.outputs and not (
            overwrite and target_inside
        )  # --overwrite of one file of it
        try:
            if check:
                ws.outputs[slot_abs](Path(slot_abs))
            elif slot_rel not in named and not target_inside:
                o.problems.append(f"{slot_rel} changed though the command did not name it")
        except BaseException as exc:  # noqa: BLE001 - any failure to load is the finding
            o.problems.append(
                f"the good output {slot_rel} no longer loads: {type(exc).__name__}: {exc}"[:1500]
            )
        target = Path(slot_abs)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        src = pristine / slot_rel
        if src.is_dir():
            shutil.copytree(src, target)
        else:
            shutil.copy2(src, target)
        changed -= set(touched)
        created -= set(touched)
    for p in sorted(changed & _serve_state_dirs(ws, o.argv)):  # KNOWN_SERVE_STATE_CHMOD
        mode = before[p][0]
        if os.path.isdir(ws.root / p) and after.get(p, (0,))[0] != mode:
            os.chmod(ws.root / p, mode & 0o7777)
            changed.discard(p)
            COUNTS[KNOWN_SERVE_STATE_CHMOD] += 1
    for p in sorted(changed):
        o.problems.append(f"a file that was there before changed or vanished: {p}")
    for p in sorted(created, key=len):
        full = ws.root / p
        if not (full.exists() or full.is_symlink()):
            continue
        if full.is_dir() and not full.is_symlink():
            shutil.rmtree(full, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                full.unlink()
    for entry in list(ws.cwd.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink()
    if changed:  # put back what we can so one finding does not cascade
        for p in changed:
            src, dst = pristine / p, ws.root / p
            if src.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(OSError):
                    shutil.copy2(src, dst)


def _named_paths(ws: Workspace, argv: list[str]) -> set[str]:
    """Workspace-relative paths the command line names (``--flag=value`` included)."""
    out: set[str] = set()
    root = os.fspath(ws.root) + os.sep
    for arg in argv:
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        if value.startswith(root):
            out.add(os.path.normpath(value[len(root) :]))
    return out


KNOWN_SERVE_STATE_CHMOD = (
    "expected (serve, documented): `serve ... --state DIR` of an empty folder makes it a "
    "journal folder (0700)"
)
"""Not a finding: ``--state`` naming an existing EMPTY folder makes it the journal folder (mode
0700, the journal's database in it), as docs/serving.md says; a folder holding other files is
refused (one StateError line; tests/test_bad_inputs.py). Counted, and the mode restored so the
workspace stays the same for the next command."""


def _serve_state_dirs(ws: Workspace, argv: list[str]) -> set[str]:
    if argv[:1] != ["serve"]:
        return set()
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--state"]
    values += [a.split("=", 1)[1] for a in argv if a.startswith("--state=")]
    return _named_paths(ws, values)


def run_checked(ws: Workspace, pristine: Path, argv: list[str], *, kind: str) -> Outcome:
    """Run ``datamill ARGV`` in this process and check it (see the module docstring)."""
    from datamill.cli import main

    before = snapshot(ws.root)
    out, err = io.StringIO(), io.StringIO()
    status: int | None = None
    escaped: BaseException | None = None
    cwd = os.getcwd()
    os.chdir(ws.cwd)
    start = time.perf_counter()
    try:
        with (
            warnings.catch_warnings(record=True) as caught,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            time_limit(TIME_LIMIT_S),
        ):
            warnings.simplefilter("always")
            try:
                status = main(argv)
            except SystemExit as exc:  # argparse: usage errors (2), --help/--version (0)
                status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        for w in caught:  # what the console script would print; not a failure by itself
            err.write(f"{w.category.__name__}: {w.message}\n")
    except CommandTimeout as exc:
        escaped = exc
    except Exception as exc:  # noqa: BLE001 - anything escaping main() is the finding
        escaped = exc
    finally:
        os.chdir(cwd)
    o = Outcome(argv, status, out.getvalue(), err.getvalue(), time.perf_counter() - start, escaped)
    if isinstance(escaped, CommandTimeout):
        o.problems.append(
            f"did not finish within {TIME_LIMIT_S:g} s of CPU time or {WALL_LIMIT_S:g} s of "
            "wall time"
        )
        o.escaped = None
    check_output_text(o)
    _restore(ws, before, pristine, o)
    COUNTS[kind] += 1
    COUNTS["commands"] += 1
    return o


def run_subprocess_checked(ws: Workspace, pristine: Path, argv: list[str]) -> Outcome:
    """The same checks with ``python -m datamill.cli ARGV`` in a child process (killed at the
    limit)."""
    before = snapshot(ws.root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "datamill.cli", *argv],
            cwd=ws.cwd,
            capture_output=True,
            check=False,
            text=True,
            errors="replace",
            timeout=WALL_LIMIT_S,
            env=env,
        )
        o = Outcome(argv, done.returncode, done.stdout, done.stderr, time.perf_counter() - start)
    except subprocess.TimeoutExpired:
        o = Outcome(argv, None, "", "", time.perf_counter() - start)
        o.problems.append(f"did not finish within {WALL_LIMIT_S:g} s (subprocess)")
    check_output_text(o)
    _restore(ws, before, pristine, o)
    COUNTS["subprocess commands"] += 1
    return o
