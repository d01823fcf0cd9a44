"""mypy --strict over the whole package (files listed in pyproject's [tool.mypy])."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_mypy_strict_package() -> None:
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=root, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
