"""The word2vec sampling stages, vectorised with numpy (private; see
:mod:`datamill.pretrain.word2vec`).

Each stage is the d2l seed's procedure with the per-token Python loop replaced by whole-array
operations; the random *distribution* of every output is the seed's, the random *stream* is
numpy's (one generator per stage from :func:`datamill.core.rng.rng_for`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.ascii import ascii_words
from datamill.core.errors import ConfigError

__all__ = [
    "AliasTable",
    "Sentences",
    "centers_and_contexts",
    "draw_negatives",
    "split_lines",
    "subsample",
]

_MAX_REDRAW_ROUNDS = 1000
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Sentences:
    """Token ids of many sentences as CSR: ``ids[offsets[s]:offsets[s + 1]]`` is sentence ``s``."""

    ids: NDArray[np.int32]
    offsets: NDArray[np.int64]

    @property
    def num_tokens(self) -> int:
        return len(self.ids)


def split_lines(data: bytes | str) -> tuple[pa.Array, NDArray[np.int64]]:
    r"""``[line.split() for line in text.split('\n')]`` as (flat tokens, line offsets).

    ASCII input is cut with numpy on the bytes (:func:`datamill.core.ascii.ascii_words`: tokens
    come dictionary-encoded); other UTF-8 text goes through
    ``pyarrow.compute.utf8_split_whitespace``.

    Examples:
        >>> toks, off = split_lines(b" a bb\n\nccc \t d \n")
        >>> toks.to_pylist(), off.tolist()
        (['a', 'bb', 'ccc', 'd'], [0, 2, 2, 4, 4])
    """
    if isinstance(data, str):
        if not data.isascii():
            return _split_unicode(data)
        data = data.encode("ascii")
    elif not data.isascii():
        return _split_unicode(data.decode("utf-8"))
    tokens, offsets = ascii_words(data, lowercase=False)
    if data.endswith(b"\n"):  # text.split('\n') ends with an empty line after a final newline
        offsets = np.concatenate([offsets, offsets[-1:]])
    return tokens, offsets


def _split_unicode(text: str) -> tuple[pa.Array, NDArray[np.int64]]:
    lines = pa.array(text.split("\n"), pa.string())
    parts = pc.utf8_split_whitespace(lines)
    flat = pc.list_flatten(parts)
    parent = pc.list_parent_indices(parts).to_numpy()
    keep = pc.not_equal(
        flat, ""
    )  # arrow keeps empty strings at leading/trailing blanks; str.split() does not
    tokens = pc.filter(flat, keep)
    parent = parent[keep.to_numpy(zero_copy_only=False)]
    offsets = np.searchsorted(parent, np.arange(len(lines) + 1)).astype(np.int64)
    return tokens, offsets


def drop_ids(sent: Sentences, keep: NDArray[np.bool_]) -> Sentences:
    """Keep the tokens where ``keep`` is true; sentence boundaries follow."""
    cs = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
    return Sentences(sent.ids[keep], cs[sent.offsets])


def subsample(
    sent: Sentences, counts: NDArray[np.int64], *, t: float, rng: np.random.Generator
) -> Sentences:
    """Keep each token with probability ``min(1, sqrt(t / f(w)))``, ``f = counts[w] /
    counts.sum()``.

    One uniform draw per token, compared like the seed: ``u < sqrt(t / count * total)``.
    """
    total = float(counts.sum())
    with np.errstate(divide="ignore"):
        thresh = np.sqrt(t / counts.astype(np.float64) * total)
    u = rng.random(sent.num_tokens)
    return drop_ids(sent, u < thresh[sent.ids])


def centers_and_contexts(
    sent: Sentences,
    *,
    max_window: int,
    rng: np.random.Generator,
) -> tuple[NDArray[np.int32], NDArray[np.int64], NDArray[np.int32]]:
    """(centers, context offsets, context ids): every token of a sentence of >= 2 tokens is a
    center.

    Window ``w ~ U{1..max_window}`` per center; contexts are the sentence's tokens at positions
    ``[max(start, i - w), min(end, i + w + 1))`` except ``i`` itself, in position order.
    """
    lengths = np.diff(sent.offsets)
    long_enough = np.repeat(lengths >= 2, lengths)
    pos = np.flatnonzero(long_enough)  # token positions of the centers
    start = np.repeat(sent.offsets[:-1], lengths)[pos]  # their sentence's bounds
    end = np.repeat(sent.offsets[1:], lengths)[pos]
    w = rng.integers(1, max_window + 1, size=len(pos))
    lo = np.maximum(start, pos - w)
    hi = np.minimum(end, pos + w + 1)
    span = hi - lo  # includes the center
    span_off = np.concatenate([[0], np.cumsum(span)])
    idx = np.repeat(lo - span_off[:-1], span) + np.arange(span_off[-1])
    idx = idx[idx != np.repeat(pos, span)]
    ctx_off = np.concatenate([[0], np.cumsum(span - 1)]).astype(np.int64)
    return sent.ids[pos], ctx_off, sent.ids[idx]


class AliasTable:
    """Walker/Vose alias table: O(1) draws from a discrete distribution over ``values``.

    Examples:
        >>> t = AliasTable(np.array([1.0, 3.0]), values=np.array([7, 8]))
        >>> d = t.draw(np.random.default_rng(0), 10_000)
        >>> sorted(set(d.tolist())), bool(0.72 < (d == 8).mean() < 0.78)
        ([7, 8], True)
    """

    def __init__(self, weights: NDArray[np.float64], *, values: NDArray[np.int64]) -> None:
        n = len(weights)
        total = float(weights.sum())
        if n == 0 or not total > 0:
            raise ConfigError("cannot sample negatives: every candidate word has weight 0")
        scaled = weights * (n / total)
        prob = np.ones(n)
        alias = np.arange(n)
        small = [i for i in np.flatnonzero(scaled < 1.0).tolist()]  # O(vocab) build, once
        large = [i for i in np.flatnonzero(scaled >= 1.0).tolist()]
        s = scaled.tolist()
        while small and large:
            a, b = small.pop(), large.pop()
            prob[a], alias[a] = s[a], b
            s[b] = s[b] + s[a] - 1.0
            (small if s[b] < 1.0 else large).append(b)
        self.prob, self.alias = prob, alias
        self._threshold = np.minimum(np.floor(prob * 2.0**32), 2.0**32 - 1).astype(np.uint64)
        self.values = np.asarray(values, dtype=np.int32)

    def draw(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> NDArray[np.int32]:
        """Independent draws of shape ``size`` from one raw 64-bit word each: the high 32 bits pick
        the column (multiply-shift, relative bias <= n / 2**32), the low 32 bits decide column vs
        alias against ``prob`` scaled to 32 bits."""
        shape = (size,) if isinstance(size, int) else tuple(size)
        raw = rng.bit_generator.random_raw(int(np.prod(shape)))
        col = (((raw >> np.uint64(32)) * np.uint64(len(self.prob))) >> np.uint64(32)).astype(
            np.intp
        )
        raw &= np.uint64(0xFFFFFFFF)
        col = np.where(raw >= self._threshold[col], self.alias[col], col)
        out: NDArray[np.int32] = self.values[col].reshape(shape)
        return out


def draw_negatives(
    ctx_off: NDArray[np.int64],
    ctx: NDArray[np.int32],
    *,
    k: int,
    table: AliasTable,
    rng: np.random.Generator,
) -> tuple[NDArray[np.int64], NDArray[np.int32]]:
    """``k`` negatives per context word, never one of the example's contexts: (offsets, ids).

    Draws everything in bulk, then redraws only the collisions until none is left: the same
    distribution as the seed's draw-and-reject loop (each slot independent, conditioned on not
    being a context of its example). Examples are grouped by their number of contexts ``c`` so each
    group is a dense ``(n, k * c)`` draw checked against its ``(n, c)`` contexts by broadcasting.
    """
    counts = np.diff(ctx_off)
    neg_off = ctx_off * k
    neg = np.empty(int(neg_off[-1]), dtype=np.int32)
    if len(neg) == 0:
        return neg_off, neg
    for c in np.unique(counts).tolist():
        if c == 0:
            continue
        ex = np.flatnonzero(counts == c)
        step = max(1, _CHUNK // (k * c))  # bounded temporaries
        for a in range(0, len(ex), step):
            part = ex[a : a + step]
            contexts = ctx[ctx_off[part][:, None] + np.arange(c)]  # (n, c)
            neg[neg_off[part][:, None] + np.arange(k * c)] = _draw_group(
                contexts, k * c, table, rng
            )
    return neg_off, neg


def _draw_group(
    contexts: NDArray[np.int32], m: int, table: AliasTable, rng: np.random.Generator
) -> NDArray[np.int32]:
    """``m`` draws per row of ``contexts``, none equal to a value of its row."""
    draws = table.draw(rng, (len(contexts), m))
    hit = draws == contexts[:, :1]
    for j in range(1, contexts.shape[1]):
        hit |= draws == contexts[:, j : j + 1]
    rows, cols = np.nonzero(hit)
    rounds = 0
    while len(rows):
        rounds += 1
        if rounds > _MAX_REDRAW_ROUNDS:
            raise ConfigError(
                f"negative sampling did not finish: {len(rows)} negatives still equal a context "
                "word "
                f"after {_MAX_REDRAW_ROUNDS} redraws (the vocabulary is too small for its contexts)"
            )
        new = table.draw(rng, len(rows))
        draws[rows, cols] = new
        bad = (new[:, None] == contexts[rows]).any(axis=1)
        rows, cols = rows[bad], cols[bad]
    return draws
