"""``datamill tokenize`` reading every input kind from S3 (the session's SeaweedFS on loopback):
the same documents and tokens as from the local files, byte ranges read remotely."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest

from datamill.core.errors import DataFileNotFoundError
from datamill.text import tokenize
from tests.text.test_tokenize_files import _files, _tokens, tok_file

pytestmark = pytest.mark.server
__all__ = ["tok_file"]  # the fixture, imported for this module's tests


BUCKET = "tokin"


@pytest.fixture(scope="module")
def s3(s3_bucket: tuple[pafs.S3FileSystem, dict[str, str]]) -> pafs.S3FileSystem:
    """Bucket ``tokin`` on the server (tests/conftest.py); the AWS_* variables point at it."""
    return s3_bucket[0]


def test_every_input_kind_from_s3_equals_the_local_run(
    s3: pafs.S3FileSystem, tmp_path: Path, tok_file: Path
) -> None:
    local = tmp_path / "in"
    local.mkdir()
    files = {k: v for k, v in _files(local).items() if k not in ("parquet", "file")}
    for path, _ in files.values():
        with s3.open_output_stream(f"tokin/docs/{path.name}", compression=None) as f:
            f.write(path.read_bytes())
    names = sorted(p.name for p, _ in files.values())
    a = tokenize(
        [str(local / n) for n in names], out=tmp_path / "a", tokenizer=tok_file, task_bytes=500
    )
    b = tokenize("s3://tokin/docs/*", out=tmp_path / "b", tokenizer=tok_file, task_bytes=500)
    assert [f["path"] for f in b.files] == [f"s3://tokin/docs/{n}" for n in names]
    assert a.documents == b.documents and a.tokens == b.tokens and a.tasks == b.tasks > 10
    assert _tokens(a.path).equals(_tokens(b.path))
    (path, opts) = _files(local)["parquet"]
    with s3.open_output_stream("tokin/pq/docs.parquet", compression=None) as f:
        f.write(path.read_bytes())
    c = tokenize("s3://tokin/pq/docs.parquet", out=tmp_path / "c", tokenizer=tok_file, **opts)
    d = tokenize(path, out=tmp_path / "d", tokenizer=tok_file, **opts)
    assert _tokens(c.path).equals(_tokens(d.path))
    with pytest.raises(DataFileNotFoundError, match="no file matches"):
        tokenize("s3://tokin/none/*.jsonl", out=tmp_path / "e", tokenizer=tok_file)
