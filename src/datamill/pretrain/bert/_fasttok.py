"""Vectorised WordPiece encoding: each distinct word is run through the tokenizer once.

For a tokenizer made of ``BertNormalizer`` + ``BertPreTokenizer`` + ``WordPiece`` (what
:func:`datamill.pretrain.bert._tok.train_wordpiece` builds, and Google's BERT vocabularies), every
line is cut with pyarrow compute, all lines at once, at points where the tokenizer itself always
cuts: ASCII whitespace and around ASCII punctuation (after dropping ASCII control characters, which
the normaliser drops too, and lowercasing ASCII letters, which it also does). The chunks are
dictionary-encoded; only the distinct ones not met before in the run (:class:`WordCache`) go
through the library (one parallel batch, as
pre-tokenized words: the library still normalises and pre-tokenises inside each chunk, so Unicode
punctuation, accents and CJK are handled by the library itself); every line's ids are then
gathered with one fancy index. Lines holding an added token's text (``[SEP]``...) go through the
library whole. ``tests/pretrain/test_bert_fasttok.py`` checks equality with the library on
WikiText and on random Unicode strings.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.ragged import encodings_to_csr, ranges

__all__ = ["WordCache", "encode_lines", "fast_path_config"]

_CONTROL = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"  # removed by BertNormalizer(clean_text=True)
_PUNCT = r"([\x21-\x2f\x3a-\x40\x5b-\x60\x7b-\x7e])"  # ASCII punctuation, isolated by BertPreTokenizer


def fast_path_config(inner: Any) -> dict[str, Any] | None:
    """``{"lowercase": bool, "added": [texts]}`` when the fast path is exact for ``inner``, else ``None``."""
    try:
        cfg = json.loads(inner.to_str())
    except (ValueError, AttributeError):
        return None
    norm, pre, model = cfg.get("normalizer") or {}, cfg.get("pre_tokenizer") or {}, cfg.get("model") or {}
    if (norm.get("type") != "BertNormalizer" or not norm.get("clean_text", True)
            or pre.get("type") != "BertPreTokenizer" or model.get("type") != "WordPiece"):
        return None
    return {"lowercase": bool(norm.get("lowercase", True)),
            "added": [t["content"] for t in cfg.get("added_tokens") or [] if t.get("content")]}


def _library(inner: Any, texts: Sequence[str]) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
    encs = inner.encode_batch_fast(list(texts), add_special_tokens=False) if len(texts) else []
    return encodings_to_csr(encs)


class WordCache:
    """Ids of every distinct chunk met so far in one encoding run (chunks of later text are looked
    up with one vectorised ``index_in``; only new ones reach the library)."""

    def __init__(self) -> None:
        self.words = pa.array([], pa.large_string())
        self.flat = np.zeros(0, dtype=np.int32)
        self.off = np.zeros(1, dtype=np.int64)

    def lookup(self, inner: Any, uniq: pa.Array) -> NDArray[np.int64]:
        """Cache index of every word of ``uniq`` (distinct), encoding the unknown ones."""
        uniq = uniq.cast(pa.large_string())
        idx = pc.index_in(uniq, value_set=self.words)
        miss = pc.is_null(idx).to_numpy(zero_copy_only=False)
        out = np.asarray(idx.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        if miss.any():
            new = uniq.filter(pa.array(miss))
            n_flat, n_off = _library_words(inner, new.to_pylist())
            out[miss] = len(self.words) + np.arange(len(new), dtype=np.int64)
            self.words = pa.concat_arrays([self.words, new])
            self.flat = np.concatenate([self.flat, n_flat])
            self.off = np.concatenate([self.off[:-1], self.off[-1] + n_off])
        return out


def _fast(inner: Any, lines: pa.Array, lowercase: bool,
          cache: WordCache) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
    text = pc.replace_substring_regex(lines, _CONTROL, "")
    if lowercase:
        text = pc.ascii_lower(text)
    text = pc.replace_substring_regex(text, _PUNCT, r" \1 ")
    words = pc.ascii_split_whitespace(text)
    flat_words = pc.list_flatten(words)
    nonempty = pc.greater(pc.binary_length(flat_words), 0)
    word_line = pc.list_parent_indices(words).to_numpy()
    keep = nonempty.to_numpy(zero_copy_only=False)
    flat_words = flat_words.filter(nonempty)
    word_line = word_line[keep]
    del text, words
    enc = pc.dictionary_encode(flat_words)
    del flat_words
    where = cache.lookup(inner, enc.dictionary)[enc.indices.to_numpy()]  # cache index per occurrence
    lengths = np.diff(cache.off).astype(np.int32)[where]
    ids = cache.flat[ranges(cache.off[:-1][where], lengths)]
    del where
    per_line = np.bincount(word_line, weights=lengths, minlength=len(lines)).astype(np.int64)
    offsets = np.zeros(len(lines) + 1, dtype=np.int64)
    np.cumsum(per_line, out=offsets[1:])
    return ids, offsets


def _library_words(inner: Any, words: list[str]) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
    return encodings_to_csr(inner.encode_batch_fast([[w] for w in words], is_pretokenized=True,
                                                    add_special_tokens=False))


def encode_lines(inner: Any, lines: Sequence[str] | pa.Array, config: dict[str, Any],
                 cache: WordCache | None = None) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
    """Encode every line without special tokens -> (flat int32 ids, int64 offsets, len n+1)."""
    cache = WordCache() if cache is None else cache
    arr = lines if isinstance(lines, pa.Array) else pa.array(list(lines), pa.string())
    n = len(arr)
    fast = pa.array(np.ones(n, dtype=np.bool_))
    for text in config["added"]:
        fast = pc.and_(fast, pc.invert(pc.match_substring(arr, text)))
    fast_np = fast.to_numpy(zero_copy_only=False).astype(np.bool_)
    f_idx = np.flatnonzero(fast_np)
    s_idx = np.flatnonzero(~fast_np)
    f_flat, f_off = _fast(inner, arr.filter(fast), config["lowercase"], cache) if len(f_idx) else (
        np.zeros(0, np.int32), np.zeros(1, np.int64))
    s_flat, s_off = _library(inner, arr.filter(pc.invert(fast)).to_pylist()) if len(s_idx) else (
        np.zeros(0, np.int32), np.zeros(1, np.int64))
    lengths = np.zeros(n, dtype=np.int64)
    starts = np.zeros(n, dtype=np.int64)
    lengths[f_idx], starts[f_idx] = np.diff(f_off), f_off[:-1]
    lengths[s_idx], starts[s_idx] = np.diff(s_off), s_off[:-1] + len(f_flat)
    both = np.concatenate([f_flat, s_flat])
    flat = both[ranges(starts, lengths)] if n else np.zeros(0, np.int32)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return flat.astype(np.int32, copy=False), offsets
