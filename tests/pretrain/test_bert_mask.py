"""Assembly, masking and padding (vectorised) against per-sample expectations written out in
Python."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.rng import rng_for
from datamill.pretrain.bert._mask import MaskConfig, assemble
from datamill.pretrain.bert._pairs import Spans

PAD, CLS, SEP, MASK, UNK = 0, 1, 2, 3, 4
SPECIALS = (PAD, CLS, SEP, MASK, UNK)
VOCAB = 50


def make_cfg(L: int, p: float = 0.15, maxp: int = 20, layout: str = "padded") -> MaskConfig:
    return MaskConfig(
        max_seq_length=L,
        mask_prob=p,
        max_predictions=maxp,
        pad=PAD,
        cls=CLS,
        sep=SEP,
        mask=MASK,
        special_ids=SPECIALS,
        vocab_size=VOCAB,
        layout=layout,
    )


def random_case(seed: int, n: int, L: int, unk_rate: float) -> tuple[np.ndarray, Spans]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, VOCAB, size=5000).astype(np.int32)
    ids[rng.random(5000) < unk_rate] = UNK  # [UNK] inside the text: special, never a candidate
    total = rng.integers(2, L - 2, size=n)  # la + lb <= L - 3
    la = np.maximum(1, (rng.random(n) * total).astype(np.int64))
    la = np.minimum(la, total - 1)
    lb = total - la
    a_lo = rng.integers(0, 5000 - L, size=n)
    b_lo = rng.integers(0, 5000 - L, size=n)
    z = np.zeros(n, dtype=bool)
    return ids, Spans(a_lo, la, b_lo, lb, rng.random(n) < 0.5, np.zeros(n, np.int64), z)


def rows(batch: pa.RecordBatch, name: str) -> list[list[int]]:
    return batch.column(name).to_pylist()


@given(
    seed=st.integers(0, 2**32),
    n=st.integers(1, 40),
    L=st.integers(5, 90),
    p=st.sampled_from([0.05, 0.15, 0.5]),
    maxp=st.integers(1, 30),
    unk=st.sampled_from([0.0, 0.3]),
)
def test_every_sample_is_built_masked_and_padded_as_specified(
    seed: int, n: int, L: int, p: float, maxp: int, unk: float
) -> None:
    ids, spans = random_case(seed, n, L, unk)
    batch = assemble(ids, spans, make_cfg(L, p, maxp), rng_for(seed, "mask"))
    toks, segs = rows(batch, "tokens"), rows(batch, "segment_ids")
    poss, labs = rows(batch, "masked_positions"), rows(batch, "masked_labels")
    assert batch.column("is_random_next").to_pylist() == spans.is_random_next.tolist()
    for i in range(n):
        a = ids[spans.a_lo[i] : spans.a_lo[i] + spans.la[i]].tolist()
        b = ids[spans.b_lo[i] : spans.b_lo[i] + spans.lb[i]].tolist()
        original = [CLS, *a, SEP, *b, SEP]
        k = len(original)
        assert len(toks[i]) == L and len(segs[i]) == L
        assert segs[i] == [0] * (len(a) + 2) + [1] * (len(b) + 1) + [-1] * (L - k)
        assert toks[i][k:] == [PAD] * (L - k)
        candidates = sum(1 for t in a + b if t not in SPECIALS)
        want = min(maxp, max(1, round((len(a) + len(b)) * p)), candidates)
        assert len(poss[i]) == len(labs[i]) == want
        assert poss[i] == sorted(set(poss[i]))  # sorted, distinct
        restored = list(toks[i][:k])
        for pos, lab in zip(poss[i], labs[i], strict=True):
            assert original[pos] == lab  # labels are the unmasked tokens
            assert lab not in SPECIALS  # never [CLS], [SEP], [PAD] or a special inside the text
            assert restored[pos] == MASK or restored[pos] not in SPECIALS
            restored[pos] = lab
        assert restored == original  # only the masked positions changed


def test_masking_splits_80_10_10_and_draws_positions_uniformly() -> None:
    n, L = 6000, 64
    ids, spans = random_case(11, n, L, 0.0)
    batch = assemble(ids, spans, make_cfg(L), rng_for(5, "mask"))
    toks = np.asarray(rows(batch, "tokens"))
    pos = batch.column("masked_positions")
    flat_pos = pos.values.to_numpy()
    row = np.repeat(np.arange(n), np.diff(pos.offsets.to_numpy()))
    labels = batch.column("masked_labels").values.to_numpy()
    shown = toks[row, flat_pos]
    m = len(shown)
    assert m > 20000
    masked = (shown == MASK).mean()
    kept = (shown == labels).mean()
    other = 1 - masked - kept
    p_same = 1 / (VOCAB - len(SPECIALS))  # a random replacement may draw the label itself
    for got, want in [(masked, 0.8), (kept, 0.1 + 0.1 * p_same), (other, 0.1 * (1 - p_same))]:
        assert abs(got - want) < 4.5 * math.sqrt(want * (1 - want) / m), (got, want)
    assert not np.isin(shown[shown != MASK], SPECIALS).any()  # random ids are non-special
    # uniform over candidates: the relative position in A+B is ~ Uniform(0, 1)
    la = spans.la[row]
    rel = (np.where(flat_pos <= la, flat_pos - 1, flat_pos - 2) + 0.5) / (spans.la + spans.lb)[row]
    assert abs(rel.mean() - 0.5) < 4.5 * math.sqrt(1 / 12 / m)


def test_compact_layout_holds_the_same_samples() -> None:
    ids, spans = random_case(3, 200, 40, 0.1)
    padded = assemble(ids, spans, make_cfg(40), rng_for(1, "m"))
    compact = assemble(ids, spans, make_cfg(40, layout="compact"), rng_for(1, "m"))
    for name in ("is_random_next", "masked_positions", "masked_labels"):
        assert padded.column(name).equals(compact.column(name))
    lengths = (spans.la + spans.lb + 3).tolist()
    unpadded = [t[:k] for t, k in zip(rows(padded, "tokens"), lengths, strict=True)]
    assert rows(compact, "tokens") == unpadded
    assert compact.column("segment_a_length").to_pylist() == (spans.la + 2).tolist()
