"""BERT samples on Ray equal the local engine's for the same seed and block size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.errors import DataFileError
from datamill.loader import Batching
from datamill.pretrain.bert import _run, build_bert_samples
from datamill.ray import _bert_docs
from datamill.shards import ShardsetDataset

pytestmark = pytest.mark.ray


def test_bert_on_ray_equals_local_per_block_streams(
    ray_cluster: Any, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = tmp_path / "raw.txt"
    text = (data_dir / "wikitext2_test.raw").read_text(encoding="utf-8")
    raw.write_text(text[: len(text) // 8], encoding="utf-8")
    monkeypatch.setattr(_run, "SHARD_TOKENS", 8_000)  # several document blocks (tasks) per pass
    monkeypatch.setattr(
        _bert_docs, "TEXT_BLOCK_BYTES", 40_000
    )  # several map_batches blocks of text
    kw: dict[str, Any] = {"vocab_size": 800, "max_seq_length": 64, "dupe_factor": 2, "seed": 3}
    local = build_bert_samples(raw, out=tmp_path / "local.parquet", workers=1, **kw)
    out = build_bert_samples(
        raw,
        out=tmp_path / "bert",
        engine="ray",
        engine_options={"address": None},
        tokenizer=local.tokenizer_path,
        **kw,
    )
    # the samples are compared under one tokenizer (training is deterministic, and checked in
    # tests/pretrain; here the Ray path's sampling is under test)
    assert (out.documents, out.sentences, out.samples, out.tokens) == (
        local.documents,
        local.sentences,
        local.samples,
        local.tokens,
    )
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

    batches = list(
        Loader(ds, 64, columns=["tokens", "is_random_next"], batching=Batching(shuffle=False))
    )
    assert sum(len(b["is_random_next"]) for b in batches) == local.samples
    datasets = pytest.importorskip("datasets")
    files = [
        str(tmp_path / "bert" / "bert" / f"shard.{k:05d}.parquet") for k in range(ds.num_shards)
    ]
    hf = datasets.Dataset.from_parquet(files, cache_dir=str(tmp_path / "hf"))
    assert hf.num_rows == local.samples and hf[0]["tokens"] == want.column("tokens")[0].as_py()


def _text(rng: np.random.Generator, docs: int) -> str:
    """Documents of 1-5 lines (some lines with `` . `` sentences), ended by blank or ``= title =``
    lines."""
    words = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "the",
        "cat",
        "sat",
        "on",
        "mat",
        "dog",
        "ran",
        "far",
        "away",
    ]
    out = []
    for d in range(docs):
        for _ in range(int(rng.integers(1, 6))):
            n = int(rng.integers(2, 14))
            line = " ".join(rng.choice(words, n))
            if rng.random() < 0.3:
                line += " . " + " ".join(rng.choice(words, 3)) + " ."
            out.append(" " + line + " ")
        out.append(f" = T{d} = " if d % 3 == 0 else "")
    return "\n".join(out) + "\n"


def test_documents_split_across_text_blocks_and_files_equal_local(
    ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tiny text blocks: documents continue from one map_batches block into the next; two files (a
    file end ends a document); the period split; the tokenizer trained on the driver."""
    rng = np.random.default_rng(5)
    files = [tmp_path / "a.txt", tmp_path / "b.txt"]
    for f, n in zip(files, (60, 45)):
        f.write_text(_text(rng, n), encoding="utf-8")
    monkeypatch.setattr(_run, "SHARD_TOKENS", 700)
    monkeypatch.setattr(_bert_docs, "TEXT_BLOCK_BYTES", 256)  # shorter than many documents
    kw: dict[str, Any] = {
        "vocab_size": 120,
        "max_seq_length": 24,
        "dupe_factor": 2,
        "seed": 9,
        "sentence_split": "period",
        "pairing": "google",
    }
    local = build_bert_samples(files, out=tmp_path / "local.parquet", workers=1, **kw)
    trained = build_bert_samples(files, out=tmp_path / "trained", engine="ray", **kw)
    assert (trained.documents, trained.sentences) == (local.documents, local.sentences)
    out = build_bert_samples(
        files, out=tmp_path / "trained", engine="ray", tokenizer=local.tokenizer_path, **kw
    )
    assert (out.documents, out.sentences, out.samples, out.tokens) == (
        local.documents,
        local.sentences,
        local.samples,
        local.tokens,
    )
    got = (
        ShardsetDataset(tmp_path / "trained").to_table().drop(["sample"])
    )  # replaced the first dataset
    want = pq.read_table(local.path)
    for name in want.column_names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    # a bad byte in a later block is named by its line in the whole file, as the local engine names
    # it
    lines = files[1].read_bytes().split(b"\n")
    lines[40] = b"caf\xe9 " + lines[40]
    files[1].write_bytes(b"\n".join(lines))
    with pytest.raises(DataFileError) as info:
        build_bert_samples(
            files, out=tmp_path / "bad", engine="ray", tokenizer=local.tokenizer_path, **kw
        )
    with pytest.raises(DataFileError) as want_err:
        build_bert_samples(
            files, out=tmp_path / "bad.parquet", workers=1, tokenizer=local.tokenizer_path, **kw
        )
    assert (
        (info.value.path, info.value.line)
        == (want_err.value.path, want_err.value.line)
        == (str(files[1]), 41)
    )
    assert not (tmp_path / "bad").exists()


@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=30), seed=st.integers(0, 2**32 - 1))
def test_blocked_ids_gather_as_the_concatenated_corpus(sizes: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, 1000, n).astype(np.int32) for n in sizes]
    whole = np.concatenate(parts)
    index = rng.integers(0, max(len(whole), 1), 200) if len(whole) else np.zeros(0, np.int64)
    np.testing.assert_array_equal(_bert_docs.BlockedIds(parts)[index], whole[index])
