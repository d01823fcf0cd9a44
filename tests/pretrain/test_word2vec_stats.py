"""word2vec statistics: subsampling rate, window sizes, negative distribution (fixed seeds).

Tolerances come from the sampling distributions, not guesses: every check is a chi-square
goodness-of-fit test whose p-value must stay above ALPHA = 1e-4 (scipy is not installed, so the
chi-square survival function is computed below from the regularized incomplete gamma series and
checked against table values). With fixed seeds the tests are deterministic; ALPHA is the chance
that a *correct* sampler would fail one of them for a given seed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from datamill.pretrain.word2vec._sample import (
    AliasTable,
    Sentences,
    centers_and_contexts,
    draw_negatives,
    subsample,
)

ALPHA = 1e-4


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df): 1 - P(df/2, x/2), P by its power series (converges for all
    x)."""
    a, z = df / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    term = 1.0 / a
    total = term
    n = 0
    while term > total * 1e-15:
        n += 1
        term *= z / (a + n)
        total += term
    log_p = a * math.log(z) - z - math.lgamma(a) + math.log(total)
    return max(0.0, 1.0 - math.exp(log_p))


@pytest.mark.parametrize(
    ("x", "df", "p"),
    [(3.841459, 1, 0.05), (18.46683, 4, 0.001), (124.3421, 100, 0.05), (6.634897, 1, 0.01)],
)
def test_chi2_sf_matches_tables(x: float, df: int, p: float) -> None:
    assert chi2_sf(x, df) == pytest.approx(p, rel=1e-4)


def _pearson(observed: np.ndarray, expected: np.ndarray) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def test_subsampling_keeps_each_word_with_the_formula_probability() -> None:
    # word w (id 1..12) occurs counts[w] times, shuffled over sentences
    counts = np.array(
        [0, 60000, 30000, 15000, 8000, 4000, 2000, 1000, 500, 200, 100, 50, 20], dtype=np.int64
    )
    ids = (
        np.random.default_rng(1)
        .permutation(np.repeat(np.arange(len(counts)), counts))
        .astype(np.int32)
    )
    sent = Sentences(ids, np.arange(0, len(ids) + 1, 10, dtype=np.int64))
    t = 2e-3
    kept = subsample(sent, counts, t=t, rng=np.random.default_rng(2))
    k = np.bincount(kept.ids, minlength=len(counts))[1:]
    n = counts[1:].astype(float)
    p = np.minimum(1.0, np.sqrt(t / (n / n.sum())))
    sure = p >= 1.0
    assert sure.any() and (~sure).sum() >= 5
    np.testing.assert_array_equal(k[sure], counts[1:][sure])  # p >= 1: always kept
    # k_w ~ Binomial(n_w, p_w), independent: sum of squared z-scores ~ chi-square(#words)
    # (normal approximation; every n p (1 - p) here is >= 40)
    e, v = n[~sure] * p[~sure], n[~sure] * p[~sure] * (1 - p[~sure])
    assert v.min() >= 40
    stat = float(((k[~sure] - e) ** 2 / v).sum())
    assert chi2_sf(stat, int((~sure).sum())) > ALPHA, stat
    # sentence boundaries follow the kept tokens
    assert kept.offsets[-1] == len(kept.ids) and np.all(np.diff(kept.offsets) >= 0)


def test_window_sizes_are_uniform() -> None:
    window, n = 5, 30000
    sent = Sentences(np.arange(n, dtype=np.int32) % 97 + 1, np.array([0, n], dtype=np.int64))
    _, off, _ = centers_and_contexts(sent, max_window=window, rng=np.random.default_rng(3))
    interior = np.arange(
        window, n - window
    )  # centers far from the sentence ends have exactly 2w contexts
    w = np.diff(off)[interior] // 2
    observed = np.bincount(w, minlength=window + 1)[1:]
    assert observed.sum() == len(interior) and set(np.unique(w).tolist()) == set(
        range(1, window + 1)
    )
    expected = np.full(window, len(interior) / window)
    assert chi2_sf(_pearson(observed, expected), window - 1) > ALPHA
    # near the ends windows are clipped to the sentence
    assert np.diff(off)[0] <= window and np.diff(off)[-1] <= window


def _weights() -> np.ndarray:
    counts = np.random.default_rng(4).zipf(1.6, size=300).clip(max=5000).astype(float)
    return counts**0.75


def test_alias_table_draws_follow_the_weights() -> None:
    w = _weights()
    table = AliasTable(w, values=np.arange(1, len(w) + 1))
    draws = table.draw(np.random.default_rng(5), 400_000)
    observed = np.bincount(draws, minlength=len(w) + 1)[1:]
    expected = 400_000 * w / w.sum()
    assert expected.min() >= 5  # chi-square approximation valid
    assert chi2_sf(_pearson(observed, expected), len(w) - 1) > ALPHA


def test_negatives_follow_the_weights_restricted_to_non_contexts() -> None:
    """The seed's rejection loop gives weights renormalised over the words that are not contexts."""
    w = _weights()
    v = len(w)
    table = AliasTable(w, values=np.arange(1, v + 1))
    heavy = (
        np.argsort(w)[-2:] + 1
    )  # the two heaviest words are every example's contexts: many collisions
    n_ex, k = 40_000, 5
    ctx_off = np.arange(0, 2 * n_ex + 1, 2, dtype=np.int64)
    ctx = np.tile(heavy, n_ex).astype(np.int32)
    neg_off, neg = draw_negatives(ctx_off, ctx, k=k, table=table, rng=np.random.default_rng(6))
    np.testing.assert_array_equal(neg_off, ctx_off * k)
    assert not np.isin(neg, heavy).any()
    observed = np.bincount(neg, minlength=v + 1)[1:]
    allowed = np.ones(v, bool)
    allowed[heavy - 1] = False
    expected = len(neg) * w[allowed] / w[allowed].sum()
    assert expected.min() >= 5
    assert chi2_sf(_pearson(observed[allowed], expected), int(allowed.sum()) - 1) > ALPHA


def test_negatives_with_varied_contexts_never_collide() -> None:
    rng = np.random.default_rng(8)
    lengths = rng.integers(1, 11, size=5000)
    ctx_off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ctx = rng.integers(1, 8, size=int(ctx_off[-1])).astype(
        np.int32
    )  # tiny vocab: collisions are common
    table = AliasTable(np.ones(10), values=np.arange(1, 11))
    neg_off, neg = draw_negatives(ctx_off, ctx, k=3, table=table, rng=rng)
    owner = np.repeat(np.arange(len(lengths)), np.diff(neg_off))
    c_owner = np.repeat(np.arange(len(lengths)), lengths)
    assert not np.isin(owner * 100 + neg, c_owner * 100 + ctx).any()
    assert len(neg) == 3 * len(ctx)
