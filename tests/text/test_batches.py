"""LM minibatches: the seed's semantics, invariants, ranks, resumption, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.errors import ConfigError, DataFileError, ResumeStateError
from datamill.text import Corpus, random_batches, sequential_batches
from tests.contracts import check_resume
from tests.text.seed_reference import seq_data_iter_random, seq_data_iter_sequential


def test_range30_random_matches_seed_structure() -> None:
    it = random_batches(list(range(30)), 2, 5, seed=3)
    offset, order, nb = it._plan()
    got = [(x.tolist(), y.tolist()) for x, y in it]
    want = list(seq_data_iter_random(list(range(30)), 2, 5, offset=offset, order=list(order)))
    assert got == want and len(got) == nb >= 2
    starts = [row[0] for x, _ in got for row in x]
    for x, y in got:
        xa, ya = np.array(x), np.array(y)
        assert (ya == xa + 1).all() and (np.diff(xa, axis=1) == 1).all()
    assert len(set(starts)) == len(starts)  # examples never overlap (all are offset + k*num_steps)
    assert all((s - offset) % 5 == 0 for s in starts)


@pytest.mark.parametrize("seed", range(4))
def test_range30_sequential_matches_seed(seed: int) -> None:
    it = sequential_batches(list(range(30)), 2, 6, seed=seed)
    offset, _, _ = it._plan()
    got = [(x.tolist(), y.tolist()) for x, y in it]
    assert got == list(seq_data_iter_sequential(list(range(30)), 2, 6, offset=offset))
    assert (np.array(got[1][0])[:, 0] == np.array(got[0][0])[:, -1] + 1).all()  # strips continue


def test_deterministic_per_seed_and_epoch_and_epochs_differ() -> None:
    ids = np.arange(1000, dtype=np.int32)
    a = [x for x, _ in random_batches(ids, 4, 7, seed=5, epoch=2)]
    b = [x for x, _ in random_batches(ids, 4, 7, seed=5, epoch=2)]
    c = [x for x, _ in random_batches(ids, 4, 7, seed=5, epoch=3)]
    assert all((p == q).all() for p, q in zip(a, b)) and len(a) == len(b)
    assert not all(p.shape == q.shape and (p == q).all() for p, q in zip(a, c))


@given(
    n=st.integers(20, 600),
    bs=st.integers(1, 5),
    ns=st.integers(1, 9),
    seed=st.integers(0, 2**32),
    ws=st.integers(1, 3),
)
def test_random_examples_disjoint_and_cover(n: int, bs: int, ns: int, seed: int, ws: int) -> None:
    ids = np.arange(n, dtype=np.int32) + 7
    if n < bs * ws * ns + 1:
        with pytest.raises(DataFileError):
            random_batches(ids, bs, ns, seed=seed, world_size=ws)
        return
    starts = []
    for r in range(ws):
        it = random_batches(ids, bs, ns, seed=seed, rank=r, world_size=ws)
        offset, _, nb = it._plan()
        batches = list(it)
        assert len(batches) == nb
        for x, y in batches:
            assert x.dtype == np.int32 and x.shape == (bs, ns)
            assert (y == x + 1).all() and (np.diff(x, axis=1) == 1).all()
            starts += (x[:, 0] - 7).tolist()
    assert len(starts) == len(set(starts))  # no example twice in an epoch, across ranks
    assert all((s - offset) % ns == 0 for s in starts)
    total = (n - offset - 1) // ns
    per_rank = total // ws
    if (
        ws == 1 and per_rank % bs == 0
    ):  # nothing dropped: every whole example after the offset is covered
        assert sorted(starts) == [offset + k * ns for k in range(total)]
    assert len(starts) == ws * (per_rank // bs) * bs


@given(
    n=st.integers(20, 600),
    bs=st.integers(1, 5),
    ns=st.integers(1, 9),
    seed=st.integers(0, 2**32),
    ws=st.integers(1, 3),
)
def test_sequential_strips_concatenate_to_corpus_slice(
    n: int, bs: int, ns: int, seed: int, ws: int
) -> None:
    ids = np.arange(n, dtype=np.int64)
    if n < bs * ws * ns + 1:
        return
    rows_all = []
    for r in range(ws):
        it = sequential_batches(ids, bs, ns, seed=seed, rank=r, world_size=ws)
        offset, _, nb = it._plan()
        xs = [x for x, _ in it]
        assert len(xs) == nb
        if nb == 0:
            return
        rows_all.append(np.concatenate(xs, axis=1))  # (bs, nb*ns): each row a contiguous strip
    strips = np.concatenate(rows_all, axis=0)
    width = (n - offset - 1) // (bs * ws)
    expect = ids[offset : offset + width * bs * ws].reshape(bs * ws, width)[:, : strips.shape[1]]
    np.testing.assert_array_equal(strips, expect)


@given(
    kind=st.sampled_from(["random", "sequential"]),
    n=st.integers(40, 400),
    mid=st.integers(0, 30),
    seed=st.integers(0, 1000),
)
def test_resume_from_any_position(kind: str, n: int, mid: int, seed: int) -> None:
    ids = np.arange(n, dtype=np.uint16)
    make_it = random_batches if kind == "random" else sequential_batches

    def make(state: dict | None):  # type: ignore[no-untyped-def, type-arg]
        it = make_it(ids, 2, 3, seed=seed, epoch=1)
        if state is not None:
            it.load_state_dict(state)
        return it

    check_resume(make, min(mid, len(make(None))))


def test_corpus_object_uint16_and_torch() -> None:
    torch = pytest.importorskip("torch")
    c = Corpus(np.arange(100, dtype=np.uint16))
    for make in (sequential_batches, random_batches):
        x, y = next(iter(make(c, 2, 5, seed=0, as_torch=True)))
        assert isinstance(x, torch.Tensor) and x.dtype == torch.int32 and bool((y == x + 1).all())
        assert x.shape == (2, 5) and int(x[0, 1]) == int(x[0, 0]) + 1


def test_bad_arguments_and_states() -> None:
    with pytest.raises(ConfigError):
        random_batches(list(range(30)), 0, 5, seed=0)
    with pytest.raises(ConfigError):
        sequential_batches(list(range(30)), 2, 0, seed=0)
    with pytest.raises(ConfigError):
        random_batches(list(range(30)), 2, 5, seed=0, rank=2, world_size=2)
    c = Corpus(np.arange(8), meta={"source": "tiny.txt"})
    with pytest.raises(DataFileError) as ei:
        random_batches(c, 2, 5, seed=0)
    assert ei.value.path == "tiny.txt"  # type: ignore[attr-defined]
    it = random_batches(list(range(100)), 2, 5, seed=0)
    state = json.loads(json.dumps(it.state_dict()))
    other = random_batches(list(range(100)), 2, 6, seed=1)
    with pytest.raises(ResumeStateError, match="seed: saved 0, now 1.*num_steps: saved 5, now 6"):
        other.load_state_dict(state)
    with pytest.raises(ResumeStateError):
        it.load_state_dict({"format": "datamill.loader/1"})
    a = random_batches(Corpus(np.arange(100)), 2, 5, seed=0)
    b = random_batches(Corpus(np.arange(100)[::-1].copy()), 2, 5, seed=0)
    with pytest.raises(ResumeStateError, match="corpus_fingerprint"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(ResumeStateError):
        it.load_state_dict({**state, "batches_seen": 10_000})
