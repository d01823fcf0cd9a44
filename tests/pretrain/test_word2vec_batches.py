"""word2vec batches: the seed's batchify, loader order/resume, ranks, torch."""

from __future__ import annotations

import json
import tempfile

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.loader import Batching, read_batches
from datamill.pretrain.word2vec import SkipGramSamples, build_skipgram
from datamill.pretrain.word2vec._batch import Batchify, batchify_arrays
from tests.contracts import check_resume

_RNG = np.random.default_rng(7)
_SENTENCES = [
    [f"w{x}" for x in _RNG.integers(0, 30, size=int(n))] for n in _RNG.integers(1, 15, size=60)
]
SAMPLES = build_skipgram(
    _SENTENCES, window=3, num_negatives=2, min_freq=1, subsample_t=1.0, seed=3, progress=False
)


def test_seed_batchify_example() -> None:
    """d2l's example: (1, [2,2], [3,3,3,3]) and (1, [2,2,2], [3,3])."""
    table = pa.table(
        {
            "center": pa.array([1, 1], pa.int32()),
            "contexts": pa.array([[2, 2], [2, 2, 2]], pa.large_list(pa.int32())),
            "negatives": pa.array([[3, 3, 3, 3], [3, 3]], pa.large_list(pa.int32())),
        }
    )
    b = Batchify()(table)
    assert b["centers"].tolist() == [[1], [1]]
    assert b["contexts_negatives"].tolist() == [[2, 2, 3, 3, 3, 3], [2, 2, 2, 3, 3, 0]]
    assert b["masks"].tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]]
    assert b["labels"].tolist() == [[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]]


def _seed_batchify(data):  # type: ignore[no-untyped-def]
    """The seed's batchify, verbatim (lists instead of tensors)."""
    max_len = max(len(c) + len(n) for _, c, n in data)
    centers, contexts_negatives, masks, labels = [], [], [], []
    for center, context, negative in data:
        cur_len = len(context) + len(negative)
        centers += [center]
        contexts_negatives += [context + negative + [0] * (max_len - cur_len)]
        masks += [[1] * cur_len + [0] * (max_len - cur_len)]
        labels += [[1] * len(context) + [0] * (max_len - len(context))]
    return [[c] for c in centers], contexts_negatives, masks, labels


@given(
    st.lists(
        st.tuples(
            st.integers(1, 50),
            st.lists(st.integers(1, 50), min_size=1, max_size=6),
            st.lists(st.integers(1, 50), max_size=12),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_batchify_equals_seed_batchify(data: list[tuple[int, list[int], list[int]]]) -> None:
    centers = np.array([d[0] for d in data])
    ctx = np.array([x for d in data for x in d[1]], dtype=np.int64)
    neg = np.array([x for d in data for x in d[2]], dtype=np.int64)
    got = batchify_arrays(
        centers, np.array([len(d[1]) for d in data]), ctx, np.array([len(d[2]) for d in data]), neg
    )
    want = _seed_batchify(data)
    for key, w in zip(["centers", "contexts_negatives", "masks", "labels"], want):
        assert got[key].tolist() == w, key


def _rows(batches) -> list[tuple[int, tuple[int, ...]]]:  # type: ignore[no-untyped-def]
    out = []
    for b in batches:
        for c, cn, m in zip(b["centers"][:, 0], b["contexts_negatives"], b["masks"]):
            out.append((int(c), tuple(cn[m.astype(bool)].tolist())))
    return out


def test_batches_cover_every_example_once_and_match_the_csr() -> None:
    want = sorted(
        (c, tuple(x + n)) for c, x, n in (SAMPLES.example(i) for i in range(len(SAMPLES)))
    )
    got = _rows(read_batches(SAMPLES.source(), 16, seed=0))
    assert sorted(got) == want
    assert got != _rows(read_batches(SAMPLES.source(), 16, seed=1))  # shuffled by seed
    assert got == _rows(read_batches(SAMPLES.source(), 16, seed=0))  # deterministic
    full = _rows(
        read_batches(
            SAMPLES.source(), 16, seed=0, batching=Batching(window=SAMPLES.source().num_shards)
        )
    )
    assert sorted(full) == want
    unshuffled = _rows(read_batches(SAMPLES.source(), 16, seed=0, batching=Batching(shuffle=False)))
    assert unshuffled == [
        (c, tuple(x + n)) for c, x, n in (SAMPLES.example(i) for i in range(len(SAMPLES)))
    ]


def test_ranks_partition_the_examples() -> None:
    parts = [
        _rows(read_batches(SAMPLES.source(), 8, seed=5, rank=r, world_size=3)) for r in range(3)
    ]
    assert sorted(r for part in parts for r in part) == sorted(
        _rows(read_batches(SAMPLES.source(), 8, seed=5))
    )


@given(
    batch_size=st.integers(1, 40),
    seed=st.integers(0, 2**32),
    midpoint=st.integers(0, 5),
    epoch=st.integers(0, 3),
)
def test_resume_continues_exactly(batch_size: int, seed: int, midpoint: int, epoch: int) -> None:
    n_batches = -(-len(SAMPLES) // batch_size)

    def make(state):  # type: ignore[no-untyped-def]
        loader = read_batches(SAMPLES.source(), batch_size, seed=seed, epoch=epoch)
        if state is not None:
            loader.load_state_dict(state)
        return loader

    check_resume(make, min(midpoint, n_batches))


def test_saved_folder_memory_maps_and_gives_the_same_batches() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        SAMPLES.save(tmp)
        meta = json.loads((__import__("pathlib").Path(tmp) / "skipgram.json").read_text())
        assert meta["format"] == "datamill.word2vec/1"
        loaded = SkipGramSamples.load(tmp)
        assert isinstance(loaded.negatives, np.memmap)
        for name in ("centers", "context_offsets", "contexts", "negative_offsets", "negatives"):
            np.testing.assert_array_equal(getattr(loaded, name), getattr(SAMPLES, name))
        assert loaded.vocab == SAMPLES.vocab
        assert _rows(read_batches(loaded.source(), 16, seed=2)) == _rows(
            read_batches(SAMPLES.source(), 16, seed=2)
        )
        state = read_batches(SAMPLES.source(), 16, seed=2).state_dict()
        read_batches(loaded.source(), 16, seed=2).load_state_dict(
            state
        )  # same fingerprint: compatible


@pytest.mark.torch
def test_torch_tensors_and_dataloader_workers() -> None:
    torch = pytest.importorskip(
        "torch", reason="needs the torch extra: pip install 'datamill[torch]'"
    )
    from datamill.loader.torch import TorchLoaderDataset

    b = next(iter(read_batches(SAMPLES.source(), 8, seed=0, as_torch=True)))
    assert b["centers"].dtype == torch.int64 and tuple(b["centers"].shape) == (8, 1)
    ds = TorchLoaderDataset(read_batches(SAMPLES.source(), 8, seed=0, as_torch=True))
    got = [x for x in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)]
    rows = _rows([{k: v.numpy() for k, v in x.items()} for x in got])
    assert sorted(rows) == sorted(_rows(read_batches(SAMPLES.source(), 8, seed=0)))


def test_zero_negatives_gives_context_only_batches() -> None:
    s = build_skipgram(
        _SENTENCES, window=2, num_negatives=0, min_freq=1, subsample_t=1.0, progress=False
    )
    b = next(iter(read_batches(s.source(), 64, seed=0, batching=Batching(shuffle=False))))
    np.testing.assert_array_equal(b["masks"], b["labels"])
    assert b["contexts_negatives"].shape[1] == np.diff(s.context_offsets)[:64].max()
