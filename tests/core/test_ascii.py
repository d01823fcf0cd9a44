"""datamill.core.ascii: byte tables, the splitters and token_dictionary, each against plain
Python."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.core.ascii import (
    ASCII_LOWER,
    ASCII_WHITESPACE,
    MAX_KEY_BYTES,
    ascii_char_codes,
    ascii_token_spans,
    ascii_words,
    token_dictionary,
)

_tokens = st.lists(
    st.text(st.characters(min_codepoint=1, max_codepoint=127), min_size=1, max_size=MAX_KEY_BYTES),
    min_size=0,
    max_size=60,
)


def _layout(tokens: list[str], gap: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens laid out in one buffer (separated by ``gap``), with their starts and lengths."""
    buf, starts, lengths = bytearray(), [], []
    for t in tokens:
        starts.append(len(buf))
        lengths.append(len(t))
        buf += t.encode() + gap
    return (
        np.frombuffer(bytes(buf), np.uint8),
        np.array(starts, np.int64),
        np.array(lengths, np.int64),
    )


@settings(max_examples=200, deadline=None)
@given(tokens=_tokens, gap=st.sampled_from([b"", b" ", b"\x7f\x7f\x7f"]), reverse=st.booleans())
def test_dictionary_round_trip(tokens: list[str], gap: bytes, reverse: bool) -> None:
    """dictionary[indices] gives back every token; the dictionary holds each distinct token once."""
    data, starts, lengths = _layout(tokens, gap)
    if reverse:  # starts need not be sorted
        starts, lengths = starts[::-1].copy(), lengths[::-1].copy()
        tokens = tokens[::-1]
    out = token_dictionary(data, starts, lengths)
    assert out is not None
    dictionary, indices = out
    assert indices.dtype == np.int32
    assert dictionary.take(indices).to_pylist() == tokens
    assert sorted(dictionary.to_pylist()) == sorted(set(tokens))


def test_shared_prefixes_and_the_end_of_the_buffer() -> None:
    """Tokens sharing their first 8 bytes, 8-byte boundaries, and a token ending the buffer."""
    tokens = [
        "abcdefgh",
        "abcdefghi",
        "abcdefghij",
        "abcdefgh",
        "a" * 16,
        "a" * 17,
        "a" * 8,
        "x",
        "abcdefghi",
    ]
    data, starts, lengths = _layout(tokens, b"")
    out = token_dictionary(data, starts, lengths)
    assert out is not None
    assert out[0].take(out[1]).to_pylist() == tokens
    assert len(out[0]) == 7


def test_string_path_left_to_the_caller() -> None:
    """Too-long tokens and NUL bytes (keys are zero-padded) give None; no tokens give an empty
    dictionary."""
    data, starts, lengths = _layout(["a" * (MAX_KEY_BYTES + 1)], b" ")
    assert token_dictionary(data, starts, lengths) is None
    data, starts, lengths = _layout(["a\x00", "a"], b" ")
    assert token_dictionary(data, starts, lengths) is None
    dictionary, indices = token_dictionary(
        np.zeros(0, np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int64)
    ) or (None, None)
    assert dictionary is not None and len(dictionary) == 0 and len(indices) == 0


@pytest.mark.parametrize("n", [1, 7, 8, 9])
def test_buffer_shorter_than_a_word(n: int) -> None:
    data, starts, lengths = _layout(["q" * n], b"")
    out = token_dictionary(data, starts, lengths)
    assert out is not None and out[0].to_pylist() == ["q" * n]


# ---------------------------------------------------------------- the splitters (moved from
# text/_ascii)


# ASCII text mixing words, every str.split() whitespace byte, punctuation and control bytes
# (kept here, not in tests/strategies.py, which this branch does not own)
ascii_text = st.text(
    st.sampled_from(list("ab Z_9\t\n\r\x0b\x0c\x1c\x1f.,!-'\x01\x7f")), max_size=80
)


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines


def test_byte_tables_are_str_methods() -> None:
    assert [bool(ASCII_WHITESPACE[i]) for i in range(128)] == [chr(i).isspace() for i in range(128)]
    assert bytes(ASCII_LOWER[:128]) == bytes(range(128)).decode().lower().encode()


@given(text=ascii_text, lowercase=st.booleans())
def test_ascii_words_are_str_split_per_line(text: str, lowercase: bool) -> None:
    words, offsets = ascii_words(text.encode(), lowercase=lowercase)
    flat = words.dictionary.take(words.indices).to_pylist()
    want = [(line.lower() if lowercase else line).split() for line in _lines(text)] or [[]]
    assert [flat[a:b] for a, b in itertools.pairwise(offsets)] == want


@given(text=ascii_text, lowercase=st.booleans(), one_document=st.booleans())
def test_ascii_char_codes_fold_into_the_canon_table(
    text: str, lowercase: bool, one_document: bool
) -> None:
    codes, offsets, canon = ascii_char_codes(
        text.encode(), lowercase=lowercase, one_document=one_document
    )
    got = [bytes(canon[codes[a:b]]).decode() for a, b in itertools.pairwise(offsets)]
    norm = text.lower() if lowercase else text
    if one_document:
        assert got == [" ".join(" ".join(norm.split("\n")).split())]
    else:
        assert got == [line.removesuffix("\r") for line in _lines(norm)] or got == [""]


@given(rows=st.lists(ascii_text, max_size=6), punct=st.booleans())
def test_ascii_token_spans_are_the_tokenizers(rows: list[str], punct: bool) -> None:
    data = np.frombuffer("".join(rows).encode(), np.uint8)
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    starts, lengths, tok_off = ascii_token_spans(data, offsets, punct=punct)
    tokens = [bytes(data[s : s + n]).decode() for s, n in zip(starts, lengths, strict=True)]
    got = [tokens[a:b] for a, b in itertools.pairwise(tok_off)]
    want = [
        re.findall(r"\w+|[^\w\s\x1c-\x1f]", r, flags=re.ASCII) if punct else r.split() for r in rows
    ]
    assert got == want
