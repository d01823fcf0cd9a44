"""Generated command lines for every ``datamill`` subcommand, run in process: exit 0 or 2, one error
line, no traceback, no hang, nothing changed outside the command's own output (see
tests/fuzz/runner.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz.commands import EXCLUDED, argv_repr, command_lines, leaf_commands, seeds
from tests.fuzz.runner import COUNTS, run_checked, run_subprocess_checked
from tests.fuzz.workspace import Workspace

pytestmark = pytest.mark.fuzz

LONG = os.environ.get("DATAMILL_FUZZ") == "long"
EXAMPLES = int(os.environ.get("DATAMILL_FUZZ_EXAMPLES", "1200" if LONG else "120"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not LONG,
    database=None,
    print_blob=True,
    suppress_health_check=list(HealthCheck),
)

LEAVES = [path for path, _ in leaf_commands() if path not in EXCLUDED]
SLOW = {("serve", "iterate"): 2}
"""Leaves run with fewer examples (divided by this): each of their runs waits ~0.6 s for a refused
connection."""


def test_every_leaf_command_is_fuzzed_and_seeded(fuzz_ws: tuple[Workspace, Path]) -> None:
    """A new subcommand is picked up from the parser; it needs a seed to get past its first
    check."""
    ws, _ = fuzz_ws
    names = {path for path, _ in leaf_commands()}
    assert {("preprocess",), ("shards", "create"), ("plan",)} <= names
    assert set(LEAVES) <= set(seeds(ws)), (
        f"add a seed command line for {sorted(set(LEAVES) - set(seeds(ws)))}"
    )


def _fail(o: object) -> None:
    COUNTS["failures"] += 1
    pytest.fail(f"{argv_repr(o.argv)}\n  -> " + "\n  -> ".join(o.problems), pytrace=False)  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_fuzz_command(path: tuple[str, ...], fuzz_ws: tuple[Workspace, Path]) -> None:
    ws, pristine = fuzz_ws
    parser = dict(leaf_commands())[path]
    seed_lines = seeds(ws).get(path, [])

    @settings(FUZZ, max_examples=max(1, EXAMPLES // SLOW.get(path, 1)))
    @given(argv=command_lines(path, parser, ws, seed_lines))
    def run(argv: list[str]) -> None:
        o = run_checked(ws, pristine, argv, kind="cli " + " ".join(path))
        if o.problems:
            _fail(o)

    run()


SUBPROCESS_SAMPLE = 1 if not LONG else 10


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_fuzz_command_subprocess_sample(
    path: tuple[str, ...], fuzz_ws: tuple[Workspace, Path]
) -> None:
    """A few generated commands per subcommand through a real process (signals, exit, stdout
    flushing)."""
    ws, pristine = fuzz_ws
    parser = dict(leaf_commands())[path]

    @settings(FUZZ, max_examples=SUBPROCESS_SAMPLE)
    @given(argv=command_lines(path, parser, ws, seeds(ws).get(path, [])))
    def run(argv: list[str]) -> None:
        if any("\x00" in a for a in argv):  # a process argument cannot hold NUL
            argv = [a.replace("\x00", "") for a in argv]
        o = run_subprocess_checked(ws, pristine, argv)
        if o.problems:
            _fail(o)

    run()
