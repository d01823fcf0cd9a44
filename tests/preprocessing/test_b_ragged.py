"""set / bag / sequence / text / timeseries handlers, driven directly: fit → merge → finalize →
transform."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.errors import ConfigError, DataFileError
from datamill.core.ragged import pad
from datamill.preprocessing.features import CSR, FeatureContext, get_handler
from datamill.preprocessing.features._ragged import STOPWORDS, split_tokens
from datamill.preprocessing.features.text import Handler as TextHandler
from datamill.vocab import Vocab

CTX = FeatureContext(name="f", column="col", path="data.csv", base_dir=None, line_offset=2)

tokens = st.sampled_from(["a", "b", "c", "dd", "é", "x1", "zz"])
rows_of_tokens = st.lists(st.lists(tokens, max_size=6), min_size=1, max_size=30)


def run(
    type_name: str,
    values: list[str],
    *,
    split: int | None = None,
    ctx: FeatureContext = CTX,
    **params: Any,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fit on two blocks (merged), finalize, transform everything."""
    h = get_handler(type_name)
    p = h.Params(**params)
    col = pa.array(values, pa.string())
    k = len(values) // 2 if split is None else split
    stats = h.merge(h.fit(col[:k], p, ctx), h.fit(col[k:], p, ctx))
    meta = h.finalize(stats, p, ctx)
    return meta, h.transform(col, meta, p, ctx)


def as_dense(x: Any, n: int) -> np.ndarray:
    if not isinstance(x, CSR):
        return np.asarray(x)
    out = np.zeros((n, x.vocab_size), np.float32)
    rows = np.repeat(np.arange(n), np.diff(x.offsets))
    out[rows, x.indices] = 1 if x.values is None else x.values
    return out


# -- tokenising -----------------------------------------------------------------------------------
def test_split_tokens_names() -> None:
    col = pa.array(["Hi, there!  you", "", "a,b , c"])
    assert split_tokens(col, "space").values.to_pylist() == [
        "Hi,",
        "there!",
        "you",
        "a,b",
        ",",
        "c",
    ]
    assert split_tokens(col, "space_punct", lowercase=True).values.to_pylist() == [
        "hi",
        ",",
        "there",
        "!",
        "you",
        "a",
        ",",
        "b",
        ",",
        "c",
    ]
    r = split_tokens(col, "comma")
    assert r.values.to_pylist() == ["Hi", "there!  you", "a", "b", "c"] and r.offsets.tolist() == [
        0,
        2,
        2,
        5,
    ]
    chars = split_tokens(pa.array(["hé\nx"]), "characters")
    assert [chr(c) for c in chars.codes] == ["h", "é", "\n", "x"]
    assert split_tokens(pa.array(["a1b22c"]), "regex", regex=r"\d+").values.to_pylist() == [
        "a",
        "b",
        "c",
    ]
    with pytest.raises(ConfigError, match="valid tokenizers"):
        split_tokens(col, "nope")
    with pytest.raises(ConfigError, match="regex"):
        split_tokens(col, "regex")


@given(rows=rows_of_tokens)
def test_split_tokens_matches_python_split(rows: list[list[str]]) -> None:
    r = split_tokens(pa.array([" ".join(t) for t in rows]), "space")
    got = [r.values[int(a) : int(b)].to_pylist() for a, b in zip(r.offsets[:-1], r.offsets[1:])]
    assert got == rows


@given(
    texts=st.lists(
        st.text(st.sampled_from("ab_Z9 \t\n\x0b\x1c,.!'\x01"), max_size=12), min_size=1, max_size=20
    ),
    lo=st.integers(0, 3),
    tokenizer=st.sampled_from(["space", "space_punct"]),
)
def test_ascii_fast_path_matches_pyarrow_path(texts: list[str], lo: int, tokenizer: str) -> None:
    col = pa.array(["pad"] * lo + texts).slice(lo)
    fast, slow = split_tokens(col, tokenizer), split_tokens(col, tokenizer, fast=False)
    assert fast.values.to_pylist() == slow.values.to_pylist()
    assert fast.offsets.tolist() == slow.offsets.tolist()


@given(
    texts=st.lists(st.text(max_size=12), min_size=1, max_size=20),
    lo=st.integers(0, 5),
    large=st.booleans(),
    most=st.integers(1, 10),
)
def test_codepoints_match_python_characters(
    texts: list[str], lo: int, large: bool, most: int
) -> None:
    col = pa.array(["pad"] * lo + texts, pa.large_string() if large else pa.string()).slice(lo)
    rag = split_tokens(col, "characters")
    assert rag.codes is not None
    got = [
        "".join(chr(c) for c in rag.codes[a:b]) for a, b in zip(rag.offsets[:-1], rag.offsets[1:])
    ]
    assert got == texts
    flat = [ch for t in texts for ch in t]
    assert rag.count().as_dict() == dict(Counter(flat))
    vocab = Vocab.build(flat, max_size=most)
    assert rag.encode(vocab).tolist() == vocab.encode(pa.array(flat, pa.string())).tolist()


@given(
    texts=st.lists(st.text(st.characters(max_codepoint=127), max_size=12), min_size=1, max_size=20),
    seen=st.text(st.characters(max_codepoint=127), max_size=30),
    most=st.integers(1, 40),
)
def test_lowercase_folded_into_ascii_char_tables(texts: list[str], seen: str, most: int) -> None:
    """ASCII chars keep their raw bytes; lower-casing folded into count/encode equals lower-casing
    first, also with a vocabulary from other text that lacks some letters (unseen data)."""
    folded = split_tokens(pa.array(texts), "characters", lowercase=True)
    lowered = split_tokens(pa.array([t.lower() for t in texts]), "characters")
    assert folded.canon is not None and folded.offsets.tolist() == lowered.offsets.tolist()
    assert folded.count().as_dict() == lowered.count().as_dict()
    for vocab in (
        Vocab.build([c for t in texts for c in t.lower()], max_size=most),
        Vocab.build(list(seen.lower()) or ["x"], max_size=most),
    ):
        assert folded.encode(vocab).tolist() == lowered.encode(vocab).tolist()
    keep = np.arange(len(folded.codes)) % 2 == 0
    assert folded.keep(keep).encode(vocab).tolist() == lowered.keep(keep).encode(vocab).tolist()


def test_lowercase_characters_of_non_ascii_text() -> None:
    rag = split_tokens(pa.array(["ÀbÇ", "Zé"]), "characters", lowercase=True)
    assert rag.canon is None and [chr(c) for c in rag.codes] == list("àbçzé")


@given(
    rows=st.lists(st.lists(st.integers(1, 9), max_size=7), min_size=1, max_size=20),
    length=st.integers(0, 8),
    left=st.booleans(),
)
def test_pad_truncates_and_pads(rows: list[list[int]], length: int, left: bool) -> None:
    """Sequence/text/timeseries padding (core.ragged.pad): keeps each row's start, pads left or
    right."""
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    flat = np.array([v for r in rows for v in r], np.int64)
    out = pad(flat, offsets, length, side="left" if left else "right", dtype=np.int32)[0]
    assert out.shape == (len(rows), length) and out.dtype == np.int32
    for r, o in zip(rows, out.tolist()):
        kept = r[:length]
        expect = [0] * (length - len(kept)) + kept if left else kept + [0] * (length - len(kept))
        assert o == expect


# -- set / bag ----------------------------------------------------------------------------------
@given(
    rows=rows_of_tokens,
    most_common=st.integers(1, 8),
    sparse=st.booleans(),
    split=st.integers(0, 30),
)
def test_set_multi_hot_rows_match_the_sets(
    rows: list[list[str]], most_common: int, sparse: bool, split: int
) -> None:
    meta, out = run(
        "set",
        [" ".join(r) for r in rows],
        split=split,
        most_common=most_common,
        max_dense_bytes=0 if sparse else 2**30,
    )
    vocab = Vocab.from_dict(meta)
    assert vocab.idx2str[:2] == ["<PAD>", "<UNK>"]
    assert len(vocab) <= most_common + 2 and meta["vocab_size"] == len(vocab)
    assert meta["max_set_size"] == max(len(r) for r in rows)
    assert meta["layout"] == ("csr" if sparse else "dense")
    x = out["f"]
    assert isinstance(x, CSR) == sparse
    dense = as_dense(x, len(rows))
    if not sparse:
        assert x.dtype == np.int8 and x.shape == (len(rows), len(vocab))
    for r, row in zip(rows, dense):
        expect = {vocab.str2idx.get(t, 1) for t in r}
        assert set(np.flatnonzero(row).tolist()) == expect
        assert set(np.unique(row).tolist()) <= {0, 1}


@given(rows=rows_of_tokens, sparse=st.booleans())
def test_bag_frequencies_match(rows: list[list[str]], sparse: bool) -> None:
    meta, out = run(
        "bag", [" ".join(r) for r in rows], most_common=3, max_dense_bytes=0 if sparse else 2**30
    )
    vocab = Vocab.from_dict(meta)
    dense = as_dense(out["f"], len(rows))
    assert dense.dtype == np.float32
    for r, row in zip(rows, dense):
        expect = np.zeros(len(vocab), np.float32)
        for t in r:
            expect[vocab.str2idx.get(t, 1)] += 1
        np.testing.assert_array_equal(row, expect)


@given(rows=rows_of_tokens, split=st.integers(0, 30))
def test_set_vocab_ids_ordered_by_frequency_and_blocks_do_not_matter(
    rows: list[list[str]], split: int
) -> None:
    meta, _ = run("set", [" ".join(r) for r in rows], split=split)
    meta_one, _ = run("set", [" ".join(r) for r in rows], split=0)
    assert meta == meta_one
    counts = Counter(t for r in rows for t in r)
    regular = meta["idx2str"][2:]
    assert regular == sorted(counts, key=lambda t: (-counts[t], t))
    assert all(meta["str2freq"][t] == counts[t] for t in regular)


def test_set_layout_decided_by_threshold() -> None:
    values = ["a b", "c"] * 50
    meta, _ = run(
        "set", values, max_dense_bytes=100 * 5
    )  # 100 rows x 5 ids (<PAD>, <UNK>, a, b, c)
    assert meta["layout"] == "dense"
    meta, out = run("set", values, max_dense_bytes=100 * 5 - 1)
    assert meta["layout"] == "csr" and isinstance(out["f"], CSR)
    assert out["f"].offsets.tolist()[:3] == [0, 2, 3]


def test_set_unseen_tokens_map_to_unk_and_tokenizer_lowercase() -> None:
    h = get_handler("set")
    p = h.Params(tokenizer="comma", lowercase=True)
    meta = h.finalize(h.fit(pa.array(["A, b", "b"]), p, CTX), p, CTX)
    out = h.transform(pa.array(["a,Z", "", "B, b"]), meta, p, CTX)["f"]
    v = Vocab.from_dict(meta)
    assert np.flatnonzero(out[0]).tolist() == sorted([v["a"], 1])
    assert out[1].sum() == 0 and np.flatnonzero(out[2]).tolist() == [v["b"]]


# -- sequence -----------------------------------------------------------------------------------
@given(
    rows=rows_of_tokens, limit=st.integers(1, 8), left=st.booleans(), most_common=st.integers(1, 8)
)
def test_sequence_ids_lengths_and_padding(
    rows: list[list[str]], limit: int, left: bool, most_common: int
) -> None:
    meta, out = run(
        "sequence",
        [" ".join(r) for r in rows],
        max_sequence_length=limit,
        padding="left" if left else "right",
        most_common=most_common,
    )
    vocab = Vocab.from_dict(meta)
    x = out["f"]
    length = max(1, min(max(len(r) for r in rows), limit))  # never zero-width
    assert meta["max_sequence_length"] == length
    assert x.dtype == np.int8 and x.shape == (len(rows), length)
    for r, row in zip(rows, x):
        kept = [vocab.str2idx.get(t, 1) for t in r[:length]]
        nonpad = row[row != 0].tolist()
        assert nonpad == kept  # ids are >= 1 for real tokens, so padding is exactly the zeros
        if left:
            assert (row[: length - len(kept)] == 0).all()
        else:
            assert (row[len(kept) :] == 0).all()
        # decode round-trip for in-vocabulary tokens
        assert [t if t in vocab.str2idx else "<UNK>" for t in r[:length]] == vocab.decode(
            nonpad
        ).tolist()


def test_sequence_vocab_file(tmp_path: Path) -> None:
    (tmp_path / "v.txt").write_text("zz\nb\nzz\n\n", encoding="utf-8")
    ctx = FeatureContext(name="f", column="f", path=None, base_dir=tmp_path)
    meta, out = run("sequence", ["b a zz", "a"], vocab_file="v.txt", ctx=ctx)
    assert meta["idx2str"] == ["<PAD>", "<UNK>", "zz", "b"]
    assert out["f"].tolist() == [[3, 1, 2], [1, 0, 0]]
    with pytest.raises(ConfigError, match="vocab_file"):
        run("sequence", ["a"], vocab_file="missing.txt", ctx=ctx)


# -- text ---------------------------------------------------------------------------------------
def test_text_two_levels_two_vocabularies() -> None:
    values = ["The cat sat.", "A dog, the end"]
    meta, out = run("text", values, remove_stopwords=True)
    assert set(out) == {"f_char", "f_word"}
    words = TextHandler.vocab(meta, "word")
    chars = TextHandler.vocab(meta, "char")
    assert meta["word_vocab_size"] == len(words) and meta["char_vocab_size"] == len(chars)
    assert not STOPWORDS & set(words.idx2str)  # "the", "a" removed
    assert words.decode(out["f_word"][0][out["f_word"][0] != 0]).tolist() == ["cat", "sat", "."]
    assert (
        meta["word_max_sequence_length"] == out["f_word"].shape[1] == 3
    )  # "cat sat ." / "dog , end"
    assert "".join(chars.decode(out["f_char"][0][out["f_char"][0] != 0])) == "the cat sat."
    assert out["f_char"].shape == (2, meta["char_max_sequence_length"]) == (2, len(values[1]))


def test_text_limits_and_no_lowercase() -> None:
    meta, out = run(
        "text",
        ["AAA bbb ccc", "b"],
        lowercase=False,
        char_sequence_length_limit=2,
        word_sequence_length_limit=1,
        word_tokenizer="space",
        char_most_common=1,
    )
    assert out["f_char"].shape == (2, 2) and out["f_word"].shape == (2, 1)
    assert TextHandler.vocab(meta, "word").decode(out["f_word"][:, 0]).tolist() == ["AAA", "b"]
    assert meta["char_idx2str"] == ["<PAD>", "<UNK>", "b"]


# -- timeseries ---------------------------------------------------------------------------------
@given(
    rows=st.lists(st.lists(st.floats(-1e6, 1e6, width=32), max_size=6), min_size=1, max_size=20),
    limit=st.integers(1, 8),
    comma=st.booleans(),
)
def test_timeseries_values_and_padding(rows: list[list[float]], limit: int, comma: bool) -> None:
    sep = "," if comma else " "
    meta, out = run(
        "timeseries",
        [sep.join(repr(v) for v in r) for r in rows],
        timeseries_length_limit=limit,
        tokenizer="comma" if comma else "space",
        padding_value=-7.0,
    )
    length = max(1, min(max(len(r) for r in rows), limit))  # never zero-width
    assert meta == {"max_timeseries_length": length}
    x = out["f"]
    assert x.dtype == np.float32 and x.shape == (len(rows), length)
    for r, row in zip(rows, x.tolist()):
        kept = r[:length]
        assert row == kept + [-7.0] * (length - len(kept))


def test_timeseries_bad_value_names_line_and_column() -> None:
    ctx = FeatureContext(
        name="f", column="col", path="data.csv", base_dir=None, row_offset=10, line_offset=2
    )
    with pytest.raises(DataFileError, match="'1.2.3'") as info:
        run("timeseries", ["1 2", "3", "4 1.2.3"], split=0, ctx=ctx)  # one block: local row 2
    assert (info.value.path, info.value.line, info.value.column) == ("data.csv", 14, "col")
    parquet = FeatureContext(name="f", column="col", path="d.parquet", base_dir=None)
    with pytest.raises(DataFileError) as info:
        run("timeseries", ["1,x", "3"], tokenizer="comma", split=0, ctx=parquet)
    assert (info.value.row, info.value.line) == (0, None)


@pytest.mark.parametrize("type_name", ["set", "sequence", "text"])
def test_token_cache_reuses_only_the_same_block(type_name: str) -> None:
    """Regression: the removed fit→transform token cache served another column of the same length;
    handlers are stateless now."""
    h = get_handler(type_name)
    p = h.Params()
    a, b = pa.array(["x y", "y"]), pa.array(["y z", "z"])
    meta = h.finalize(h.merge(h.fit(a, p, CTX), h.fit(b, p, CTX)), p, CTX)
    out_b, out_a = h.transform(b, meta, p, CTX), h.transform(a, meta, p, CTX)
    fresh = get_handler(type_name)
    for col, out in ((a, out_a), (b, out_b)):
        expect = fresh.transform(col, meta, p, CTX)
        assert all(np.array_equal(out[k], expect[k]) for k in expect)
    assert not all(np.array_equal(out_a[k], out_b[k]) for k in out_a)
