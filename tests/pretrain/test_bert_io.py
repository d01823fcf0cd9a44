"""Reading BERT Parquet back: pyarrow, Hugging Face datasets, the compact layout, the batch
reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from datamill.loader import read_batches
from datamill.pretrain.bert import (
    BertParquetSource,
    BertSamples,
    build_bert_samples,
    collate_bert,
)
from datamill.pretrain.bert import _run as _bert_run
from tests.contracts import check_resume

L = 64


@pytest.fixture(scope="module")
def files(
    tmp_path_factory: pytest.TempPathFactory, data_dir: Path
) -> tuple[BertSamples, BertSamples]:
    tmp = tmp_path_factory.mktemp("bertio")
    raw = tmp / "wiki.raw"
    raw.write_text(
        "\n".join((data_dir / "wikitext2_test.raw").read_text("utf-8").splitlines()[:250]) + "\n"
    )
    mp = pytest.MonkeyPatch()
    mp.setattr(_bert_run, "BATCH_SAMPLES", 64)  # several row groups = shards for the loader
    try:
        padded = build_bert_samples(
            raw,
            out=tmp / "padded.parquet",
            vocab_size=800,
            max_seq_length=L,
            dupe_factor=2,
            seed=3,
            sentence_split="period",
        )
        compact = build_bert_samples(
            raw,
            out=tmp / "compact.parquet",
            tokenizer=padded.tokenizer_path,
            max_seq_length=L,
            dupe_factor=2,
            seed=3,
            sentence_split="period",
            layout="compact",
        )
    finally:
        mp.undo()
    return padded, compact


def test_compact_layout_is_smaller_and_collates_to_the_same_arrays(
    files: tuple[BertSamples, BertSamples],
) -> None:
    padded, compact = files
    assert padded.samples == compact.samples > 100
    assert compact.path.stat().st_size < padded.path.stat().st_size
    a = collate_bert(padded.path)(pq.read_table(padded.path))
    b = collate_bert(compact.path)(pq.read_table(compact.path))
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        assert a[k].dtype == b[k].dtype
    assert a["tokens"].shape == (padded.samples, L)
    assert (a["segment_ids"][~a["attention_mask"]] == -1).all()
    assert (
        a["masked_weights"].sum(1)
        == [len(x) for x in pq.read_table(padded.path).column("masked_positions").to_pylist()]
    ).all()


def test_huggingface_datasets_reads_it(
    files: tuple[BertSamples, BertSamples], tmp_path: Path
) -> None:
    datasets = pytest.importorskip("datasets")
    padded, _ = files
    ds = datasets.Dataset.from_parquet(str(padded.path), cache_dir=str(tmp_path / "hf"))
    table = pq.read_table(padded.path)
    assert ds.num_rows == table.num_rows
    assert ds.column_names == table.column_names
    for i in (0, ds.num_rows - 1):
        assert ds[i] == {c: table.column(c)[i].as_py() for c in table.column_names}


def test_reader_yields_every_sample_once_per_epoch_and_splits_ranks(
    files: tuple[BertSamples, BertSamples],
) -> None:
    padded, compact = files
    whole = collate_bert(padded.path)(pq.read_table(padded.path))["tokens"]
    key = sorted(r.tobytes() for r in whole)
    for path in (padded.path, compact.path):
        got = [r.tobytes() for b in read_batches(path, 32, seed=1) for r in b["tokens"]]
        assert sorted(got) == key
        parts = [
            [
                r.tobytes()
                for b in read_batches(path, 16, seed=1, rank=r, world_size=2)
                for r in b["tokens"]
            ]
            for r in range(2)
        ]
        assert sorted(parts[0] + parts[1]) == key and not set(parts[0]) & set(parts[1])
    e0 = [b["tokens"] for b in read_batches(padded.path, 32, seed=1, epoch=0)]
    e1 = [b["tokens"] for b in read_batches(padded.path, 32, seed=1, epoch=1)]
    assert not all(np.array_equal(x, y) for x, y in zip(e0, e1))  # reshuffled per epoch


def test_reader_resumes_exactly(files: tuple[BertSamples, BertSamples]) -> None:
    padded, _ = files

    def make(state: dict[str, object] | None) -> object:
        loader = read_batches(padded.path, 24, seed=7)
        if state is not None:
            loader.load_state_dict(state)
        return loader

    check_resume(make, 3)


def test_source_checks_the_metadata(files: tuple[BertSamples, BertSamples]) -> None:
    padded, _ = files
    src = BertParquetSource(padded.path)
    assert src.meta["layout"] == "padded" and src.num_shards > 2
    assert int(src.shard_sizes().sum()) == padded.samples


@pytest.mark.torch
def test_torch_batches(files: tuple[BertSamples, BertSamples]) -> None:
    torch = pytest.importorskip("torch")
    padded, _ = files
    batch = next(iter(read_batches(padded.path, 8, seed=0, as_torch=True)))
    assert isinstance(batch["tokens"], torch.Tensor) and tuple(batch["tokens"].shape) == (8, L)
    assert batch["masked_weights"].dtype == torch.float32
