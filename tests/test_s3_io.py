"""Preprocessing inputs and BERT outputs on S3 (the session's SeaweedFS on loopback)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from datamill.cli import main
from datamill.loader.sources import open_source
from datamill.preprocessing.api import preprocess

pytestmark = pytest.mark.server

CONFIG = {
    "input_features": [
        {"name": "color", "type": "category"},
        {"name": "size", "type": "number", "preprocessing": {"normalization": "minmax"}},
    ],
    "output_features": [{"name": "label", "type": "binary"}],
    "preprocessing": {"split": {"type": "none"}},
}


BUCKET = "inout"


@pytest.fixture(scope="module")
def fs(s3_bucket: tuple[pafs.S3FileSystem, dict[str, str]]) -> pafs.S3FileSystem:
    """Bucket ``inout`` on the server (tests/conftest.py); the AWS_* variables point at it."""
    return s3_bucket[0]


def _table(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "color": rng.choice(["red", "green", "blue"], n),
            "size": rng.integers(0, 100, n) * 1.0,
            "label": rng.integers(0, 2, n).astype(bool),
        }
    )


def _put(fs: pafs.FileSystem, key: str, data: bytes) -> None:
    with fs.open_output_stream(key) as f:
        f.write(data)


def test_preprocess_reads_csv_parquet_jsonl_from_s3_and_the_cache_follows_the_content(
    fs: pafs.S3FileSystem,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DATAMILL_CACHE_DIR", str(tmp_path / "cache"))
    local = tmp_path / "local"
    local.mkdir()
    table = _table(200, 1)
    import pyarrow.csv as pcsv

    pcsv.write_csv(table, local / "data.csv")
    pq.write_table(table, local / "data.parquet")
    (local / "data.jsonl").write_text(
        "\n".join(json.dumps(r) for r in table.to_pylist()) + "\n", encoding="utf-8"
    )
    for name in ("data.csv", "data.parquet", "data.jsonl"):
        _put(fs, f"inout/in/{name}", (local / name).read_bytes())
    want = preprocess(local / "data.csv", CONFIG, skip_save=True).data
    for name in ("data.parquet", "data.jsonl"):
        got = preprocess(f"s3://inout/in/{name}", CONFIG, skip_save=True).data
        assert all(np.array_equal(got[k], want[k]) for k in want), name

    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(CONFIG), encoding="utf-8")
    out = tmp_path / "out"
    assert (
        main(["-q", "preprocess", "s3://inout/in/data.csv", "--config", str(cfg), "-o", str(out)])
        == 0
    )
    assert "fitted" in capsys.readouterr().out and (out / "data.hdf5").is_file()
    assert (
        main(["-q", "preprocess", "s3://inout/in/data.csv", "--config", str(cfg), "-o", str(out)])
        == 0
    )
    assert "reused cache" in capsys.readouterr().out
    first = preprocess("s3://inout/in/data.csv", CONFIG, output_dir=out).data

    # the same size (and likely the same mtime second), other content: the ETag tells, nothing stale
    # is used
    data = (local / "data.csv").read_bytes()
    changed = data.replace(b"red", b"rot")
    assert len(changed) == len(data) and changed != data
    _put(fs, "inout/in/data.csv", changed)
    again = preprocess("s3://inout/in/data.csv", CONFIG, output_dir=out)
    assert not again.cached and first["color"].shape == again.data["color"].shape
    assert "rot" in again.metadata.decode("color", again.data["color"]).tolist()

    for argv, where in (
        (["preprocess", "s3://inout/in/missing.csv"], "s3://inout/in/missing.csv"),
        (["preprocess", "s3://no-such-bucket/a.csv"], "s3://no-such-bucket/a.csv"),
    ):
        assert main(["-q", *argv, "--config", str(cfg), "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and where in err


RAW = "".join(
    f" = Doc {d} = \n"
    + "".join(
        f" the {w} number {d} sat on mat {i} . \n"
        for i, w in enumerate(["cat", "dog", "bird", "fish", "cow"])
    )
    for d in range(6)
)


def test_bert_out_on_s3_replaces_only_its_own_output(
    fs: pafs.S3FileSystem, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(RAW, encoding="utf-8")
    args = ["--vocab-size", "80", "--max-seq-length", "24", "--dupe-factor", "2", "--workers", "1"]
    assert main(["-q", "bert", str(raw), "--out", str(tmp_path / "b.parquet"), *args]) == 0
    for _ in range(2):  # the second run replaces datamill's own earlier file
        assert main(["-q", "bert", str(raw), "--out", "s3://inout/bert/b.parquet", *args]) == 0
        assert "wrote s3://inout/bert/b.parquet" in capsys.readouterr().out
    with fs.open_input_file("inout/bert/b.parquet") as f:
        remote = pq.read_table(f)
    assert remote.equals(pq.read_table(tmp_path / "b.parquet"))
    assert (
        fs.get_file_info("inout/bert/b.tokenizer.json").size
        == (tmp_path / "b.tokenizer.json").stat().st_size
    )
    src = open_source("s3://inout/bert/b.parquet", cache_dir=tmp_path / "c")
    assert int(src.shard_sizes().sum()) == remote.num_rows

    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "mine.parquet")
    _put(fs, "inout/bert/mine.parquet", (tmp_path / "mine.parquet").read_bytes())
    for extra in ([], ["--overwrite"]):
        assert (
            main(["-q", "bert", str(raw), "--out", "s3://inout/bert/mine.parquet", *args, *extra])
            == 2
        )
        assert "s3://inout/bert/mine.parquet" in capsys.readouterr().err
    assert (
        fs.open_input_stream("inout/bert/mine.parquet").read()
        == (tmp_path / "mine.parquet").read_bytes()
    )
    assert fs.get_file_info("inout/bert/mine.tokenizer.json").type == pafs.FileType.NotFound
