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
def fuzz_ws(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[tuple[Workspace, Path]]:
    """``(workspace, pristine copy of it)``; DATAMILL_DATA and TMPDIR point inside it while fuzzing."""
    root = tmp_path_factory.mktemp("fuzz") / "w"
    ws = build_workspace(root, data_dir)
    for name, load in list(ws.outputs.items()):  # every good output loads before anything runs
        load(Path(name))
    pristine = root.parent / "pristine"
    shutil.copytree(root, pristine, ignore=shutil.ignore_patterns("ro", "cwd"), symlinks=True)
    (root / "cwd" / "tmp").mkdir()
    saved = {k: os.environ.get(k) for k in ("DATAMILL_DATA", "TMPDIR")}
    os.environ["DATAMILL_DATA"] = ws.p("fakedata")
    import tempfile

    saved_tempdir = tempfile.tempdir
    tmp = root.parent / "tmp"
    tmp.mkdir()
    os.environ["TMPDIR"] = os.fspath(tmp)
    tempfile.tempdir = os.fspath(tmp)
    try:
        yield ws, pristine
    finally:
        tempfile.tempdir = saved_tempdir
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        release_unwritable(root / "ro")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print how many commands and API calls the fuzzers ran (the acceptance counts)."""
    if not COUNTS:
        return
    tr = terminalreporter
    tr.section("datamill fuzz counts")
    cmds = {k[4:]: v for k, v in COUNTS.items() if k.startswith("cli ")}
    tr.write_line(f"generated commands (in process): {COUNTS['commands']:,} across {len(cmds)} commands")
    for k, v in sorted(cmds.items()):
        tr.write_line(f"  {k}: {v:,}")
    tr.write_line(f"subprocess commands: {COUNTS['subprocess commands']:,}")
    api = {k[4:]: v for k, v in COUNTS.items() if k.startswith("api ")}
    tr.write_line(f"API calls: {COUNTS['api calls']:,} over {len(api)} callables")
    tr.write_line(f"failures found: {COUNTS['failures']:,}")
    for key, value in sorted(COUNTS.items()):
        if key.startswith("known"):
            tr.write_line(f"{key}: {value:,} times (tolerated)")
