"""Vectorised WordPiece: the text is cut into chunks once, and each distinct chunk meets the library
once.

For a tokenizer made of ``BertNormalizer`` + ``BertPreTokenizer`` + ``WordPiece`` (what
:func:`datamill.pretrain.bert._tok.train_wordpiece` builds, and Google's BERT vocabularies), every
line is cut with pyarrow compute, a block of lines at a time (blocks in two threads), at points
where the tokenizer itself always cuts: ASCII whitespace and around ASCII punctuation (after
dropping ASCII control characters, which the normaliser drops too, and lowercasing ASCII letters,
which it also does). :func:`cut_text` dictionary-encodes the chunks of all blocks against one set of
distinct chunks (:class:`ChunkedText`). That one cut serves twice:

* encoding (:func:`encode_chunked`): only the distinct chunks go through the library (parallel
  batches, as pre-tokenized words: the library still normalises and pre-tokenises inside each
  chunk, so Unicode punctuation, accents and CJK are handled by the library itself); every line's
  ids are then gathered with one fancy index. Lines holding an added token's text (``[SEP]``...)
  go through the library whole;
* training (:mod:`datamill.pretrain.bert._wptrain`): the chunk counts give the word counts the
  library's trainer would make.

``tests/pretrain/test_bert_fasttok.py`` checks equality with the library on WikiText and on random
Unicode strings.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.arrow import from_numpy, large_strings, to_numpy
from datamill.core.parallel import ordered_map
from datamill.core.ragged import concat_csr, encodings_to_csr, ranges

__all__ = [
    "ChunkBlock",
    "ChunkedText",
    "added_pattern",
    "byte_slices",
    "cut_text",
    "encode_chunked",
    "fast_path_config",
]

_CONTROL = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"  # removed by BertNormalizer(clean_text=True)
_PUNCT = (
    r"([\x21-\x2f\x3a-\x40\x5b-\x60\x7b-\x7e])"  # ASCII punctuation, isolated by BertPreTokenizer
)
_LIBRARY_BATCH = (
    65536  # distinct chunks per library call (bounds the Encoding objects alive at once)
)
_THREADS = 2  # blocks cut / encoded at once (pyarrow kernels and numpy release the GIL)


def fast_path_config(inner: Any) -> dict[str, Any] | None:
    """``{"lowercase": bool, "added": [texts]}`` when the fast path is exact for ``inner``, else
    ``None``."""
    try:
        cfg = json.loads(inner.to_str())
    except (ValueError, AttributeError):
        return None
    norm, pre, model = (
        cfg.get("normalizer") or {},
        cfg.get("pre_tokenizer") or {},
        cfg.get("model") or {},
    )
    if (
        norm.get("type") != "BertNormalizer"
        or not norm.get("clean_text", True)
        or pre.get("type") != "BertPreTokenizer"
        or model.get("type") != "WordPiece"
    ):
        return None
    return {
        "lowercase": bool(norm.get("lowercase", True)),
        "added": [t["content"] for t in cfg.get("added_tokens") or [] if t.get("content")],
    }


def byte_slices(texts: Sequence[str] | pa.Array, nbytes: int) -> Iterator[pa.Array]:
    """Consecutive slices of about ``nbytes`` of text each (at least one line per slice)."""
    arr = texts if isinstance(texts, pa.Array) else large_strings(list(texts))
    if len(arr) == 0:
        return
    ends = np.cumsum(to_numpy(pc.binary_length(arr)).astype(np.int64))
    cuts = np.searchsorted(ends, np.arange(nbytes, int(ends[-1]), nbytes), side="left") + 1
    bounds = np.unique(np.concatenate([[0], cuts, [len(arr)]]))
    for lo, hi in itertools.pairwise(bounds):
        yield arr.slice(int(lo), int(hi - lo))


@dataclass(frozen=True)
class ChunkBlock:
    """A block of lines cut into chunks: each occurrence as an index into the distinct chunks."""

    lines: pa.Array
    indices: NDArray[np.int32]  # per chunk occurrence, in line order
    line_offsets: NDArray[
        np.int64
    ]  # occurrences of line i: indices[line_offsets[i]:line_offsets[i + 1]]


@dataclass(frozen=True)
class ChunkedText:
    """Lines cut into chunks: the distinct chunks of all lines and, per block, the occurrences."""

    chunks: pa.Array  # distinct chunks (large_string)
    blocks: list[ChunkBlock]
    lowercase: bool

    def counts(self) -> NDArray[np.int64]:
        """Occurrences of every distinct chunk."""
        total = np.zeros(len(self.chunks), dtype=np.int64)
        for b in self.blocks:
            total += np.bincount(b.indices, minlength=len(self.chunks))
        return total


def _cut_block(
    lines: pa.Array, *, lowercase: bool
) -> tuple[pa.Array, NDArray[np.int32], NDArray[np.int64]]:
    """(distinct chunks of the block, index per occurrence, occurrence offsets per line)."""
    text = pc.replace_substring_regex(lines, _CONTROL, "")
    if lowercase:
        text = pc.ascii_lower(text)
    text = pc.replace_substring_regex(text, _PUNCT, r" \1 ")
    words = pc.ascii_split_whitespace(text)
    del text
    flat = pc.list_flatten(words)
    nonempty = to_numpy(pc.binary_length(flat)) > 0
    word_line = to_numpy(pc.list_parent_indices(words))[nonempty]
    del words
    enc = pc.dictionary_encode(flat.filter(from_numpy(nonempty)))
    line_offsets = np.zeros(len(lines) + 1, dtype=np.int64)
    np.cumsum(np.bincount(word_line, minlength=len(lines)), out=line_offsets[1:])
    return (
        enc.dictionary.cast(pa.large_string()),
        to_numpy(enc.indices).astype(np.int32, copy=False),
        line_offsets,
    )


def cut_text(texts: Sequence[str] | pa.Array, *, lowercase: bool, block_bytes: int) -> ChunkedText:
    """Cut every line into chunks (see the module docstring), blocks of ``block_bytes`` in two
    threads."""
    slices = list(byte_slices(texts, block_bytes))
    parts = list(
        ordered_map(functools.partial(_cut_block, lowercase=lowercase), slices, threads=_THREADS)
    )
    if not parts:
        return ChunkedText(chunks=large_strings([]), blocks=[], lowercase=lowercase)
    # one set of distinct chunks for all blocks: dictionary-encode the blocks' dictionaries
    enc = pc.dictionary_encode(pa.concat_arrays([p[0] for p in parts]))
    to_global = to_numpy(enc.indices).astype(np.int32, copy=False)
    blocks: list[ChunkBlock] = []
    lo = 0
    for s, (uniq, idx, line_offsets) in zip(slices, parts, strict=True):
        blocks.append(
            ChunkBlock(
                lines=s, indices=to_global[lo : lo + len(uniq)][idx], line_offsets=line_offsets
            )
        )
        lo += len(uniq)
    pa.default_memory_pool().release_unused()
    return ChunkedText(
        chunks=enc.dictionary.cast(pa.large_string()), blocks=blocks, lowercase=lowercase
    )


def _library(inner: Any, texts: list[str]) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
    encs = inner.encode_batch_fast(texts, add_special_tokens=False) if texts else []
    return encodings_to_csr(encs)


def _library_words(inner: Any, words: pa.Array) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
    """Ids of each word (a chunk) encoded alone, as pre-tokenized input, in batches."""
    parts = []
    for lo in range(0, len(words), _LIBRARY_BATCH):
        batch = words.slice(lo, _LIBRARY_BATCH).to_pylist()
        parts.append(
            encodings_to_csr(
                inner.encode_batch_fast(
                    [[w] for w in batch], is_pretokenized=True, add_special_tokens=False
                )
            )
        )
    return (
        concat_csr(parts, dtype=np.int32)
        if parts
        else (np.zeros(0, np.int32), np.zeros(1, np.int64))
    )


@functools.lru_cache(maxsize=8)
def _added_pattern(added: tuple[str, ...]) -> str:
    return "|".join(
        "".join(c if c.isalnum() else f"\\x{{{ord(c):x}}}" for c in text) for text in added
    )


def added_pattern(added: Sequence[str]) -> str:
    r"""A regular expression (RE2) matching any of the texts ``added``, every non-alphanumeric
    character written as ``\x{..}``.

    Examples:
        >>> added_pattern(["[SEP]", "a.b"])
        '\\x{5b}SEP\\x{5d}|a\\x{2e}b'
    """
    return _added_pattern(tuple(added))


def _encode_block(
    inner: Any,
    block: ChunkBlock,
    added: list[str],
    c_flat: NDArray[np.int32],
    c_off: NDArray[np.int64],
) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
    arr = block.lines
    n = len(arr)
    lengths = (c_off[1:] - c_off[:-1])[block.indices]
    ids = c_flat[ranges(c_off[:-1][block.indices], lengths)]
    cum = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cum[1:])
    offsets = cum[block.line_offsets]
    # lines holding an added token's text go through the library whole; one regular expression
    # finds them (5 substring scans cost 30x more)
    slow = (
        to_numpy(pc.match_substring_regex(arr, added_pattern(added)))
        if added
        else np.zeros(n, np.bool_)
    )
    if not slow.any():
        return ids, offsets
    s_idx = np.flatnonzero(slow)
    s_flat, s_off = _library(inner, arr.filter(from_numpy(slow)).to_pylist())
    line_len = np.diff(offsets)
    starts = offsets[:-1].copy()
    line_len[s_idx], starts[s_idx] = np.diff(s_off), s_off[:-1] + len(ids)
    flat = np.concatenate([ids, s_flat])[ranges(starts, line_len)]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(line_len, out=offsets[1:])
    return flat, offsets


def encode_chunked(
    inner: Any, text: ChunkedText, config: dict[str, Any]
) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
    """Encode every line of ``text`` without special tokens -> (flat int32 ids, int64 offsets, len
    n+1)."""
    if text.lowercase != config["lowercase"]:
        raise ValueError("the text was cut with another lowercase setting than the tokenizer's")
    c_flat, c_off = _library_words(inner, text.chunks)
    encode = functools.partial(
        _encode_block, inner, added=config["added"], c_flat=c_flat, c_off=c_off
    )
    parts = list(
        ordered_map(encode, text.blocks, threads=_THREADS)
    )  # numpy and pyarrow release the GIL
    if not parts:
        return np.zeros(0, np.int32), np.zeros(1, np.int64)
    flat, offsets = concat_csr(parts, dtype=np.int32)
    return flat.astype(np.int32, copy=False), offsets
