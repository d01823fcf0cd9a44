"""Sentence pairs (A, B) per document, two pairing rules, and truncation.

Two pair loops walk the sentences of each document (a loop per sentence chunk, not per token) and
record each pair as token spans into the flat corpus: A = ``ids[a_lo:a_lo+la]``,
B = ``ids[b_lo:b_lo+lb]`` (both are runs of consecutive sentences, hence contiguous):

* ``"chunk_past_target"`` (:func:`build_pairs_seed`): the loop of the article this project started
  from (``"seed"`` is the deprecated old name). The chunk scan starts with one
  sentence and adds sentences while the *previous* ones are short of the target, so it stops one
  sentence after the one that reaches the target and a chunk holds at least two sentences when the
  document has them; A is ``chunks[:sep]`` (``sep`` uniform in ``[1, end-1]``); B is random when
  the chunk left no B or with probability 0.5 (the random document is uniform over the *other*
  documents: one draw); a non-random pair consumes ``chunks[:end]``, a random one ``chunks[:sep]``.
* ``"google"`` (:func:`build_pairs`): Google's ``create_instances_from_document``: the chunk
  stops *at* the sentence that reaches the target (often a single WikiText paragraph, which forces
  a random B), and the random document takes up to 10 draws to differ.

``truncate_spans`` then applies ``truncate_seq_pair`` to all pairs at once (both rules).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "PAIRINGS",
    "PAIRING_ALIASES",
    "Spans",
    "UniformStream",
    "build_pairs",
    "build_pairs_seed",
    "pair_builder",
    "truncate_lengths",
    "truncate_spans",
]

PAIRINGS = ("chunk_past_target", "google")
"""The pairing rules: a chunk grows one sentence past the target (the default), and Google
BERT's."""

PAIRING_ALIASES = {"seed": "chunk_past_target"}
"""Deprecated pairing names -> the current ones (accepted with a ``DeprecationWarning``)."""

_BLOCK = 4096


class UniformStream:
    """Scalar uniforms in [0, 1) drawn from a Generator in blocks (cheap per draw in a Python
    loop)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._buf: list[float] = []
        self._i = 0

    def random(self) -> float:
        if self._i >= len(self._buf):
            self._buf = self._rng.random(_BLOCK).tolist()
            self._i = 0
        u = self._buf[self._i]
        self._i += 1
        return u

    def randint(self, lo: int, hi: int) -> int:
        """Uniform integer in ``[lo, hi]`` (inclusive, like ``random.randint``)."""
        return lo + int(self.random() * (hi - lo + 1))


@dataclass(frozen=True)
class Spans:
    """One row per sample: A and B as (start, length) into the corpus ids, and the NSP label."""

    a_lo: NDArray[np.int64]
    la: NDArray[np.int64]
    b_lo: NDArray[np.int64]
    lb: NDArray[np.int64]
    is_random_next: NDArray[np.bool_]
    doc: NDArray[np.int64]
    forced: NDArray[np.bool_]  # the chunk had one sentence, so B had to be random

    def __len__(self) -> int:
        return len(self.a_lo)

    def slice(self, lo: int, hi: int) -> Spans:
        return Spans(
            self.a_lo[lo:hi],
            self.la[lo:hi],
            self.b_lo[lo:hi],
            self.lb[lo:hi],
            self.is_random_next[lo:hi],
            self.doc[lo:hi],
            self.forced[lo:hi],
        )


class _PairLog:
    """The pairs a loop draws, one :meth:`add` each, as :class:`Spans` at the end."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int, int, bool, int, bool]] = []

    def add(
        self, a: tuple[int, int], b: tuple[int, int], *, rnd: bool, doc: int, forced: bool
    ) -> None:
        """Pair A = tokens ``a[0]:a[1]``, B = ``b[0]:b[1]`` of document ``doc``."""
        self.rows.append((a[0], a[1] - a[0], b[0], b[1] - b[0], rnd, doc, forced))

    def spans(self) -> Spans:
        cols = list(zip(*self.rows, strict=True)) if self.rows else [()] * 7
        ints, bools = np.int64, np.bool_
        dtypes = (ints, ints, ints, ints, bools, ints, bools)
        return Spans(*(np.asarray(c, dtype=t) for c, t in zip(cols, dtypes, strict=True)))


def _target_length(u: UniformStream, max_num_tokens: int, short_seq_prob: float) -> int:
    """``max_num_tokens``, or with probability ``short_seq_prob`` uniform in ``[2, max]``."""
    target = max_num_tokens
    if u.random() < short_seq_prob:
        target = u.randint(2, max_num_tokens)
    return target


# Google's create_instances_from_document transcribed statement by statement (the test compares
# it with the reference draw for draw)
def build_pairs(
    sent_offsets: list[int],
    doc_offsets: list[int],
    doc_lo: int,
    doc_hi: int,
    *,
    max_num_tokens: int,
    short_seq_prob: float,
    rng: np.random.Generator,
) -> Spans:
    """Pairs for documents ``doc_lo..doc_hi-1`` with Google's rules (``pairing="google"``).

    ``sent_offsets`` / ``doc_offsets`` are the corpus offsets (see :mod:`._docs`) as lists.

    target length = ``max_num_tokens``, or with probability ``short_seq_prob`` a uniform integer in
    ``[2, max_num_tokens]``; sentences are gathered until the target or the document end; A takes a
    uniform number ``a_end`` in ``[1, n-1]`` of them (1 when the chunk has one sentence); with
    probability 0.5, or when the chunk has a single sentence, B is read from a random sentence of
    another document (10 tries to differ) until ``target - len(A)`` tokens and the unused sentences
    of the chunk are put back; otherwise B is the rest of the chunk.
    """
    u = UniformStream(rng)
    so, do = sent_offsets, doc_offsets  # Python lists: scalar indexing is 5x cheaper than numpy's
    n_docs = len(do) - 1
    log = _PairLog()
    for d in range(doc_lo, doc_hi):
        first, end = do[d], do[d + 1]
        target = _target_length(u, max_num_tokens, short_seq_prob)
        chunk_start = first
        cur = 0
        i = first
        while i < end:
            cur += so[i + 1] - so[i]
            if i == end - 1 or cur >= target:
                n_chunk = i - chunk_start + 1
                a_end = u.randint(1, n_chunk - 1) if n_chunk >= 2 else 1
                a0 = so[chunk_start]
                a1 = so[chunk_start + a_end]
                if n_chunk == 1 or u.random() < 0.5:
                    target_b = target - (a1 - a0)
                    rd = d
                    for _ in range(10):
                        rd = u.randint(0, n_docs - 1)
                        if rd != d:
                            break
                    r_first, r_end = do[rd], do[rd + 1]
                    j = u.randint(r_first, r_end - 1)
                    b0 = so[j]
                    b1 = b0
                    while j < r_end:
                        b1 = so[j + 1]
                        j += 1
                        if b1 - b0 >= target_b:
                            break
                    i -= n_chunk - a_end  # put the unused sentences back
                    rnd = True
                else:
                    b0, b1 = a1, so[i + 1]
                    rnd = False
                log.add((a0, a1), (b0, b1), rnd=rnd, doc=d, forced=n_chunk == 1)
                chunk_start = i + 1
                cur = 0
            i += 1
    return log.spans()


# the article's pair loop transcribed statement by statement (the test compares it with the
# reference draw for draw)
def build_pairs_seed(
    sent_offsets: list[int],
    doc_offsets: list[int],
    doc_lo: int,
    doc_hi: int,
    *,
    max_num_tokens: int,
    short_seq_prob: float,
    rng: np.random.Generator,
) -> Spans:
    """Pairs for documents ``doc_lo..doc_hi-1`` with the seed article's loop
    (``pairing="chunk_past_target"``).

    Per document: target length as in :func:`build_pairs`; then, while sentences remain
    (``chunks``): ``end = 1``; while ``end < len(chunks)`` and the tokens of ``chunks[:end-1]`` are
    short of the target, ``end += 1``; ``sep`` is uniform in ``[1, end-1]`` (1 without a draw when
    ``end == 1``); A = ``chunks[:sep]``; B = ``chunks[sep:end]`` unless it is empty or a uniform
    is below 0.5, in which case B comes from another document (``randint(0, n_docs-2)``, shifted
    past this one), from a uniform sentence on, sentence by sentence until ``len(A) + len(B)``
    reaches the target (at least one sentence) or that document ends. A non-random pair consumes
    ``chunks[:end]``, a random one ``chunks[:sep]``.
    """
    u = UniformStream(rng)
    so, do = sent_offsets, doc_offsets
    n_docs = len(do) - 1
    log = _PairLog()
    for d in range(doc_lo, doc_hi):
        p, stop = do[d], do[d + 1]
        target = _target_length(u, max_num_tokens, short_seq_prob)
        while p < stop:
            n_left = stop - p
            end = 1
            while end < n_left and so[p + end - 1] - so[p] < target:
                end += 1
            sep = u.randint(1, end - 1) if end > 1 else 1
            a0, a1 = so[p], so[p + sep]
            if sep == end or u.random() < 0.5:
                rd = u.randint(0, n_docs - 2)
                if rd >= d:
                    rd += 1
                r_first, r_end = do[rd], do[rd + 1]
                j = u.randint(r_first, r_end - 1)
                b0 = so[j]
                b1 = so[j + 1]
                j += 1
                while j < r_end and (a1 - a0) + (b1 - b0) < target:
                    b1 = so[j + 1]
                    j += 1
                rnd = True
                p += sep
            else:
                b0, b1 = a1, so[p + end]
                rnd = False
                p += end
            log.add((a0, a1), (b0, b1), rnd=rnd, doc=d, forced=sep == end)
    return log.spans()


def pair_builder(pairing: str) -> Callable[..., Spans]:
    """The pair loop of a pairing rule (``"chunk_past_target"`` or ``"google"``)."""
    return build_pairs if pairing == "google" else build_pairs_seed


def truncate_lengths(
    la: NDArray[np.int64], lb: NDArray[np.int64], max_num_tokens: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """How many tokens ``truncate_seq_pair`` removes from A and from B, in closed form.

    The seed removes one token at a time from the longer side (from B on a tie) until
    ``len(A) + len(B) <= max_num_tokens``: first the longer side loses the difference (or the whole
    excess if smaller), then the sides alternate, B first, so B loses ``ceil(rest / 2)``.

    Examples:
        >>> [int(x[0]) for x in truncate_lengths(np.array([10]), np.array([4]), 8)]
        [6, 0]
        >>> [int(x[0]) for x in truncate_lengths(np.array([5]), np.array([5]), 7)]
        [1, 2]
    """
    excess = np.maximum(la + lb - max_num_tokens, 0)
    diff = np.abs(la - lb)
    first = np.minimum(excess, diff)
    rest = excess - first
    a_longer = la > lb
    rem_a = np.where(a_longer, first, 0) + rest // 2
    rem_b = np.where(a_longer, 0, first) + (rest - rest // 2)
    return rem_a, rem_b


def truncate_spans(spans: Spans, max_num_tokens: int, rng: np.random.Generator) -> Spans:
    """Apply ``truncate_seq_pair`` to every pair: each removed token comes from the front or the
    back with probability 1/2, so the number taken from the front is Binomial(removed, 1/2)."""
    rem_a, rem_b = truncate_lengths(spans.la, spans.lb, max_num_tokens)
    front_a = rng.binomial(rem_a, 0.5)
    front_b = rng.binomial(rem_b, 0.5)
    return Spans(
        spans.a_lo + front_a,
        spans.la - rem_a,
        spans.b_lo + front_b,
        spans.lb - rem_b,
        spans.is_random_next,
        spans.doc,
        spans.forced,
    )
