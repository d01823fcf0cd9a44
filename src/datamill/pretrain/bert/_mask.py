"""Samples from spans, vectorised over a whole batch: ``[CLS] A [SEP] B [SEP]``, masking, padding.

Everything here is numpy over all the samples of a batch (no loop per sample or token):

* the token sequences are one gather from the corpus ids into a flat, unpadded buffer
  (values + offsets), with the three special tokens written by fancy indexing;
* masking draws, per sample, ``k = min(max_predictions, max(1, round((len(A)+len(B)) *
  mask_prob)))`` distinct positions uniformly among the non-special tokens with Floyd's algorithm
  run for all rows at once (``max_predictions`` vector steps), sorts them, and replaces 80% by
  ``[MASK]``, 10% by a random non-special id, keeps 10%;
* padding is one scatter into a ``(n, max_seq_length)`` array filled with ``[PAD]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.arrow import from_numpy, list_array
from datamill.core.ragged import ranges
from datamill.pretrain.bert._pairs import Spans

__all__ = ["LAYOUTS", "MaskConfig", "assemble", "bert_schema"]

LAYOUTS = ("padded", "compact")


@dataclass(frozen=True)
class MaskConfig:
    """What :func:`assemble` needs besides the spans (all plain values, cheap to pickle)."""

    max_seq_length: int
    mask_prob: float
    max_predictions: int
    pad: int
    cls: int
    sep: int
    mask: int
    special_ids: tuple[int, ...]
    vocab_size: int
    layout: str = "padded"


def bert_schema(layout: str) -> pa.Schema:
    """The Arrow schema of one layout (``padded``: the seed's columns; ``compact``: unpadded)."""
    common = [
        pa.field("is_random_next", pa.bool_()),
        pa.field("masked_positions", pa.list_(pa.int32())),
        pa.field("masked_labels", pa.list_(pa.int32())),
    ]
    if layout == "padded":
        return pa.schema(
            [
                pa.field("tokens", pa.list_(pa.int32())),
                pa.field("segment_ids", pa.list_(pa.int8())),
                *common,
            ]
        )
    return pa.schema(
        [
            pa.field("tokens", pa.list_(pa.int32())),
            pa.field("segment_a_length", pa.int32()),
            *common,
        ]
    )


def _floyd_sample(
    c: NDArray[np.int64], k: NDArray[np.int64], kmax: int, rng: np.random.Generator
) -> NDArray[np.int64]:
    """Row ``i`` gets ``k[i]`` distinct uniform integers in ``[0, c[i])`` (Floyd), ``-1`` after
    them."""
    n = len(c)
    out = np.full((n, max(kmax, 1)), -1, dtype=np.int64)
    u = rng.random((kmax, n))
    for s in range(kmax):
        active = s < k
        j = (
            c - k + s
        )  # Floyd: for j in range(c - k, c): t = randint(0, j); take j if t taken else t
        t = (u[s] * (j + 1)).astype(np.int64)
        taken = (out[:, :s] == t[:, None]).any(axis=1)
        out[:, s] = np.where(active, np.where(taken, j, t), -1)
    return out


# long (93 lines, 5 of docstring): one vectorised assembly (ids, segments, masking, padding) over
# all samples of a task, kept in one place so the array shapes can be followed
def assemble(
    ids: NDArray[np.int32],
    spans: Spans,
    cfg: MaskConfig,
    rng: np.random.Generator,
    *,
    specials_in_ids: bool = True,
) -> pa.RecordBatch:
    """Build, mask and lay out the samples of ``spans`` (already truncated) as one record batch.

    ``specials_in_ids=False`` promises that ``ids`` holds no special id (the caller checked the
    corpus once), which skips the per-token check; the samples are the same either way.
    """
    n = len(spans)
    la, lb = spans.la, spans.lb
    length = la + lb + 3
    row_start = np.cumsum(length) - length
    total = int(length.sum())
    # 1. the sequences, flat and unpadded: one gather of the A and B runs into the non-special
    #    slots (a boolean mask, in row order: A then B inside each row), three special scatters
    src_starts = np.stack([spans.a_lo, spans.b_lo], axis=1).ravel()
    lens = np.stack([la, lb], axis=1).ravel()
    values = ids[ranges(src_starts, lens)]
    slot = np.ones(total, dtype=np.bool_)
    slot[row_start] = slot[row_start + la + 1] = slot[row_start + length - 1] = False
    flat = np.empty(total, dtype=np.int32)
    flat[slot] = values
    flat[row_start] = cfg.cls
    flat[row_start + la + 1] = cfg.sep
    flat[row_start + length - 1] = cfg.sep
    # 2. candidates = content positions whose token is not special (e.g. [UNK] in the text)
    special_tab = np.zeros(
        max(cfg.vocab_size, int(values.max(initial=0)) + 1 if specials_in_ids else 0),
        dtype=np.bool_,
    )
    special_tab[list(cfg.special_ids)] = True
    is_sp = special_tab[values] if specials_in_ids else None
    c = la + lb
    content: NDArray[np.int64] | None = (
        None  # flat position of every candidate (only with specials)
    )
    if is_sp is not None and is_sp.any():
        content = np.flatnonzero(slot)
        sp_rows = np.searchsorted(row_start, content[is_sp], side="right") - 1
        c = c - np.bincount(sp_rows, minlength=n)
        content = content[~is_sp]
    cand_start = np.cumsum(c) - c
    wanted = np.maximum(
        1, np.rint((la + lb) * cfg.mask_prob).astype(np.int64)
    )  # round half even, as Python
    k = np.minimum(np.minimum(wanted, cfg.max_predictions), c)
    kmax = int(k.max(initial=0))
    picks = _floyd_sample(c, k, kmax, rng)
    valid = picks >= 0
    if (
        content is None
    ):  # no special token inside: candidate j of a row sits at 1 + j, after [SEP] at 2 + j
        chosen = np.where(valid, row_start[:, None] + 1 + picks + (picks >= la[:, None]), total)
    elif len(content):
        chosen = np.where(valid, content[np.where(valid, cand_start[:, None] + picks, 0)], total)
    else:
        chosen = np.full(picks.shape, total, dtype=np.int64)
    chosen.sort(axis=1)
    mflat = chosen[np.arange(chosen.shape[1]) < k[:, None]]  # row-major: ascending inside each row
    mrow = np.repeat(np.arange(n), k)
    positions = (mflat - row_start[mrow]).astype(np.int32)
    labels = flat[mflat].copy()
    # 3. 80% [MASK], 10% random non-special id, 10% unchanged
    u = rng.random(len(mflat))
    flat[mflat[u < 0.8]] = cfg.mask
    rand = mflat[u >= 0.9]
    non_special = np.flatnonzero(~special_tab[: cfg.vocab_size]).astype(np.int32)
    flat[rand] = non_special[rng.integers(0, len(non_special), size=len(rand))]
    m_off = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(k, out=m_off[1:])
    masked_positions = list_array(m_off, positions)
    masked_labels = list_array(m_off, labels)
    is_random = from_numpy(spans.is_random_next)
    # 4. layout
    L = cfg.max_seq_length
    if cfg.layout == "compact":
        off = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(length, out=off[1:])
        arrays = [
            list_array(off, flat),
            from_numpy((la + 2).astype(np.int32)),
            is_random,
            masked_positions,
            masked_labels,
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=bert_schema("compact"))
    pos = np.arange(L, dtype=np.int32)[None, :]
    attention = pos < length.astype(np.int32)[:, None]
    padded = np.full((n, L), cfg.pad, dtype=np.int32)
    padded[attention] = flat  # row-major: the True cells are the flat sequence, in order
    seg = (pos >= (la + 2).astype(np.int32)[:, None]).view(np.int8)
    seg -= 2 * (~attention).view(np.int8)
    off = np.arange(0, (n + 1) * L, L, dtype=np.int32)
    arrays = [
        list_array(off, padded.ravel()),
        list_array(off, seg.ravel()),
        is_random,
        masked_positions,
        masked_labels,
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=bert_schema("padded"))
