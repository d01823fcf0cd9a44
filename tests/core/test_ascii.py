"""datamill.core.ascii.token_dictionary: exact integer keys of token bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.core.ascii import MAX_KEY_BYTES, token_dictionary

_tokens = st.lists(st.text(st.characters(min_codepoint=1, max_codepoint=127), min_size=1, max_size=MAX_KEY_BYTES),
                   min_size=0, max_size=60)


def _layout(tokens: list[str], gap: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens laid out in one buffer (separated by ``gap``), with their starts and lengths."""
    buf, starts, lengths = bytearray(), [], []
    for t in tokens:
        starts.append(len(buf))
        lengths.append(len(t))
        buf += t.encode() + gap
    return np.frombuffer(bytes(buf), np.uint8), np.array(starts, np.int64), np.array(lengths, np.int64)


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
    tokens = ["abcdefgh", "abcdefghi", "abcdefghij", "abcdefgh", "a" * 16, "a" * 17, "a" * 8, "x", "abcdefghi"]
    data, starts, lengths = _layout(tokens, b"")
    out = token_dictionary(data, starts, lengths)
    assert out is not None
    assert out[0].take(out[1]).to_pylist() == tokens
    assert len(out[0]) == 7


def test_string_path_left_to_the_caller() -> None:
    """Too-long tokens and NUL bytes (keys are zero-padded) give None; no tokens give an empty dictionary."""
    data, starts, lengths = _layout(["a" * (MAX_KEY_BYTES + 1)], b" ")
    assert token_dictionary(data, starts, lengths) is None
    data, starts, lengths = _layout(["a\x00", "a"], b" ")
    assert token_dictionary(data, starts, lengths) is None
    dictionary, indices = token_dictionary(np.zeros(0, np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int64)) or (None, None)
    assert dictionary is not None and len(dictionary) == 0 and len(indices) == 0


@pytest.mark.parametrize("n", [1, 7, 8, 9])
def test_buffer_shorter_than_a_word(n: int) -> None:
    data, starts, lengths = _layout(["q" * n], b"")
    out = token_dictionary(data, starts, lengths)
    assert out is not None and out[0].to_pylist() == ["q" * n]
