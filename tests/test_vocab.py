"""The one Vocab: frequency order, tie rule, specials, min_freq/max_size, vectorised round-trip."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill import Vocab
from datamill.core.errors import CacheError, ConfigError
from datamill.vocab import count_tokens

tokens_st = st.lists(st.text(alphabet="abcdé日 ", min_size=1, max_size=4), min_size=0, max_size=200)


@given(tokens=tokens_st, min_freq=st.integers(1, 3), max_size=st.none() | st.integers(0, 20))
def test_vocab_order_and_round_trip(tokens: list[str], min_freq: int, max_size: int | None) -> None:
    v = Vocab.build(tokens, min_freq=min_freq, max_size=max_size)
    assert v.idx2str[:2] == ["<PAD>", "<UNK>"]
    counts = Counter(tokens)
    regular = v.idx2str[2:]
    # frequency descending, ties by token ascending, min_freq and max_size honoured
    expected = sorted(
        (t for t, c in counts.items() if c >= min_freq and t not in ("<PAD>", "<UNK>")),
        key=lambda t: (-counts[t], t),
    )
    if max_size is not None:
        expected = expected[:max_size]
    assert regular == expected
    assert all(v.str2freq[t] == counts[t] for t in regular)
    ids = v.encode(np.array(tokens, dtype=object))
    assert ids.dtype == np.int32 and ids.shape == (len(tokens),)
    kept = set(regular)
    decoded = v.decode(ids).tolist()
    assert decoded == [t if t in kept else "<UNK>" for t in tokens]
    assert Vocab.from_dict(json.loads(json.dumps(v.to_dict()))) == v


@given(a=tokens_st, b=tokens_st)
def test_counts_merge_equals_one_pass(a: list[str], b: list[str]) -> None:
    merged = Vocab.from_counts(count_tokens(a).merge(count_tokens(b)))
    assert merged == Vocab.build(a + b)


def test_d2l_style_lookup_and_save(tmp_path: Path) -> None:
    v = Vocab.build(list("hello world"), specials=["<unk>"], unk_token="<unk>")
    assert v["l"] == 1 and v[["l", "?"]] == [1, 0]
    assert v.to_tokens(1) == "l" and v.to_tokens([1, 2]) == ["l", "o"]
    np.testing.assert_array_equal(v[pa.array(["l", None])], [1, 0])
    v.save(tmp_path / "v.json")
    assert Vocab.load(tmp_path / "v.json") == v
    data = json.loads((tmp_path / "v.json").read_text())
    assert set(data) >= {"idx2str", "str2idx", "str2freq", "vocab_size"}


def test_vocab_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Vocab.build(["a"], min_freq=0)
    with pytest.raises(ConfigError):
        Vocab(["a", "a"])
    strict = Vocab(["a", "b"])
    with pytest.raises(KeyError):
        strict.encode(["c"])
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(CacheError):
        Vocab.load(tmp_path / "bad.json")
