"""The fuzz workspace (built once per session) and the count summary printed at the end of the run.

Profiles: the default (CI) runs a bounded, derandomized number of examples per command; set
``DATAMILL_FUZZ=long`` for a longer, randomized local run (``DATAMILL_FUZZ_EXAMPLES=N`` sets the
count per command directly).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fuzz.runner import COUNTS
from tests.fuzz.workspace import Workspace, build_workspace, release_unwritable


@pytest.fixture(scope="session")
def fuzz_ws(
    tmp_path_factory: pytest.TempPathFactory, data_dir: Path
) -> Iterator[tuple[Workspace, Path]]:
    """``(workspace, pristine copy of it)``, built once per session."""
    root = tmp_path_factory.mktemp("fuzz") / "w"
    ws = build_workspace(root, data_dir)
    for name, load in list(ws.outputs.items()):  # every good output loads before anything runs
        load(Path(name))
    pristine = root.parent / "pristine"
    shutil.copytree(root, pristine, ignore=shutil.ignore_patterns("ro", "cwd"), symlinks=True)
    (root.parent / "tmp").mkdir()
    try:
        yield ws, pristine
    finally:
        release_unwritable(root / "ro")


@pytest.fixture(autouse=True)
def _fuzz_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """While a fuzz test runs: DATAMILL_DATA is the workspace's fake data folder (``demo`` must not
    run the real tour) and TMPDIR is inside the workspace; both are restored after each test."""
    if "fuzz_ws" not in request.fixturenames:
        yield
        return
    import tempfile

    ws, _ = request.getfixturevalue("fuzz_ws")
    tmp = os.fspath(ws.root.parent / "tmp")
    monkeypatch.setenv("DATAMILL_DATA", ws.p("fakedata"))
    monkeypatch.setenv("TMPDIR", tmp)
    monkeypatch.setattr(tempfile, "tempdir", tmp)
    yield


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print how many commands and API calls the fuzzers ran (the acceptance counts)."""
    if not COUNTS:
        return
    tr = terminalreporter
    tr.section("datamill fuzz counts")
    cmds = {k[4:]: v for k, v in COUNTS.items() if k.startswith("cli ")}
    tr.write_line(
        f"generated commands (in process): {COUNTS['commands']:,} across {len(cmds)} commands"
    )
    for k, v in sorted(cmds.items()):
        tr.write_line(f"  {k}: {v:,}")
    tr.write_line(f"subprocess commands: {COUNTS['subprocess commands']:,}")
    tr.write_line(
        f"serve start lines (subprocess): {COUNTS['serve start lines (subprocess)']:,}, "
        f"{COUNTS['serve started']:,} started and stopped, the others refused"
    )
    api = {k[4:]: v for k, v in COUNTS.items() if k.startswith("api ")}
    tr.write_line(f"API calls: {COUNTS['api calls']:,} over {len(api)} callables")
    tr.write_line(f"failures found: {COUNTS['failures']:,}")
    for key, value in sorted(COUNTS.items()):
        if key.startswith("known"):
            tr.write_line(f"{key}: {value:,} times (tolerated)")
        elif key.startswith("expected"):
            tr.write_line(f"{key}: {value:,} times")
