"""word2vec builder: the seed's semantics on tiny data and on PTB, errors, determinism, CLI."""

from __future__ import annotations

import collections
import math
from pathlib import Path

import numpy as np
import pytest

from datamill.core.errors import CacheError, ConfigError, DataFileError
from datamill.pretrain.word2vec import SkipGramSamples, build_skipgram


@pytest.fixture(scope="module")
def ptb(data_dir: Path) -> SkipGramSamples:
    """Later d2l's pipeline: every <unk> dropped before subsampling."""
    return build_skipgram(
        f"{data_dir / 'ptb.zip'}:ptb/ptb.train.txt", seed=0, drop_unk=True, progress=False
    )


@pytest.fixture(scope="module")
def ptb_seed(data_dir: Path) -> SkipGramSamples:
    """The seed's pipeline (the default): <unk> subsampled like any word."""
    return build_skipgram(f"{data_dir / 'ptb.zip'}:ptb/ptb.train.txt", seed=0, progress=False)


def _ptb_text(data_dir: Path) -> str:
    import zipfile

    with zipfile.ZipFile(data_dir / "ptb.zip") as z:
        return z.read("ptb/ptb.train.txt").decode("utf-8")


def _kept_mean_sd(counts: np.ndarray, t: float) -> tuple[float, float]:
    """Expected kept tokens and their sd: a sum of independent Bernoulli(min(1, sqrt(t / f(w))))."""
    counts = counts[counts > 0].astype(float)
    p = np.minimum(1.0, np.sqrt(t / (counts / counts.sum())))
    return float((counts * p).sum()), math.sqrt(float((counts * p * (1 - p)).sum()))


def test_ptb_seed_subsampling_keeps_unk_and_matches_the_formula(
    ptb_seed: SkipGramSamples, data_dir: Path
) -> None:
    """The seed: rare words -> <unk>, then <unk> subsampled like any word, f(w) over all 887,521
    tokens."""
    text = _ptb_text(data_dir)
    counts = np.bincount(
        np.array(ptb_seed.vocab.encode(np.array(text.split()))), minlength=len(ptb_seed.vocab)
    )
    assert counts.sum() == 887_521 and ptb_seed.info["drop_unk"] is False
    mean, sd = _kept_mean_sd(counts, 1e-4)
    assert abs(mean - 354_144) < 1  # the figure the issue computes from the seed's formula
    kept = ptb_seed.info["tokens_after_subsampling"]
    assert abs(kept - mean) <= 4.5 * sd, (kept, mean, sd)  # binomial tolerance (sd ~ 330)
    # the seed's own runs kept 354,363 / 354,140 / 353,932: all inside the same band
    assert all(abs(x - mean) <= 4.5 * sd for x in (354_363, 354_140, 353_932))
    # <unk> (id 0) appears as a center, a context and a negative; negatives cover
    # range(len(counter))
    assert 0 in set(np.unique(ptb_seed.centers).tolist()) and (ptb_seed.contexts == 0).any()
    assert ptb_seed.negatives.min() == 0 and ptb_seed.negatives.max() < len(ptb_seed.vocab)
    unk_kept = int((ptb_seed.centers == 0).sum())
    p_unk = math.sqrt(1e-4 / (counts[0] / counts.sum()))
    assert unk_kept <= counts[0] * p_unk + 6 * math.sqrt(
        counts[0] * p_unk
    )  # <unk> was subsampled too


def test_ptb_drop_unk_keeps_the_old_behaviour(
    ptb: SkipGramSamples, ptb_seed: SkipGramSamples
) -> None:
    """drop_unk=True: fewer tokens kept (f over known tokens only), <unk> never seen."""
    assert ptb.info["tokens_after_subsampling"] < ptb_seed.info["tokens_after_subsampling"] - 5_000
    assert ptb.info["fingerprint"] != ptb_seed.info["fingerprint"]


def test_seed_tiny_dataset_contexts_are_in_sentence_within_window() -> None:
    """d2l: tiny_dataset = [list(range(7)), list(range(7, 10))], max window 2."""
    sentences = [[str(x) for x in range(7)], [str(x) for x in range(7, 10)]]
    for seed in range(20):
        s = build_skipgram(
            sentences,
            window=2,
            num_negatives=1,
            min_freq=1,
            subsample_t=1.0,
            seed=seed,
            progress=False,
        )
        v = s.vocab

        def tok(ids, v=v):  # type: ignore[no-untyped-def]
            return [int(t) for t in v.to_tokens(list(ids))]

        assert sorted(tok(s.centers)) == list(range(10))  # t=1 keeps every token (f <= 1)
        widths = set()
        for i in range(len(s)):
            center, ctx, _ = s.example(i)
            c, ctx_t = tok([center])[0], tok(ctx)
            sent = range(7) if c < 7 else range(7, 10)
            assert ctx_t and all(x in sent and x != c and abs(x - c) <= 2 for x in ctx_t), (
                c,
                ctx_t,
            )
            assert ctx_t == sorted(ctx_t)  # sentence order, no duplicates
            # contexts are exactly the window of some w in {1, 2}
            assert any(ctx_t == [x for x in sent if x != c and abs(x - c) <= w] for w in (1, 2)), (
                c,
                ctx_t,
            )
            widths.add(len(ctx_t))
        assert len(s.negatives) == len(s.contexts)


def _seed_counts(text: str, min_freq: int) -> tuple[int, int, int]:
    """The seed's read_ptb + Vocab(min_freq) + the <unk> filter of subsample, in plain Python."""
    sentences = [line.split() for line in text.split("\n")]
    counter = collections.Counter(t for line in sentences for t in line)
    kept = {t for t, c in counter.items() if c >= min_freq and t != "<unk>"}
    vocab_size = 1 + len(kept)  # '<unk>' first, then the frequent tokens
    return vocab_size, sum(counter.values()), sum(counter[t] for t in kept)


def test_ptb_vocab_and_token_counts_match_the_seed(ptb: SkipGramSamples, data_dir: Path) -> None:
    import zipfile

    with zipfile.ZipFile(data_dir / "ptb.zip") as z:
        text = z.read("ptb/ptb.train.txt").decode("utf-8")
    vocab_size, tokens, known = _seed_counts(text, 10)
    assert (vocab_size, tokens) == (
        6719,
        887521,
    )  # d2l prints "vocab size: 6719"; data README 887,521
    info = ptb.info
    assert (info["vocab_size"], info["tokens"], info["tokens_known"]) == (vocab_size, tokens, known)
    assert ptb.vocab.idx2str[0] == "<unk>" and ptb.vocab.unk_index == 0
    # after subsampling: a sum of independent Bernoulli(p_w); |kept - E| <= 6 sd (two-sided ~2e-9)
    counts = np.bincount(
        np.array(ptb.vocab.encode(np.array(text.split()))), minlength=len(ptb.vocab)
    )[1:]
    counts = counts[counts > 0].astype(float)
    p = np.minimum(1.0, np.sqrt(1e-4 / (counts / counts.sum())))
    mean, sd = float((counts * p).sum()), math.sqrt(float((counts * p * (1 - p)).sum()))
    assert abs(info["tokens_after_subsampling"] - mean) <= 6 * sd, (
        info["tokens_after_subsampling"],
        mean,
        sd,
    )
    # every kept token of a >= 2-token sentence is a center; pairs/negatives consistent
    assert len(ptb.contexts) == info["pairs"] and len(ptb.negatives) == 5 * info["pairs"]
    assert len(ptb) <= info["tokens_after_subsampling"] and 0 not in set(
        np.unique(ptb.centers).tolist()
    )
    np.testing.assert_array_equal(ptb.negative_offsets, 5 * ptb.context_offsets)


def test_ptb_no_negative_is_a_context_of_its_example(ptb: SkipGramSamples) -> None:
    n_ctx = np.diff(ptb.context_offsets)
    owner = np.repeat(np.arange(len(ptb)), n_ctx)
    # (example, token) keys, ordered by example already: a stable sort (timsort) only merges short
    # runs, and a binary search finds each negative's key; np.unique + np.isin sorted the 1.5M
    # context and 7.5M negative keys whole (8x slower: 32 s of a whole-suite run at load 9.5)
    ctx_keys = np.sort(owner.astype(np.int64) * len(ptb.vocab) + ptb.contexts, kind="stable")
    neg_owner = np.repeat(np.arange(len(ptb)), np.diff(ptb.negative_offsets))
    neg_keys = neg_owner.astype(np.int64) * len(ptb.vocab) + ptb.negatives
    at = np.minimum(np.searchsorted(ctx_keys, neg_keys), len(ctx_keys) - 1)
    assert not (ctx_keys[at] == neg_keys).any()  # no negative is a context of its example
    assert ptb.negatives.min() >= 1 and ptb.negatives.max() < len(ptb.vocab)  # never <unk>


def test_deterministic_for_a_seed() -> None:
    rng = np.random.default_rng(0)
    sentences = [[f"w{x}" for x in rng.integers(0, 40, size=12)] for _ in range(50)]
    kw = {"window": 3, "num_negatives": 3, "min_freq": 2, "subsample_t": 1e-2, "progress": False}
    a, b, c = (build_skipgram(sentences, seed=s, **kw) for s in (4, 4, 5))  # type: ignore[arg-type]
    for name in ("centers", "context_offsets", "contexts", "negatives"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    assert not (len(a.contexts) == len(c.contexts) and np.array_equal(a.negatives, c.negatives))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"window": 0}, "window"),
        ({"num_negatives": -1}, "num_negatives"),
        ({"min_freq": 0}, "min_freq"),
        ({"subsample_t": 0.0}, "subsample_t"),
        ({"window": 2.5}, "window"),
    ],
)
def test_bad_parameters(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        build_skipgram([["a", "b"]], progress=False, **{"min_freq": 1, **kwargs})  # type: ignore[arg-type]


def test_empty_corpus(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(DataFileError) as e:
        build_skipgram(empty, progress=False)
    assert e.value.path is not None and "empty.txt" in str(e.value.path)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n")
    with pytest.raises(DataFileError, match="empty") as e:
        build_skipgram(blank, progress=False)
    assert str(e.value.path).endswith("blank.txt")
    with pytest.raises(DataFileError, match="empty corpus") as e:
        build_skipgram([], progress=False)
    assert e.value.path == "<tokens>"


def test_token_lists_must_be_lists_of_strings() -> None:
    with pytest.raises(ConfigError, match="list of token lists"):
        build_skipgram(["a b c", "d e"], progress=False)  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="strings"):
        build_skipgram([[1, 2, 3]], progress=False)  # type: ignore[list-item]


def test_all_words_rare(tmp_path: Path) -> None:
    f = tmp_path / "rare.txt"
    f.write_text("a b c\nd e\n")
    with pytest.raises(DataFileError, match="min_freq") as e:
        build_skipgram(f, progress=False)
    assert str(e.value.path).endswith("rare.txt")


def test_no_sentence_of_two_tokens_after_subsampling() -> None:
    with pytest.raises(DataFileError, match="at least 2 tokens") as e:
        build_skipgram([["a"], ["b"], ["a"]], min_freq=1, subsample_t=1.0, progress=False)
    assert e.value.path == "<tokens>"


def test_load_refuses_an_unfinished_folder(tmp_path: Path) -> None:
    s = build_skipgram([["a", "b", "c"]] * 3, min_freq=1, subsample_t=1.0, progress=False)
    s.save(tmp_path / "out")
    (tmp_path / "out" / "skipgram.json").unlink()  # as if killed before the commit marker
    with pytest.raises(CacheError) as e:
        SkipGramSamples.load(tmp_path / "out")
    assert e.value.path is not None and str(e.value.path).endswith("out")


def test_cli_prints_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from datamill.cli import main

    f = tmp_path / "c.txt"
    f.write_text("\n".join(["the cat sat on the mat", "the dog sat"] * 20))
    assert (
        main(
            ["-q", "word2vec", str(f), "--out", str(tmp_path / "o"), "--min-freq", "1", "--t", "1"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "vocab size 7" in out and "after subsampling" in out and "pairs" in out and " s" in out
    assert SkipGramSamples.load(tmp_path / "o").info["tokens"] == 180
    # the API's names, --quiet after the command, old spellings as aliases
    assert (
        main(
            [
                "word2vec",
                str(f),
                "--out",
                str(tmp_path / "n"),
                "--min-freq",
                "1",
                "--subsample-t",
                "1",
                "--num-negatives",
                "3",
                "--drop-unk",
                "--negative-counts",
                "before_subsampling",
                "--quiet",
            ]
        )
        == 0
    )
    info = SkipGramSamples.load(tmp_path / "n").info
    assert (info["subsample_t"], info["num_negatives"], info["drop_unk"]) == (1, 3, True)
    assert info["negative_counts"] == "before_subsampling" and "known" in capsys.readouterr().out
    assert (
        main(
            [
                "word2vec",
                str(f),
                "--out",
                str(tmp_path / "a"),
                "--min-freq",
                "1",
                "--t",
                "1",
                "--negatives",
                "3",
                "-q",
            ]
        )
        == 0
    )
    assert SkipGramSamples.load(tmp_path / "a").info["num_negatives"] == 3
    assert main(["word2vec", str(f), "--out", str(tmp_path / "o2"), "--negatives", "-1"]) == 2


@pytest.mark.parametrize("drop_unk", [False, True])
@pytest.mark.parametrize(
    ("mode", "total_key"),
    [("subsampled", "tokens_after_subsampling"), ("before_subsampling", "tokens_known")],
)
def test_negative_weights_come_from_the_chosen_counts(
    mode: str, total_key: str, drop_unk: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negatives are drawn from count**0.75: counts after subsampling by default, before on
    request."""
    from datamill.pretrain.word2vec import _build as w2v

    seen: list[np.ndarray] = []

    class Recording(w2v.AliasTable):  # type: ignore[misc, name-defined]  # records the weights it is built with
        def __init__(self, weights: np.ndarray, **kw: object) -> None:
            seen.append(weights)
            super().__init__(weights, **kw)

    monkeypatch.setattr(w2v, "AliasTable", Recording)
    rng = np.random.default_rng(0)
    sentences = [[f"w{int(i)}" for i in rng.zipf(1.5, size=12).clip(max=300)] for _ in range(2_000)]
    s = build_skipgram(
        sentences,
        window=2,
        num_negatives=2,
        min_freq=3,
        subsample_t=1e-3,
        seed=1,
        negative_counts=mode,
        drop_unk=drop_unk,
        progress=False,
    )  # type: ignore[arg-type]
    counts = np.rint(seen[0] ** (1 / 0.75))
    tokens = (
        s.info["tokens"] if mode == "before_subsampling" and not drop_unk else s.info[total_key]
    )
    assert counts.sum() == tokens
    assert (
        s.info["tokens_after_subsampling"] < s.info["tokens_known"]
    )  # the two modes really differ
    if drop_unk:  # later d2l: range(1, len(vocab))
        assert len(seen[0]) == len(s.vocab) - 1 and s.negatives.min() >= 1
    else:  # the seed: range(len(counter)), <unk> = id 0 included
        assert len(seen[0]) == len(s.vocab) and seen[0][0] > 0


def test_negative_counts_seed_is_a_deprecated_alias() -> None:
    kw = {
        "window": 2,
        "num_negatives": 2,
        "min_freq": 1,
        "subsample_t": 1e-2,
        "seed": 3,
        "progress": False,
    }
    sentences = [["a", "b", "c", "a"], ["b", "c", "d"]] * 30
    with pytest.warns(DeprecationWarning, match="before_subsampling"):
        old = build_skipgram(sentences, negative_counts="seed", **kw)  # type: ignore[arg-type]
    new = build_skipgram(sentences, negative_counts="before_subsampling", **kw)  # type: ignore[arg-type]
    np.testing.assert_array_equal(old.negatives, new.negatives)
    assert (
        old.info["negative_counts"] == "before_subsampling"
        and old.fingerprint() == new.fingerprint()
    )


def test_unknown_negative_counts_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="negative_counts"):
        build_skipgram([["a", "b"]], min_freq=1, negative_counts="after", progress=False)  # type: ignore[arg-type]
