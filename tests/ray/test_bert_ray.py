"""BERT samples on Ray equal the local engine's for the same seed and block size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from datamill.pretrain.bert import _run, build_bert_samples
from datamill.shards import ShardsetDataset

pytestmark = pytest.mark.ray


def test_bert_on_ray_equals_local_per_block_streams(ray_cluster: Any, data_dir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    raw = tmp_path / "raw.txt"
    text = (data_dir / "wikitext2_test.raw").read_text(encoding="utf-8")
    raw.write_text(text[: len(text) // 8], encoding="utf-8")
    monkeypatch.setattr(_run, "SHARD_TOKENS", 8_000)  # several document blocks (tasks) per pass
    kw: dict[str, Any] = {"vocab_size": 800, "max_seq_length": 64, "dupe_factor": 2, "seed": 3}
    local = build_bert_samples(raw, out=tmp_path / "local.parquet", workers=1, **kw)
    out = build_bert_samples(raw, out=tmp_path / "bert", engine="ray",
                             engine_options={"address": None}, tokenizer=local.tokenizer_path, **kw)
    # the same tokenizer: `tokenizers`' WordPiece trainer breaks frequency ties differently from run
    # to run (two local trainings on the same text differ too), so the ids are compared under one
    assert (out.documents, out.sentences, out.samples, out.tokens) == \
        (local.documents, local.sentences, local.samples, local.tokens)
    ds = ShardsetDataset(tmp_path / "bert")
    assert ds.num_shards > 4 and len(ds) == local.samples
    got = ds.to_table().drop(["sample"])
    want = pq.read_table(local.path)
    assert got.column_names == want.column_names
    for name in want.column_names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    assert out.timings["nodes"] == 2  # tasks ran on both nodes of the cluster
    assert out.tokenizer_path.read_text() == local.tokenizer_path.read_text()
    # readers: datamill's Loader over the shardset, and Hugging Face datasets over the shard files
    from datamill.loader import Loader

    batches = list(Loader(ds, 64, shuffle=False, columns=["tokens", "is_random_next"]))
    assert sum(len(b["is_random_next"]) for b in batches) == local.samples
    datasets = pytest.importorskip("datasets")
    files = [str(tmp_path / "bert" / "bert" / f"shard.{k:05d}.parquet") for k in range(ds.num_shards)]
    hf = datasets.Dataset.from_parquet(files, cache_dir=str(tmp_path / "hf"))
    assert hf.num_rows == local.samples and hf[0]["tokens"] == want.column("tokens")[0].as_py()
