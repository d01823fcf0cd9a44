"""word2vec invariants on random corpora (hypothesis): tokenizer = str.split(), windows = the
seed's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.errors import DataFileError, DataFileNotFoundError
from datamill.pretrain.word2vec import build_skipgram
from datamill.pretrain.word2vec._sample import split_lines

_CHARS = st.sampled_from(
    list("ab<>'. \n\t\r\x0b\x0c\x1c\x1f\x01") + ["é", "\u00a0", "\u2028", "\u3000"]
)


@given(st.lists(_CHARS, max_size=60).map("".join))
def test_split_lines_equals_python_split(text: str) -> None:
    want = [line.split() for line in text.split("\n")]
    for data in (text, text.encode("utf-8")):
        tokens, offsets = split_lines(data)
        assert tokens.to_pylist() == [t for line in want for t in line]
        assert np.diff(offsets).tolist() == [len(line) for line in want]


@given(
    sentences=st.lists(st.lists(st.integers(0, 6), max_size=9), min_size=1, max_size=12),
    window=st.integers(1, 4),
    seed=st.integers(0, 2**32),
)
def test_centers_and_contexts_are_the_seeds(
    sentences: list[list[int]], window: int, seed: int
) -> None:
    """With t large nothing is dropped: centers are every token of the >= 2-token sentences, in
    order, and each context list is the sentence window of some w in 1..window around its center."""
    words = [[f"w{x}" for x in s] for s in sentences]
    if not any(len(s) >= 2 for s in words):
        with pytest.raises(DataFileError):
            build_skipgram(
                words, window=window, min_freq=1, subsample_t=1e9, seed=seed, progress=False
            )
        return
    s = build_skipgram(
        words,
        window=window,
        num_negatives=0,
        min_freq=1,
        subsample_t=1e9,
        seed=seed,
        progress=False,
    )
    positions = [
        (si, i) for si, sent in enumerate(words) if len(sent) >= 2 for i in range(len(sent))
    ]
    assert len(s) == len(positions) and len(s.negatives) == 0
    for e, (si, i) in enumerate(positions):
        sent = s.vocab[words[si]]
        center, ctx, _ = s.example(e)
        assert center == sent[i]
        windows = [sent[max(0, i - w) : i] + sent[i + 1 : i + 1 + w] for w in range(1, window + 1)]
        assert ctx in windows, (sent, i, ctx)


def test_non_utf8_input_names_the_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.txt"
    f.write_bytes(b"a b c\nd \xff e\n")
    with pytest.raises(DataFileError) as e:
        build_skipgram(f, min_freq=1, progress=False)
    assert e.value.line == 2 and str(e.value.path).endswith("bad.txt")


def test_missing_zip_member(data_dir: Path) -> None:
    with pytest.raises(DataFileNotFoundError) as e:
        build_skipgram(f"{data_dir / 'ptb.zip'}:ptb/nope.txt", progress=False)
    assert e.value.path is not None and "ptb.zip" in str(e.value.path)


def test_demo_runs(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from datamill.pretrain.word2vec import demo as demo_word2vec

    demo_word2vec.run(data_dir, tmp_path)
    out = capsys.readouterr().out
    assert "vocab 6,719" in out and "contexts_negatives  (512, " in out and "example: center" in out
    assert len(out.splitlines()) <= 25
