"""Tokenizers: agreement with the plain-Python definitions, HF wrapper, registry errors."""

from __future__ import annotations

import re
import string
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.errors import ConfigError, DataFileError, DataFileNotFoundError
from datamill.tokenize import HFTokenizer, get_tokenizer, normalize

texts = st.lists(st.one_of(st.none(), st.text(max_size=30)), max_size=20)
ascii_texts = st.lists(st.text(alphabet=string.printable, max_size=40), max_size=20)


@given(texts)
def test_space_is_str_split(xs: list[str | None]) -> None:
    got = get_tokenizer("space").tokenize(xs).to_pylist()
    assert got == [(x or "").split() for x in xs]


@given(texts)
def test_characters_are_list_of_str(xs: list[str | None]) -> None:
    got = (
        get_tokenizer("characters")
        .tokenize(pa.chunked_array([pa.array(xs, pa.string())]))
        .to_pylist()
    )
    assert got == [list(x or "") for x in xs]


@given(ascii_texts)
def test_space_punct_matches_ludwig_regex_on_ascii(xs: list[str]) -> None:
    got = get_tokenizer("space_punct").tokenize(xs).to_pylist()
    assert got == [re.findall(r"\w+|[^\w\s]", x) for x in xs]


# Arrow lower-cases with utf8proc's Unicode tables, which differ from Python's for some recent
# characters (e.g. U+1DF68) and has no special casing (U+0130, final sigma U+03A3 in Python);
# compare on Latin/Greek/Cyrillic plus every whitespace character
bmp_texts = st.lists(
    st.one_of(
        st.none(),
        st.text(
            st.characters(max_codepoint=0x4FF, exclude_characters="\u0130\u03a3")
            | st.sampled_from([" ", "\u3000", "\u2028", "\x85", "\x1c", "\xa0", "\u2009"]),
            max_size=30,
        ),
    ),
    max_size=20,
)


@given(bmp_texts, st.booleans(), st.booleans())
def test_normalize_matches_seed(xs: list[str | None], lower: bool, collapse: bool) -> None:
    got = normalize(xs, lowercase=lower, collapse_whitespace=collapse).to_pylist()
    want = []
    for x in xs:
        s = x or ""
        s = s.lower() if lower else s
        want.append(" ".join(s.split()) if collapse else s)
    assert got == want


@given(ascii_texts)
def test_regex_split_drops_empty(xs: list[str]) -> None:
    got = get_tokenizer("regex", pattern=r"[ ,]+").tokenize(xs).to_pylist()
    assert got == [[t for t in re.split(r"[ ,]+", x) if t] for x in xs]


def test_unknown_tokenizer_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match="valid: bpe, characters"):
        get_tokenizer("word")
    with pytest.raises(ConfigError):
        get_tokenizer("regex", pattern="(")
    with pytest.raises(ConfigError):
        get_tokenizer("bpe")


LINES = ["the quick brown fox jumps over the lazy dog", "a quick brown dog sat on the mat"] * 30


@pytest.mark.parametrize("model", ["bpe", "wordpiece"])
def test_hf_train_save_load_encode(model: str, tmp_path: Path) -> None:
    tok = HFTokenizer.train(LINES, model=model, vocab_size=80, min_frequency=1)  # type: ignore[arg-type]
    assert tok.token_to_id("[PAD]") == 0 and tok.id_to_token(1) == "[UNK]"
    ids, offsets = tok.encode_batch(["The quick fox", "", "lazy dog"])
    assert (
        ids.dtype == np.int32
        and offsets.dtype == np.int64
        and offsets.tolist()[:3] == [0, offsets[1], offsets[1]]
    )
    assert tok.decode(ids[offsets[0] : offsets[1]]) == "the quick fox"
    ref = [
        tok.inner.encode(t, add_special_tokens=False).tokens
        for t in ["The quick fox", "", "lazy dog"]
    ]
    assert tok.tokenize(["The quick fox", "", "lazy dog"]).to_pylist() == ref
    path = tmp_path / "tok.json"
    tok.save(path)
    again = HFTokenizer.load(path)
    assert again.get_vocab() == tok.get_vocab() and again.vocab_size == tok.vocab_size
    np.testing.assert_array_equal(
        again.encode_batch(["lazy dog"])[0], tok.encode_batch(["lazy dog"])[0]
    )
    via_registry = get_tokenizer(model, path=path)
    assert via_registry.name == model


def test_hf_train_from_file_and_bad_files(tmp_path: Path) -> None:
    src = tmp_path / "corpus.txt"
    src.write_text("\n".join(LINES), encoding="utf-8")
    tok = get_tokenizer("wordpiece", files=[src], vocab_size=200, min_frequency=1)
    assert isinstance(tok, HFTokenizer) and tok.token_to_id("quick") is not None
    with pytest.raises(DataFileNotFoundError) as ei:
        HFTokenizer.load(tmp_path / "missing.json")
    assert Path(ei.value.path).name == "missing.json"  # type: ignore[attr-defined]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(DataFileError) as ei2:
        HFTokenizer.load(bad)
    assert str(ei2.value.path).endswith("bad.json")  # type: ignore[attr-defined]
