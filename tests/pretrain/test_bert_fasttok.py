"""The vectorised WordPiece path gives exactly the library's ids (WikiText, random Unicode text)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.pretrain.bert._docs import split_documents
from datamill.pretrain.bert._tok import BertTokenizer, train_wordpiece

_TOK: dict[bool, BertTokenizer] = {}


def tokenizer(data_dir: Path, *, lowercase: bool = True) -> BertTokenizer:
    if lowercase not in _TOK:
        lines = (data_dir / "wikitext2_test.raw").read_text("utf-8").splitlines()[:600]
        _TOK[lowercase] = train_wordpiece(
            [ln.strip() for ln in lines if ln.strip()], vocab_size=600, lowercase=lowercase
        )
    return _TOK[lowercase]


@pytest.mark.parametrize("lowercase", [True, False])
def test_fast_path_is_used_and_exact_on_wikitext(data_dir: Path, lowercase: bool) -> None:
    tok = tokenizer(data_dir, lowercase=lowercase)
    assert tok.fast is not None
    sentences, _ = split_documents([data_dir / "wikitext2_test.raw"])
    got = tok.encode(sentences)
    want = tok.encode_library(sentences)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


ALPHABET = st.sampled_from(
    list("abcXYZ019 .,;:!?'\"-()[]{}<>@#$%^&*_+=/\\|`~\t")
    + [
        "\x00",
        "\x07",
        "\x0b",
        "\x0c",
        "\x1f",
        "\x7f",
        "\u00a0",
        "\u2003",
        "\u200b",
        "\u0301",
        "é",
        "Å",
        "ß",
        "İ",
        "\u037e",
        "\u1fef",
        "\u212a",
        "–",
        "—",
        "…",
        "«",
        "»",
        "中",
        "文",
        "\u3000",
        "\ufffd",
        "😀",
        "ﬁ",
        "Ⅻ",
        "[SEP]",
        "[MASK]",
        "[sep]",
        "##",
        "x" * 120,
    ]
)


@given(
    texts=st.lists(st.lists(ALPHABET, max_size=25).map("".join), min_size=1, max_size=12),
    lowercase=st.booleans(),
)
def test_fast_path_equals_library_on_random_unicode(
    data_dir: Path, texts: list[str], lowercase: bool
) -> None:
    tok = tokenizer(data_dir, lowercase=lowercase)  # data_dir is session-scoped: fine with @given
    got = tok.encode(texts)
    want = tok.encode_library(texts)
    assert got[1].tolist() == want[1].tolist()
    assert got[0].tolist() == want[0].tolist()


def test_other_tokenizers_use_the_library(data_dir: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    inner = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    inner.train_from_iterator(
        ["the cat sat on the mat"] * 3,
        trainers.WordPieceTrainer(
            vocab_size=40,
            special_tokens=["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"],
            show_progress=False,
        ),
    )
    tok = BertTokenizer.wrap(inner)
    assert tok.fast is None  # a Whitespace pre-tokenizer: the fast path would not be exact
    flat, offsets = tok.encode(["the cat", "sat"])
    assert flat.tolist() == inner.encode("the cat").ids + inner.encode("sat").ids
    assert offsets.tolist() == [0, len(inner.encode("the cat").ids), len(flat)]


def test_word_cache_across_chunks_gives_the_same_ids(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datamill.pretrain.bert import _tok as _bert_tok

    tok = tokenizer(data_dir)
    sentences, _ = split_documents([data_dir / "wikitext2_test.raw"])
    want = tok.encode_library(sentences)
    monkeypatch.setattr(_bert_tok, "_FAST_CHUNK_BYTES", 50_000)  # ~27 chunks sharing one cache
    got = tok.encode(sentences)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


@given(
    st.lists(st.text(alphabet=st.sampled_from("ab.[]()*+?|\\^$ {}é中-"), max_size=12), max_size=20),
    st.lists(
        st.text(alphabet=st.sampled_from("ab.[]()*+?|\\^$ {}é中-"), min_size=1, max_size=5),
        min_size=1,
        max_size=4,
    ),
)
def test_added_pattern_finds_exactly_the_lines_holding_an_added_text(
    lines: list[str], added: list[str]
) -> None:
    """The one regular expression that sends lines with an added token's text to the library
    matches a line iff one of the texts is a substring of it (regex characters taken literally)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from datamill.pretrain.bert._fasttok import added_pattern

    got = pc.match_substring_regex(
        pa.array(lines, pa.large_string()), added_pattern(added)
    ).to_pylist()
    assert got == [any(a in line for a in added) for line in lines]


def test_blocks_encoded_in_threads_with_added_token_lines(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many blocks, encoded two at a time, each with lines that hold an added token's text (those
    go through the library whole, from both threads): the ids are the library's."""
    from datamill.pretrain.bert import _tok as _bert_tok

    tok = tokenizer(data_dir)
    sentences, _ = split_documents([data_dir / "wikitext2_test.raw"])
    lines = sentences.to_pylist()[:3000]
    lines = [
        f"{ln} [SEP] x" if i % 7 == 0 else f"[MASK]{ln}" if i % 11 == 0 else ln
        for i, ln in enumerate(lines)
    ]
    monkeypatch.setattr(_bert_tok, "_FAST_CHUNK_BYTES", 20_000)  # ~20 blocks
    got = tok.encode(lines)
    want = tok.encode_library(lines)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
