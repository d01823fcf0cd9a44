"""Building a :class:`~datamill.text.corpus.Corpus` (and its vocabulary) from text.

Levels (how the text becomes documents and tokens):

* ``char``: each line is a document of its characters (the newline itself is not a token), as the
  seed's ``tokenize(lines, 'char')``. With ``collapse_whitespace=True`` the whole file is ONE
  document, ``' '.join(' '.join(lines).split())``: the seed's normalisation of The Time Machine
  (with ``lowercase=True``: 178,605 characters, 44 distinct, so a vocabulary of 45 with
  ``<unk>``). The other d2l version, ``re.sub('[^A-Za-z]+', ' ', line).strip().lower()`` per line,
  keeps 26 letters and the space: a vocabulary of 28 with ``<unk>``. ASCII files take a numpy fast
  path (:mod:`datamill.core.ascii`) with the same result as the Arrow path.
* ``word``: each line is a document of its whitespace-separated words (``str.split()``), as the
  word2vec chapter reads PTB.
* ``bpe`` / ``wordpiece``: each line is a document of Hugging Face sub-word ids
  (:class:`datamill.tokenize.HFTokenizer`, trained on the text unless ``tokenizer=`` is given).

Vocabulary (``char``/``word``): the seed's ``Vocab(tokens, min_freq, reserved_tokens)``: ``<unk>``
first, then ``reserved_tokens``, then tokens by descending count; ties by ascending token (the
seed keeps first-seen order for ties, the only difference). Tokens seen fewer than ``min_freq``
times map to ``<unk>``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.ascii import ascii_char_codes, ascii_words
from datamill.core.checks import MAX_SIZE, MIN_FREQ
from datamill.core.errors import ConfigError, DataFileError
from datamill.core.io import PathLike, check_output, display_name, read_bytes
from datamill.text.corpus import (
    LEVELS,
    Corpus,
    Level,
    _smallest_dtype,
    is_corpus_folder,
    read_lines,
)
from datamill.tokenize import CharTokenizer, HFTokenizer, SpaceTokenizer
from datamill.vocab import TokenCounts, Vocab

__all__ = ["VocabLimits", "build_corpus", "build_vocab"]


def _specials(reserved_tokens: Sequence[str] | str, unk_token: str) -> list[str]:
    reserved = [reserved_tokens] if isinstance(reserved_tokens, str) else list(reserved_tokens)
    return [unk_token, *[t for t in reserved if t != unk_token]]


def _check_vocab_args(min_freq: int, max_size: int | None) -> int:
    MIN_FREQ(min_freq)
    if max_size is not None:
        MAX_SIZE(max_size)
    return max(1, min_freq)  # the seed's min_freq=0 keeps everything, as 1 does


def _char_ids(lines: pa.Array) -> tuple[NDArray[np.uint32], NDArray[np.int64]]:
    return CharTokenizer().codepoints(lines)


def _counts_from_codepoints(cps: NDArray[Any]) -> tuple[TokenCounts, NDArray[Any]]:
    uniq, counts = (
        np.unique(cps, return_counts=True) if len(cps) < 1 << 16 else _bincount_unique(cps)
    )
    chars = pa.array([chr(c) for c in uniq.tolist()], pa.string())  # one per distinct character
    return TokenCounts(chars, counts.astype(np.int64)), uniq


def _bincount_unique(cps: NDArray[Any]) -> tuple[NDArray[Any], NDArray[np.int64]]:
    counts = np.bincount(cps)
    uniq = np.flatnonzero(counts)
    return uniq, counts[uniq]


def _word_dictionary(lines: pa.Array) -> tuple[pa.ListArray, pa.DictionaryArray]:
    words = SpaceTokenizer().tokenize(lines)
    return words, pc.dictionary_encode(words.flatten())


def build_vocab(
    source: PathLike | Sequence[str] | pa.Array | pa.ChunkedArray,
    /,
    *,
    level: Literal["char", "word"] = "word",
    lowercase: bool = False,
    collapse_whitespace: bool = False,
    min_freq: int = 0,
    max_size: int | None = None,
    reserved_tokens: Sequence[str] | str = (),
    unk_token: str = "<unk>",
) -> Vocab:
    """The seed's vocabulary of a text (file, ``zip:member``, or texts), counted over whole arrays.

    Args:
        source: a text file path, ``archive.zip:member``, a list/array of texts, or a
            ``list<string>`` array of already tokenised texts.
        level: ``"char"`` or ``"word"`` (whitespace). Ignored for tokenised input. Defaults to
            ``"word"``.
        lowercase: lower-case first. Defaults to ``False``.
        collapse_whitespace: collapse whitespace runs to one space. Defaults to ``False``.
        min_freq: rarer tokens are left out (they map to ``unk_token``). Defaults to ``0`` (keep
            all).
        max_size: keep at most this many regular tokens. Defaults to ``None``.
        reserved_tokens: special tokens placed after ``unk_token``. Defaults to ``()``.
        unk_token: the unknown token, id 0. Defaults to ``"<unk>"``.

    Returns:
        the :class:`datamill.vocab.Vocab`.

    Raises:
        DataFileError / DataFileNotFoundError: unreadable, empty or non-UTF-8 file.
        ConfigError: bad level or limits.

    Examples:
        >>> v = build_vocab(["the cat", "the hat"], reserved_tokens=["<pad>"])
        >>> v.idx2str, v[["the", "dog"]]
        (['<unk>', '<pad>', 'the', 'cat', 'hat'], [2, 0])
        >>> len(build_vocab(["abca"], level="char"))
        4
    """
    mf = _check_vocab_args(min_freq, max_size)
    specials = _specials(reserved_tokens, unk_token)
    if isinstance(source, (pa.ListArray, pa.LargeListArray)):
        counts_obj = _count_list(source)
    elif level == "char":
        cps, _ = _char_ids(
            read_lines(source, lowercase=lowercase, collapse_whitespace=collapse_whitespace)
        )
        counts_obj, _u = _counts_from_codepoints(cps)
    elif level == "word":
        _, dic = _word_dictionary(
            read_lines(source, lowercase=lowercase, collapse_whitespace=collapse_whitespace)
        )
        counts_obj = TokenCounts(
            dic.dictionary, np.bincount(dic.indices.to_numpy(), minlength=len(dic.dictionary))
        )
    else:
        raise ConfigError(f"build_vocab level must be 'char' or 'word', got {level!r}")
    return Vocab.from_counts(
        counts_obj, min_freq=mf, max_size=max_size, specials=specials, unk_token=unk_token
    )


def _count_list(lists: pa.ListArray | pa.LargeListArray) -> TokenCounts:
    from datamill.vocab import count_tokens

    return count_tokens(lists.flatten())


def build_corpus(
    source: PathLike | Sequence[str] | pa.Array,
    /,
    *,
    level: Level = "char",
    lowercase: bool = False,
    collapse_whitespace: bool = False,
    tokenizer: HFTokenizer | PathLike | None = None,
    vocab_size: int = 8000,
    vocab: Vocab | VocabLimits | None = None,
    out: PathLike | None = None,
    overwrite: bool = False,
) -> Corpus:
    """Tokenise a text into a :class:`Corpus` (see the module docstring for the levels).

    Args:
        source: a text file, ``archive.zip:member``, or a list/array of texts (one per line).
        level: ``"char"``, ``"word"``, ``"bpe"`` or ``"wordpiece"``. Defaults to ``"char"``.
        lowercase: lower-case first. Defaults to ``False``.
        collapse_whitespace: collapse whitespace; at char level this also joins the file into one
            document (the seed). Defaults to ``False``.
        tokenizer: bpe/wordpiece: an :class:`HFTokenizer` or its file; trained on ``source`` when
            ``None``. Defaults to ``None``.
        vocab_size: bpe/wordpiece vocabulary size when training. Defaults to ``8000``.
        vocab: char/word: encode with this :class:`~datamill.vocab.Vocab` instead of building one,
            or build one within these :class:`VocabLimits` (``min_freq``, ``max_size``,
            ``reserved_tokens``, ``unk_token``: see :func:`build_vocab`). Defaults to ``None``
            (``VocabLimits()``).
        out: also save the corpus folder here; an existing corpus folder there is replaced (the
            input, or anything else, is refused). Defaults to ``None``.
        overwrite: also replace another kind of datamill output at ``out``. Defaults to ``False``.

    Returns:
        the corpus (memory-resident; :meth:`Corpus.load` maps a saved one).

    Raises:
        DataFileError / DataFileNotFoundError: unreadable, empty or non-UTF-8 input.
        ConfigError: bad level or limits.

    Examples:
        >>> c = build_corpus(["abcab"], level="char")
        >>> c.tokens.tolist(), c.vocab.idx2str, c.tokens.dtype
        ([1, 2, 3, 1, 2], ['<unk>', 'a', 'b', 'c'], dtype('uint16'))
        >>> build_corpus(["abcab"], level="char", vocab=VocabLimits(min_freq=2)).vocab.idx2str
        ['<unk>', 'a', 'b']
    """
    if level not in LEVELS:
        raise ConfigError(f"unknown corpus level {level!r}; valid: {', '.join(LEVELS)}")
    if out is not None:
        inputs = [x for x in (source, tokenizer) if isinstance(x, (str, os.PathLike))]
        out = check_output(
            out, is_own=is_corpus_folder, inputs=inputs, what="corpus folder", overwrite=overwrite
        )
    src_name = display_name(source) if isinstance(source, (str, os.PathLike)) else "<texts>"
    meta: dict[str, Any] = {
        "source": src_name,
        "lowercase": lowercase,
        "collapse_whitespace": collapse_whitespace,
    }
    va = _VocabArgs.of(vocab)
    fast = _ascii_fast_path(
        source, level, va, lowercase=lowercase, one_document=collapse_whitespace
    )
    if fast is not None:
        return _finish(*fast, level, meta, None, out)
    lines = read_lines(
        source,
        lowercase=lowercase,
        collapse_whitespace=collapse_whitespace,
        one_document=collapse_whitespace and level == "char",
    )
    if level == "bpe" or level == "wordpiece":
        hf = _subword_tokenizer(lines, level, va, tokenizer, vocab_size, lowercase=lowercase)
        ids, offsets = hf.encode_batch(lines)
        return _finish(ids, offsets, _subword_vocab(hf, ids), level, meta, hf, out)
    if level == "char":
        cps, offsets = _char_ids(lines)
        v, ids = _encode_codes(cps, va)
        return _finish(ids, offsets, v, level, meta, None, out)
    words, dic = _word_dictionary(lines)
    offsets = words.offsets.to_numpy().astype(np.int64)
    v, ids = _encode_words(dic, va)
    return _finish(ids, offsets - offsets[0], v, level, meta, None, out)


@dataclass(frozen=True)
class VocabLimits:
    """How :func:`build_corpus` builds a char/word vocabulary (see :func:`build_vocab`).

    Args:
        min_freq: tokens seen fewer times map to ``unk_token``. Defaults to ``0``.
        max_size: keep the most frequent tokens only. Defaults to ``None``.
        reserved_tokens: tokens placed first, after ``unk_token``. Defaults to ``()``.
        unk_token: the unknown token (index 0). Defaults to ``"<unk>"``.

    Examples:
        >>> VocabLimits(min_freq=2).unk_token
        '<unk>'
    """

    min_freq: int = 0
    max_size: int | None = None
    reserved_tokens: Sequence[str] | str = ()
    unk_token: str = "<unk>"


@dataclass(frozen=True)
class _VocabArgs:
    """The vocabulary options of :func:`build_corpus` (char/word levels), passed whole."""

    vocab: Vocab | None
    min_freq: int
    max_size: int | None
    reserved_tokens: Sequence[str] | str
    unk_token: str

    @classmethod
    def of(cls, vocab: Vocab | VocabLimits | None) -> _VocabArgs:
        """A given vocabulary, or the limits to build one within."""
        if vocab is None or isinstance(vocab, VocabLimits):
            lim = vocab if vocab is not None else VocabLimits()
            return cls(None, lim.min_freq, lim.max_size, lim.reserved_tokens, lim.unk_token)
        if not isinstance(vocab, Vocab):
            raise ConfigError(
                f"vocab must be a Vocab or VocabLimits, got {type(vocab).__name__}",
                hint="from datamill.text import VocabLimits",
            )
        return cls(vocab, 0, None, (), "<unk>")  # the limits of the defaults: not used


def _encode_words(dic: pa.DictionaryArray, va: _VocabArgs) -> tuple[Vocab, NDArray[Any]]:
    return _encode_dictionary(
        dic,
        va.vocab,
        min_freq=_check_vocab_args(va.min_freq, va.max_size),
        max_size=va.max_size,
        specials=_specials(va.reserved_tokens, va.unk_token),
        unk_token=va.unk_token,
    )


def _ascii_fast_path(
    source: Any, level: Level, va: _VocabArgs, *, lowercase: bool, one_document: bool
) -> tuple[NDArray[Any], NDArray[np.int64], Vocab] | None:
    """``(ids, offsets, vocab)`` of an ASCII file at char/word level by the numpy kernels (the
    same result as the Arrow path), or ``None`` when they do not apply."""
    if level not in ("char", "word") or not isinstance(source, (str, os.PathLike)):
        return None
    data = read_bytes(source)
    if not data or not data.isascii() or data.isspace():
        return None
    if level == "word":
        dic, offsets = ascii_words(data, lowercase=lowercase)
        v, ids = _encode_words(dic, va)
        return ids, offsets, v
    codes, offsets, canon = ascii_char_codes(data, lowercase=lowercase, one_document=one_document)
    v, ids = _encode_codes(codes, va, canon=canon)
    return ids, offsets, v


def _subword_tokenizer(
    lines: pa.Array,
    level: Literal["bpe", "wordpiece"],
    va: _VocabArgs,
    tokenizer: HFTokenizer | PathLike | None,
    vocab_size: int,
    *,
    lowercase: bool,
) -> HFTokenizer:
    """The bpe/wordpiece tokenizer given, or trained on ``lines``."""
    if va.min_freq > 1 or va.max_size is not None or va.reserved_tokens:
        raise ConfigError(
            f"min_freq/max_size/reserved_tokens do not apply to level {level!r}; "
            "set vocab_size or pass a trained tokenizer"
        )
    if tokenizer is None:
        return HFTokenizer.train(
            lines.to_pylist(), model=level, vocab_size=vocab_size, lowercase=lowercase
        )
    return tokenizer if isinstance(tokenizer, HFTokenizer) else HFTokenizer.load(tokenizer)


def _subword_vocab(hf: HFTokenizer, ids: NDArray[Any]) -> Vocab:
    """The tokenizer's vocabulary as a :class:`Vocab` (counts from ``ids``)."""
    hv = hf.get_vocab()
    idx2str = [""] * (max(hv.values()) + 1)
    for t, i in hv.items():
        idx2str[i] = t
    freq = np.bincount(ids, minlength=len(idx2str))
    return Vocab(
        idx2str,
        str2freq=dict(zip(idx2str, freq.tolist())),
        unk_token="[UNK]" if "[UNK]" in hv else None,
        specials=[t for t in idx2str if t.startswith("[") and t.endswith("]")],
    )


def _encode_dictionary(
    dic: pa.DictionaryArray,
    vocab: Vocab | None,
    *,
    min_freq: int,
    max_size: int | None,
    specials: list[str],
    unk_token: str,
) -> tuple[Vocab, NDArray[Any]]:
    """Vocabulary (unless given) and ids of dictionary-encoded words: counts by bincount, ids by a
    table."""
    indices = dic.indices.to_numpy()
    counts = TokenCounts(dic.dictionary, np.bincount(indices, minlength=len(dic.dictionary)))
    v = vocab or Vocab.from_counts(
        counts, min_freq=min_freq, max_size=max_size, specials=specials, unk_token=unk_token
    )
    lut = v.encode(dic.dictionary, dtype=_smallest_dtype(len(v)))
    return v, lut[indices]


def _encode_codes(
    codes: NDArray[Any], va: _VocabArgs, *, canon: NDArray[np.uint8] | None = None
) -> tuple[Vocab, NDArray[Any]]:
    """Vocabulary (``va.vocab`` unless ``None``: one built within ``va``'s limits) and ids of an
    array of character codes, through a code -> id table.

    ``canon`` maps raw byte codes to normalised ones; counts and ids are folded through it.
    """
    mf = _check_vocab_args(va.min_freq, va.max_size)
    if canon is not None:
        raw = np.zeros(256, np.int64)
        for i in range(
            0, len(codes), 1 << 20
        ):  # per 1 MB block: bincount's int64 copy stays in cache
            raw += np.bincount(codes[i : i + (1 << 20)], minlength=256)
        folded = np.bincount(canon, weights=raw, minlength=256).astype(np.int64)
        uniq = np.flatnonzero(folded)
        counts = TokenCounts(pa.array([chr(c) for c in uniq.tolist()], pa.string()), folded[uniq])
    else:
        counts, uniq = _counts_from_codepoints(codes)
    v = va.vocab or Vocab.from_counts(
        counts,
        min_freq=mf,
        max_size=va.max_size,
        specials=_specials(va.reserved_tokens, va.unk_token),
        unk_token=va.unk_token,
    )
    lut = np.zeros(
        max(int(uniq[-1]) + 1 if len(uniq) else 1, 256 if canon is not None else 0),
        _smallest_dtype(len(v)),
    )
    lut[uniq] = v.encode(counts.tokens)
    if canon is not None:
        lut = lut[canon]
    return v, lut[codes]


def _finish(
    ids: NDArray[Any],
    offsets: NDArray[np.int64],
    vocab: Vocab,
    level: str,
    meta: dict[str, Any],
    hf: HFTokenizer | None,
    out: PathLike | None,
) -> Corpus:
    if len(ids) == 0:
        raise DataFileError(
            f"no tokens at level {level!r}; expected text with at least one token",
            path=str(meta["source"]),
        )
    corpus = Corpus(
        ids.astype(_smallest_dtype(len(vocab)), copy=False),
        offsets=offsets,
        vocab=vocab,
        level=level,
        meta=meta,
        tokenizer=hf,
    )
    unk = vocab.unk_index
    if unk is not None and len(ids) and not np.any(ids != unk):
        warnings.warn(
            f"{meta['source']}: every token maps to {vocab.unk_token!r} (min_freq/max_size leave "
            "no regular token); lower min_freq or raise max_size",
            UserWarning,
            stacklevel=3,
        )
    if out is not None:
        corpus.save(out, overwrite=True)  # checked (with the inputs) by build_corpus
    return corpus
