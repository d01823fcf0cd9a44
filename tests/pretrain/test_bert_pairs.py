"""Pair building and truncation against pure-Python transcriptions (the oracles): the seed article's
loop (``pairing="chunk_past_target"``) and Google's create_pretraining_data.py
(``pairing="google"``)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.rng import rng_for
from datamill.pretrain.bert._docs import TokenizedDocuments
from datamill.pretrain.bert._pairs import (
    Spans,
    UniformStream,
    build_pairs,
    build_pairs_seed,
    truncate_lengths,
    truncate_spans,
)


# ---------------------------------------------------------------- the seed, verbatim but for I/O
def seed_pairs(all_documents, document_index, max_seq_length, short_seq_prob, rng):  # type: ignore[no-untyped-def]
    """create_instances_from_document up to (excluding) truncate_seq_pair and masking."""
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    current_chunk: list[list[int]] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a = [t for j in range(a_end) for t in current_chunk[j]]
                tokens_b: list[int] = []
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(10):
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break
                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    num_unused_segments = len(current_chunk) - a_end
                    i -= num_unused_segments
                else:
                    is_random_next = False
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                instances.append((tokens_a, tokens_b, is_random_next))
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def _seed_script() -> ModuleType:
    """benchmarks/bert_seed_script.py: the one transcription of the seed article's loop, which the
    benchmark's seed process runs (it imports nothing from datamill, so it is loaded by path)."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bert_seed_script.py"
    spec = importlib.util.spec_from_file_location("bert_seed_script", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: the seed article's sentence-pair loop (before truncation and masking), on token-id lists; ``rng``
#: has ``random()`` and ``randint(lo, hi)`` (inclusive). One deliberate difference: a random B takes
#: at least one sentence (the article's scan leaves B empty when A alone reaches the target).
seed_article_pairs = _seed_script().seed_pairs


def seed_truncate(tokens_a, tokens_b, max_num_tokens, rng):  # type: ignore[no-untyped-def]
    """truncate_seq_pair, verbatim."""
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_num_tokens:
            break
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        assert len(trunc_tokens) >= 1
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


# ---------------------------------------------------------------- helpers
def corpus_of(docs: list[list[list[int]]]) -> TokenizedDocuments:
    sents = [s for d in docs for s in d]
    ids = np.asarray([t for s in sents for t in s], dtype=np.int32)
    so = np.concatenate([[0], np.cumsum([len(s) for s in sents])]).astype(np.int64)
    do = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    return TokenizedDocuments(ids=ids, sent_offsets=so, doc_offsets=do)


def random_docs(
    rng: np.random.Generator, n_docs: int, max_sents: int, max_len: int
) -> list[list[list[int]]]:
    return [
        [
            rng.integers(5, 1000, size=int(rng.integers(1, max_len + 1))).tolist()
            for _ in range(int(rng.integers(1, max_sents + 1)))
        ]
        for _ in range(n_docs)
    ]


def run_ours(
    corpus: TokenizedDocuments,
    max_seq_length: int,
    short: float,
    seed: int,  # type: ignore[no-untyped-def]
    pairing: str = "google",
):
    build = build_pairs if pairing == "google" else build_pairs_seed
    return build(
        corpus.sent_offsets.tolist(),
        corpus.doc_offsets.tolist(),
        0,
        corpus.num_documents,
        max_num_tokens=max_seq_length - 3,
        short_seq_prob=short,
        rng=rng_for(seed, "t"),
    )


# ---------------------------------------------------------------- tests
@given(
    seed=st.integers(0, 2**32),
    n_docs=st.integers(2, 12),
    max_sents=st.integers(1, 8),
    max_len=st.integers(1, 40),
    max_seq_length=st.integers(5, 80),
    short=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
)
def test_pairs_equal_the_seed_algorithm_draw_for_draw(
    seed: int, n_docs: int, max_sents: int, max_len: int, max_seq_length: int, short: float
) -> None:
    docs = random_docs(np.random.default_rng(seed), n_docs, max_sents, max_len)
    corpus = corpus_of(docs)
    spans = run_ours(corpus, max_seq_length, short, seed)
    rng = UniformStream(rng_for(seed, "t"))  # the seed's rng.random()/randint() on the same stream
    want = [
        inst for d in range(len(docs)) for inst in seed_pairs(docs, d, max_seq_length, short, rng)
    ]
    got = [
        (corpus.ids[a : a + la].tolist(), corpus.ids[b : b + lb].tolist(), bool(r))
        for a, la, b, lb, r in zip(spans.a_lo, spans.la, spans.b_lo, spans.lb, spans.is_random_next)
    ]
    assert got == want


@given(
    seed=st.integers(0, 2**32),
    n_docs=st.integers(2, 12),
    max_sents=st.integers(1, 8),
    max_len=st.integers(1, 40),
    max_seq_length=st.integers(5, 80),
    short=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
)
def test_seed_pairs_equal_the_seed_article_loop_draw_for_draw(
    seed: int, n_docs: int, max_sents: int, max_len: int, max_seq_length: int, short: float
) -> None:
    docs = random_docs(np.random.default_rng(seed), n_docs, max_sents, max_len)
    corpus = corpus_of(docs)
    spans = run_ours(corpus, max_seq_length, short, seed, pairing="chunk_past_target")
    rng = UniformStream(rng_for(seed, "t"))
    want = [
        inst
        for d in range(len(docs))
        for inst in seed_article_pairs(docs, d, max_seq_length, short, rng)
    ]
    got = [
        (corpus.ids[a : a + la].tolist(), corpus.ids[b : b + lb].tolist(), bool(r))
        for a, la, b, lb, r in zip(spans.a_lo, spans.la, spans.b_lo, spans.lb, spans.is_random_next)
    ]
    assert got == want
    assert ((spans.la >= 1) & (spans.lb >= 1)).all()
    assert (spans.is_random_next[spans.forced]).all()


def test_is_random_next_is_half_unless_the_chunk_has_one_sentence() -> None:
    docs = random_docs(np.random.default_rng(7), 1500, 30, 6)
    corpus = corpus_of(docs)
    spans = run_ours(corpus, 48, 0.1, seed=3)
    assert spans.is_random_next[spans.forced].all()  # a one-sentence chunk always takes a random B
    doc_start = corpus.sent_offsets[corpus.doc_offsets]
    doc_of = lambda tok: np.searchsorted(doc_start, tok, side="right") - 1
    np.testing.assert_array_equal(doc_of(spans.a_lo), spans.doc)
    same = doc_of(spans.b_lo) == spans.doc
    assert same[~spans.is_random_next].all()  # the actual next B: same document
    assert not same[spans.is_random_next].any()  # a random B: another document (10 tries of 1/1500)
    free = spans.is_random_next[~spans.forced]
    n = len(free)
    assert n > 2000
    tol = 4.5 * math.sqrt(0.25 / n)  # binomial(n, 1/2) standard error, 4.5 sigma
    assert abs(free.mean() - 0.5) < tol, (free.mean(), n)


def sequential_lengths(la: int, lb: int, m: int) -> tuple[int, int]:
    a, b = list(range(la)), list(range(lb))
    rng = UniformStream(np.random.default_rng(0))
    seed_truncate(a, b, m, rng)
    return la - len(a), lb - len(b)


@given(la=st.integers(1, 300), lb=st.integers(1, 300), m=st.integers(2, 300))
def test_truncate_lengths_equal_the_seed_loop(la: int, lb: int, m: int) -> None:
    rem_a, rem_b = truncate_lengths(np.array([la]), np.array([lb]), m)
    assert (int(rem_a[0]), int(rem_b[0])) == sequential_lengths(la, lb, m)


@given(seed=st.integers(0, 2**32), m=st.integers(2, 200))
def test_truncated_spans_are_sub_slices_within_budget(seed: int, m: int) -> None:
    docs = random_docs(np.random.default_rng(seed), 6, 6, 80)
    corpus = corpus_of(docs)
    spans = run_ours(corpus, 512, 0.1, seed)
    cut = truncate_spans(spans, m, rng_for(seed, "cut"))
    total = cut.la + cut.lb
    assert (total <= m).all()
    assert ((cut.la >= 1) & (cut.lb >= 1)).all()
    untouched = spans.la + spans.lb <= m
    np.testing.assert_array_equal(cut.a_lo[untouched], spans.a_lo[untouched])
    np.testing.assert_array_equal(cut.la[untouched], spans.la[untouched])
    # the kept part lies inside the original span, on both sides
    assert ((cut.a_lo >= spans.a_lo) & (cut.a_lo + cut.la <= spans.a_lo + spans.la)).all()
    assert ((cut.b_lo >= spans.b_lo) & (cut.b_lo + cut.lb <= spans.b_lo + spans.lb)).all()
    # truncated pairs use the whole budget (tokens are removed one at a time until it fits)
    assert (total[~untouched] == m).all()


def test_front_and_back_removals_are_balanced() -> None:
    la = np.full(20000, 60, dtype=np.int64)
    zeros = np.zeros(20000, np.int64)
    spans_in = Spans(
        zeros,
        la,
        zeros,
        np.full(20000, 10, np.int64),
        zeros.astype(bool),
        zeros,
        zeros.astype(bool),
    )
    cut = truncate_spans(spans_in, 40, rng_for(1, "balance"))
    front = cut.a_lo.astype(float)  # 30 removed from A: front count ~ Binomial(30, 1/2)
    assert (cut.la == 30).all()
    assert abs(front.mean() - 15) < 4.5 * math.sqrt(30 * 0.25 / 20000)
    assert abs(front.var() - 7.5) < 0.5
