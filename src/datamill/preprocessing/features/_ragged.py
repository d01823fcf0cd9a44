"""Private helpers for the ragged feature types (set, bag, sequence, text, timeseries).

Whole columns only: ragged data is a flat values array plus int64 row offsets, and dense matrices
are filled with one numpy boolean-mask assignment.

Tokenizers (Ludwig names) come from :mod:`datamill.tokenize`: ``space`` (Python ``str.split()``),
``space_punct`` (words and single punctuation marks), ``regex`` (split on the ``regex`` pattern),
``characters`` (code points); ``comma`` is its regex tokenizer on ``,``. Tokens are trimmed and
empty ones dropped. Two faster paths give the same tokens (hypothesis-checked against
``datamill.tokenize``): characters of an all-ASCII column are its bytes (held as code points, not
strings), and ``space_punct`` on an all-ASCII column is split with numpy byte classes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.ascii import ASCII_LOWER, ASCII_WHITESPACE, ascii_token_spans, token_dictionary
from datamill.core.errors import ConfigError
from datamill.core.ragged import offsets_from_lengths
from datamill.preprocessing.features.base import int_type
from datamill.vocab import TokenCounts, Vocab, count_tokens

__all__ = [
    "STOPWORDS",
    "TOKENIZERS",
    "DictRagged",
    "Ragged",
    "codepoints",
    "compact",
    "lower_except",
    "row_selection",
    "split_tokens",
    "to_string_array",
]

TOKENIZERS = ("characters", "comma", "regex", "space", "space_punct")

#: a small built-in English stop-word list (for ``remove_stopwords``)
STOPWORDS = frozenset(
    [
        "a",
        "about",
        "above",
        "after",
        "again",
        "against",
        "all",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "because",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "down",
        "during",
        "each",
        "few",
        "for",
        "from",
        "further",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "itself",
        "just",
        "me",
        "more",
        "most",
        "my",
        "myself",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "ours",
        "ourselves",
        "out",
        "over",
        "own",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "themselves",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "very",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
    ]
)


class Ragged:
    """Ragged tokens: flat ``values`` (pyarrow strings) + ``offsets`` (int64, len = rows + 1).

    Character tokens are held as Unicode code points in ``codes`` instead of strings (``values`` is
    then ``None``): counting is one ``np.bincount`` and encoding one table lookup. ASCII columns
    keep their bytes as ``codes`` (a uint8 view of the column, no copy); lower-casing is then not
    applied to them but folded into counting and encoding through ``canon`` (byte -> lower-cased
    byte).
    """

    __slots__ = ("canon", "codes", "offsets", "values")

    def __init__(
        self,
        values: pa.Array | None,
        offsets: NDArray[np.int64],
        codes: NDArray[Any] | None = None,
        canon: NDArray[np.uint8] | None = None,
    ) -> None:
        self.values = values
        self.offsets = offsets
        self.codes = codes
        self.canon = canon

    @classmethod
    def from_list(cls, arr: pa.Array | pa.ChunkedArray) -> Ragged:
        """From a pyarrow list array (sliced or chunked arrays handled)."""
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
        lengths = (
            pc.fill_null(pc.list_value_length(arr), 0)
            .to_numpy(zero_copy_only=False)
            .astype(np.int64)
        )
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(pc.list_flatten(arr), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> NDArray[np.int64]:
        """Items per row."""
        return np.diff(self.offsets)

    @property
    def row_ids(self) -> NDArray[np.int64]:
        """Row index of every flat value."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.lengths)

    def keep(self, mask: NDArray[np.bool_]) -> Ragged:
        """Only the values where ``mask`` (flat) is true; offsets recomputed."""
        if mask.all():
            return self
        kept = np.zeros(len(mask) + 1, np.int64)
        np.cumsum(mask, out=kept[1:])
        if self.codes is not None:
            return Ragged(None, kept[self.offsets], self.codes[mask], self.canon)
        assert self.values is not None
        return Ragged(self.values.filter(pa.array(mask)), kept[self.offsets])

    def take_rows(self, mask: NDArray[np.bool_]) -> Ragged:
        """Only the rows where ``mask`` (one per row) is true."""
        if mask.all():
            return self
        tok, offsets = row_selection(self.offsets, mask)
        if self.codes is not None:
            return Ragged(None, offsets, self.codes[tok], self.canon)
        assert self.values is not None
        return Ragged(self.values.filter(pa.array(tok)), offsets)

    def count(self) -> TokenCounts:
        """Mergeable counts of the tokens."""
        if self.codes is None:
            return count_tokens(self.values)
        bins = np.bincount(self.codes) if len(self.codes) else np.zeros(0, np.int64)
        if self.canon is not None:  # counts of raw bytes folded onto their lower-cased byte
            bins = np.bincount(self.canon[: len(bins)], weights=bins, minlength=len(bins)).astype(
                np.int64
            )
        present = np.flatnonzero(bins)
        return TokenCounts(
            pa.array([chr(c) for c in present.tolist()], pa.string()),  # per distinct char
            bins[present].astype(np.int64),
        )

    def encode(self, vocab: Vocab) -> NDArray[np.signedinteger[Any]]:
        """Token ids (unknown → the vocabulary's unk id); from codes, in the smallest int dtype."""
        if self.codes is None:
            return vocab.encode(self.values)
        singles = [
            (ord(t), i) for i, t in enumerate(vocab.idx2str) if len(t) == 1
        ]  # per vocab entry
        size = max(
            [
                int(self.codes.max()) + 1 if len(self.codes) else 0,
                *(c + 1 for c, _ in singles),
                len(self.canon) if self.canon is not None else 0,
            ]
        )
        unk = vocab.unk_index
        if unk is None:
            raise ConfigError("character vocabulary without an unknown token")
        lut = np.full(
            size, unk, int_type(len(vocab))
        )  # ids in the smallest dtype: 4x less memory than int32
        if singles:
            chars, ids = np.array(singles, np.int64).T
            lut[chars] = ids
        if self.canon is not None:  # raw byte -> id of its lower-cased byte
            lut = lut[self.canon]
        encoded: NDArray[np.signedinteger[Any]] = lut[self.codes]
        return encoded


def row_selection(
    offsets: NDArray[np.int64], mask: NDArray[np.bool_]
) -> tuple[NDArray[np.bool_], NDArray[np.int64]]:
    """(token mask, new row offsets) keeping the rows where ``mask`` is true."""
    lengths = np.diff(offsets)
    kept = np.zeros(int(mask.sum()) + 1, np.int64)
    np.cumsum(lengths[mask], out=kept[1:])
    return np.repeat(mask, lengths), kept


def codepoints(column: pa.Array, *, lowercase: bool = False) -> Ragged:
    """Characters of a string column as code points: ASCII bytes directly, else
    ``datamill.tokenize``.

    ``lowercase``: ASCII bytes stay as they are, with lower-casing folded into the tables
    (``canon``); other text is lower-cased first.
    """
    large = pa.types.is_large_string(column.type)
    bufs = column.buffers()
    off = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32)[
        column.offset : column.offset + len(column) + 1
    ]
    data = (
        np.frombuffer(bufs[2], np.uint8)[off[0] : off[-1]]
        if bufs[2] is not None and len(column)
        else np.zeros(0, np.uint8)
    )
    rel = (off - off[0]).astype(np.int64) if len(column) else np.zeros(1, np.int64)
    if len(data) == 0 or int(data.max()) < 0x80:  # ASCII: one byte, one character
        return Ragged(None, rel, data, ASCII_LOWER if lowercase else None)
    from datamill.tokenize import CharTokenizer

    if lowercase:
        column = pc.utf8_lower(column)
    cps, offsets = CharTokenizer().codepoints(column)
    return Ragged(None, offsets, cps.astype(np.int32))


class DictRagged(Ragged):
    """String tokens as a block-local ``dictionary`` + small int ``indices`` (``values`` made on
    demand).

    Counting is one ``np.bincount``; encoding maps the (small) dictionary once and takes.
    """

    __slots__ = ("dictionary", "indices")

    def __init__(
        self, dictionary: pa.Array, indices: NDArray[Any], offsets: NDArray[np.int64]
    ) -> None:
        self.offsets = offsets
        self.codes = None
        self.dictionary = dictionary
        self.indices = indices

    @property
    def values(self) -> pa.Array:  # type: ignore[override]
        """The tokens as strings (a take of the dictionary)."""
        return self.dictionary.take(pa.array(self.indices.astype(np.int32, copy=False)))

    def keep(self, mask: NDArray[np.bool_]) -> Ragged:
        if mask.all():
            return self
        kept = np.zeros(len(mask) + 1, np.int64)
        np.cumsum(mask, out=kept[1:])
        return DictRagged(self.dictionary, self.indices[mask], kept[self.offsets])

    def take_rows(self, mask: NDArray[np.bool_]) -> Ragged:
        if mask.all():
            return self
        tok, offsets = row_selection(self.offsets, mask)
        return DictRagged(self.dictionary, self.indices[tok], offsets)

    def count(self) -> TokenCounts:
        bins = (
            np.bincount(self.indices, minlength=len(self.dictionary))
            if len(self.indices)
            else np.zeros(len(self.dictionary), np.int64)
        )
        present = np.flatnonzero(bins)
        return TokenCounts(self.dictionary.take(pa.array(present)), bins[present].astype(np.int64))

    def encode(self, vocab: Vocab) -> NDArray[np.signedinteger[Any]]:
        lut = np.asarray(vocab.encode(self.dictionary), int_type(len(vocab)))
        encoded: NDArray[np.signedinteger[Any]] = lut[self.indices]
        return encoded


def compact(rag: Ragged) -> Ragged:
    """The same tokens in a smaller form (dictionary indices / uint8 code points), to hold between
    fit and transform."""
    if isinstance(rag, DictRagged):
        if len(rag.dictionary) < 65536 and rag.indices.dtype != np.uint16:
            return DictRagged(rag.dictionary, rag.indices.astype(np.uint16), rag.offsets)
        return rag
    if rag.codes is not None:
        codes = rag.codes
        if codes.dtype == np.uint8:
            return rag
        if len(codes) and int(codes.max()) < 256:
            return Ragged(None, rag.offsets, codes.astype(np.uint8))
        return rag
    assert rag.values is not None
    values = rag.values.combine_chunks() if isinstance(rag.values, pa.ChunkedArray) else rag.values
    enc = pc.dictionary_encode(values)
    dictionary = enc.dictionary
    idx = enc.indices.to_numpy(zero_copy_only=False)
    if enc.indices.null_count:
        return rag
    small = idx.astype(np.uint16) if len(dictionary) < 65536 else idx.astype(np.int32)
    return DictRagged(dictionary, small, rag.offsets)


def lower_except(column: pa.Array, keep: tuple[str, ...]) -> pa.Array:
    """``column`` lower-cased, except values equal to one of ``keep`` (the fill ``<UNK>`` stays the
    unknown token).

    Examples:
        >>> lower_except(pa.array(["A", "<UNK>", "<Unk> B"]), ("<UNK>",)).to_pylist()
        ['a', '<UNK>', '<unk> b']
    """
    lowered = pc.utf8_lower(column)
    if not keep:
        return lowered
    special = pc.fill_null(pc.is_in(column, value_set=pa.array(list(keep), column.type)), False)
    return pc.if_else(special, column, lowered)


def to_string_array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous string array (casting non-string columns)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        column = column.cast(pa.string())
    return pc.fill_null(column, "")


def _ascii_split(column: pa.Array, tokenizer: str) -> Ragged | None:
    """``space_punct`` / ``space`` on an all-ASCII column (None if not ASCII).

    Token spans come from :func:`datamill.core.ascii.ascii_token_spans`; tokens are keyed as exact
    integers when short enough, else their bytes are compacted into one buffer as a string array.
    """
    if tokenizer not in ("space", "space_punct") or not pa.types.is_string(column.type):
        return None
    bufs = column.buffers()
    off = np.frombuffer(bufs[1], np.int32)[column.offset : column.offset + len(column) + 1].astype(
        np.int64
    )
    data = (
        np.frombuffer(bufs[2], np.uint8)[off[0] : off[-1]]
        if bufs[2] is not None
        else np.zeros(0, np.uint8)
    )
    rel = off - off[0]
    if len(data) == 0 or int(data.max()) >= 0x80:
        return None
    starts, lengths, row_offsets = ascii_token_spans(data, rel, punct=tokenizer == "space_punct")
    keyed = token_dictionary(data, starts, lengths)  # exact integer keys: no string per token
    if keyed is not None:
        return DictRagged(keyed[0], keyed[1], row_offsets)
    token_offsets = offsets_from_lengths(lengths)
    packed = data[~ASCII_WHITESPACE[data]]  # the tokens cover every other byte, in order
    string_type, off_type = (
        (pa.string(), np.int32) if len(packed) < 2**31 else (pa.large_string(), np.int64)
    )
    values = pa.Array.from_buffers(
        string_type,
        len(starts),
        [None, pa.py_buffer(token_offsets.astype(off_type)), pa.py_buffer(packed)],
    )
    return Ragged(values, row_offsets)


def _split(column: pa.Array, tokenizer: str, regex: str | None) -> pa.Array:
    """Tokenise with :mod:`datamill.tokenize` (``comma`` is its regex tokenizer on ``,``)."""
    from datamill.tokenize import get_tokenizer

    if tokenizer not in TOKENIZERS or tokenizer == "characters":
        raise ConfigError(
            f"unknown tokenizer {tokenizer!r}; valid tokenizers: {', '.join(TOKENIZERS)}"
        )
    if tokenizer == "regex":
        if not regex:
            raise ConfigError("tokenizer 'regex' needs the `regex` parameter (the split pattern)")
        return get_tokenizer("regex", pattern=regex).tokenize(column)
    if tokenizer == "comma":
        return get_tokenizer("regex", pattern=",").tokenize(column)
    return get_tokenizer(tokenizer).tokenize(column)


def split_tokens(
    column: pa.Array | pa.ChunkedArray,
    tokenizer: str,
    *,
    lowercase: bool = False,
    regex: str | None = None,
    stopwords: frozenset[str] | None = None,
    strip: bool | None = None,
    fast: bool = True,
    keep_case: tuple[str, ...] = (),
) -> Ragged:
    """Tokenise a whole string column into :class:`Ragged` tokens (empty tokens dropped).

    Examples:
        >>> r = split_tokens(pa.array(["a  b", "", "C"]), "space", lowercase=True)
        >>> r.values.to_pylist(), r.offsets.tolist()
        (['a', 'b', 'c'], [0, 2, 2, 3])
    """
    col = to_string_array(column)
    if tokenizer == "characters":
        return codepoints(col, lowercase=lowercase)
    if (
        lowercase
    ):  # a whole value equal to one of keep_case (the missing-value fill) is not lower-cased
        col = lower_except(col, keep_case)
    if tokenizer not in TOKENIZERS:
        raise ConfigError(
            f"unknown tokenizer {tokenizer!r}; valid tokenizers: {', '.join(TOKENIZERS)}"
        )
    fast_tokens = _ascii_split(col, tokenizer) if fast else None
    if isinstance(
        fast_tokens, DictRagged
    ):  # no empty tokens, nothing to strip; stop words looked up per distinct token
        if not stopwords:
            return fast_tokens
        stop = pc.is_in(fast_tokens.dictionary, value_set=pa.array(sorted(stopwords), pa.string()))
        return fast_tokens.keep(~stop.to_numpy(zero_copy_only=False)[fast_tokens.indices])
    if fast_tokens is not None:
        rag = fast_tokens
        values = rag.values
        assert values is not None
        mask = pa.array(np.ones(len(values), bool))
    else:
        rag = Ragged.from_list(_split(col, tokenizer, regex))
        values = rag.values
        assert values is not None
        if strip is None or strip:  # also guards against stray whitespace seen in pyarrow 26
            # utf8_split_whitespace output (a last token keeping its trailing space; see the
            # fast-path test)
            values = pc.utf8_trim_whitespace(values)
            rag = Ragged(values, rag.offsets)
        mask = pc.greater(pc.binary_length(values), 0)
    if stopwords:
        mask = pc.and_(
            mask, pc.invert(pc.is_in(values, value_set=pa.array(sorted(stopwords), pa.string())))
        )
    return rag.keep(mask.to_numpy(zero_copy_only=False))
