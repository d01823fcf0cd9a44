"""``datamill tokenize --engine ray`` writes the same bytes as the local engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from datamill.text import tokenize
from tests.text.test_tokenize_files import _files, bytes_of, tok_file

pytestmark = pytest.mark.ray
__all__ = ["tok_file"]  # the fixture, imported for this module's tests


def test_ray_engine_gives_the_local_bytes(ray_cluster: Any, tmp_path: Path, tok_file: Path) -> None:
    files = [p for k, (p, _) in _files(tmp_path).items() if k in ("jsonl", "gzip", "text")]
    local = tokenize(files, out=tmp_path / "local" / "tok", tokenizer=tok_file, task_bytes=700)
    ray = tokenize(
        files, out=tmp_path / "ray" / "tok", tokenizer=tok_file, task_bytes=700, engine="ray"
    )
    assert ray.tasks == local.tasks > 4 and ray.documents == local.documents
    assert bytes_of(ray.path) == bytes_of(local.path)
