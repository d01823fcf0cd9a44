"""Corpora: the seed's Time Machine figures, PTB, vocab options, round trips, files, CLI, Source,
errors."""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.cli import main
from datamill.core.errors import ConfigError, DataFileError, DataFileNotFoundError
from datamill.core.source import Source
from datamill.loader import Batching
from datamill.text import Corpus, CorpusSource, VocabLimits, build_corpus, build_vocab


def test_timemachine_seed_normalisation_178605_chars_44_distinct(data_dir: Path) -> None:
    lines = (data_dir / "timemachine.txt").read_text(encoding="utf-8").splitlines()
    seed = " ".join(" ".join(lines).lower().split())
    c = build_corpus(
        data_dir / "timemachine.txt", level="char", lowercase=True, collapse_whitespace=True
    )
    assert len(c) == len(seed) == 178_605
    assert len(c.vocab) == 45 and c.vocab.idx2str[0] == "<unk>"  # <unk> + 44 distinct characters
    assert c.decode(c.tokens) == seed and c.tokens.dtype == np.uint16
    counts = Counter(seed)
    assert [c.vocab.str2freq[t] for t in c.vocab.idx2str[1:]] == sorted(
        counts.values(), reverse=True
    )


def test_timemachine_d2l_letters_only_gives_28(data_dir: Path) -> None:
    # the other d2l version: re.sub('[^A-Za-z]+', ' ', line).strip().lower() -> 26 letters + space
    # (+ <unk>)
    lines = [
        re.sub("[^A-Za-z]+", " ", x).strip().lower()
        for x in (data_dir / "timemachine.txt").read_text(encoding="utf-8").splitlines()
    ]
    v = build_vocab(lines, level="char")
    assert len(v) == 28


def test_ptb_word_corpus_from_zip_member(data_dir: Path) -> None:
    c = build_corpus(
        f"{data_dir / 'ptb.zip'}:ptb/ptb.train.txt", level="word", vocab=VocabLimits(min_freq=10)
    )
    assert (
        len(c) == 887_521 and c.num_lines == 42_068 and len(c.vocab) == 6_719
    )  # the word2vec chapter's figures
    assert c.decode(c.line(1)).startswith("<unk> <unk> N years old will join")  # pierre < 10 times


def test_vocab_options_like_seed() -> None:
    texts = ["a a a b b c", "d"]
    v = build_vocab(texts, min_freq=2, reserved_tokens=["<pad>", "<bos>"])
    assert v.idx2str == ["<unk>", "<pad>", "<bos>", "a", "b"]
    assert v[["a", "c", "zzz"]] == [3, 0, 0]
    assert build_vocab(texts, max_size=1).idx2str == ["<unk>", "a"]
    np.testing.assert_array_equal(v[np.array(["b", "d"])], [4, 0])
    c = build_corpus(texts, level="word", vocab=VocabLimits(min_freq=2))
    assert c.tokens.tolist() == [1, 1, 1, 2, 2, 0, 0] and c.offsets.tolist() == [0, 6, 7]
    with pytest.raises(ConfigError):
        build_vocab(texts, min_freq=-1)
    with pytest.raises(ConfigError):
        build_corpus(texts, level="sentence")  # type: ignore[arg-type]


@given(
    st.lists(
        st.text(st.characters(exclude_categories=["Cs"]), max_size=20), min_size=1, max_size=10
    ),
    st.sampled_from(["char", "word"]),
)
def test_encode_decode_round_trip(texts: list[str], level: str) -> None:
    if not "".join(t if level == "char" else " ".join(t.split()) for t in texts):
        with pytest.raises(DataFileError):
            build_corpus(texts, level=level)  # type: ignore[arg-type]
        return
    c = build_corpus(texts, level=level)  # type: ignore[arg-type]
    for i, t in enumerate(texts):
        want = t if level == "char" else " ".join(t.split())
        assert c.decode(c.line(i)) == want
    with tempfile.TemporaryDirectory() as tmp:
        c.save(Path(tmp) / "c")
        d = Corpus.load(Path(tmp) / "c")
        np.testing.assert_array_equal(d.tokens, c.tokens)
        assert d.vocab == c.vocab and d.fingerprint() == c.fingerprint()


def test_save_load_memory_mapped_and_int32_when_large(tmp_path: Path) -> None:
    words = [f"w{i}" for i in range(70_000)]
    c = build_corpus([" ".join(words)], level="word", out=tmp_path / "big")
    assert c.tokens.dtype == np.int32
    d = Corpus.load(tmp_path / "big")
    assert isinstance(d.tokens.base, np.memmap) or isinstance(d.tokens, np.memmap)
    assert sorted(p.name for p in (tmp_path / "big").iterdir()) == [
        "corpus.json",
        "offsets.npy",
        "tokens.npy",
        "vocab.json",
    ]
    # regression: the old check `... or len(set(tokens)) == 70_000` was true by construction
    assert d.decode(d.tokens[:3]) == "w0 w1 w2" and d.tokens[:3].tolist() == [
        1,
        2,
        11_113,
    ]  # ties by token text
    assert d.vocab.idx2str[:4] == ["<unk>", "w0", "w1", "w10"]
    np.testing.assert_array_equal(d.tokens, c.tokens)


def test_bpe_and_wordpiece_levels(data_dir: Path, tmp_path: Path) -> None:
    c = build_corpus(
        data_dir / "wikitext2_test.raw", level="wordpiece", vocab_size=500, out=tmp_path / "wp"
    )
    d = Corpus.load(tmp_path / "wp")
    assert (
        d.tokenizer is not None and d.vocab is not None and len(d.vocab) == d.tokenizer.vocab_size
    )
    assert d.decode(d.line(1)).startswith("Robert Boulter is an English film")
    assert c.vocab.unk_token == "[UNK]"


def test_bad_inputs(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n", encoding="utf-8")
    with pytest.raises(DataFileError) as ei:
        build_corpus(empty, level="char")
    assert Path(ei.value.path).name == "empty.txt"  # type: ignore[attr-defined]
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"ok line\ncaf\xe9\n")
    with pytest.raises(DataFileError) as ei:
        build_corpus(latin, level="word")
    assert ei.value.line == 2  # type: ignore[attr-defined]
    with pytest.raises(DataFileNotFoundError):
        build_corpus(tmp_path / "missing.txt")
    with pytest.raises(DataFileNotFoundError):
        Corpus.load(tmp_path)  # no corpus.json: not a corpus / unfinished write
    with pytest.raises(DataFileError):
        CorpusSource(Corpus(np.arange(3)), num_steps=5)


def test_corpus_source_for_the_loader(tmp_path: Path) -> None:
    build_corpus(["abcdefghijklmnopqrstuvwxyz"], level="char", out=tmp_path / "c")
    src = CorpusSource(tmp_path / "c", num_steps=4, shard_size=4)
    assert isinstance(src, Source) and src.columns == ["x", "y"]
    assert src.shard_sizes().tolist() == [4, 2]
    t = src.read_shard(1)
    x, y = np.array(t["x"].to_pylist()), np.array(t["y"].to_pylist())
    assert x.shape == (2, 4) and (y[:, :-1] == x[:, 1:]).all()
    c = Corpus.load(tmp_path / "c")
    assert c.decode(x[0]) == "qrst"
    assert src.fingerprint() == CorpusSource(c, num_steps=4, shard_size=4).fingerprint()
    assert src.read_shard(0, columns=["y"]).column_names == ["y"]


def test_cli_corpus(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "corpus",
            str(data_dir / "timemachine.txt"),
            "--level",
            "char",
            "--lowercase",
            "--collapse-whitespace",
            "--out",
            str(tmp_path / "tm"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "178,605 tokens" in out and "vocab size 45" in out
    assert (tmp_path / "tm" / "corpus.json").exists()
    rc = main(["corpus", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "x")])
    assert rc == 2 and not (tmp_path / "x").exists()
    # the API's parameter names as flags (old spelling --reserved kept), --quiet after the command
    for flag in ("--reserved-tokens", "--reserved"):
        rc = main(
            [
                "corpus",
                str(data_dir / "timemachine.txt"),
                "--level",
                "word",
                flag,
                "<pad>,<bos>",
                "--unk-token",
                "<UNK>",
                "--min-freq",
                "3",
                "--out",
                str(tmp_path / flag),
                "--quiet",
            ]
        )
        assert rc == 0
        assert Corpus.load(tmp_path / flag).vocab.idx2str[:3] == ["<UNK>", "<pad>", "<bos>"]


@given(
    st.text(st.sampled_from(list("aB z\t\n\r\x0b\x1c.!Q")), max_size=60),
    st.booleans(),
    st.booleans(),
)
def test_ascii_file_fast_path_equals_arrow_path(text: str, lower: bool, collapse: bool) -> None:
    lines = text.split("\n")
    if text.endswith("\n"):
        lines = lines[:-1]
    lines = [x.removesuffix("\r") for x in lines]
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "t.txt"
        p.write_bytes(text.encode())
        # a blank file (bytes.strip(): ASCII whitespace) is empty input; a text without tokens too
        if not text.encode().strip() or (collapse and not text.split()):
            with pytest.raises(DataFileError):
                build_corpus(p, level="char", lowercase=lower, collapse_whitespace=collapse)
            return
        fast = build_corpus(p, level="char", lowercase=lower, collapse_whitespace=collapse)
    slow = build_corpus(lines, level="char", lowercase=lower, collapse_whitespace=collapse)
    assert fast.vocab == slow.vocab
    np.testing.assert_array_equal(fast.tokens, slow.tokens)
    np.testing.assert_array_equal(fast.offsets, slow.offsets)
    if collapse:
        assert fast.decode(fast.tokens) == " ".join(
            " ".join(lines).lower().split() if lower else " ".join(lines).split()
        )


@given(
    st.text(st.sampled_from(list("ab Bz\t\n\r\x0b\x0c\x1c\x1f\x01\x1b\x7f.")), max_size=60),
    st.booleans(),
)
def test_ascii_word_fast_path_equals_arrow_path(text: str, lower: bool) -> None:
    lines = text.split("\n")
    if text.endswith("\n"):
        lines = lines[:-1]
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "t.txt"
        p.write_bytes(text.encode())
        if not text.split():
            with pytest.raises(DataFileError):
                build_corpus(p, level="word", lowercase=lower)
            return
        fast = build_corpus(p, level="word", lowercase=lower)
    slow = build_corpus(lines, level="word", lowercase=lower)
    assert fast.vocab == slow.vocab
    np.testing.assert_array_equal(fast.tokens, slow.tokens)
    np.testing.assert_array_equal(fast.offsets, slow.offsets)
    assert fast.num_lines == len(lines)


def test_loader_reads_corpus_source(tmp_path: Path) -> None:
    from datamill.loader import Loader

    build_corpus([" ".join(f"w{i % 50}" for i in range(2000))], level="word", out=tmp_path / "c")
    src = CorpusSource(tmp_path / "c", num_steps=10, shard_size=64)
    batches = list(Loader(src, 16, seed=1, batching=Batching(drop_last=True)))
    assert len(batches) == 199 // 16
    for b in batches:
        x, y = np.asarray(b["x"]), np.asarray(b["y"])
        assert x.shape == (16, 10) and (y[:, :-1] == x[:, 1:]).all()
