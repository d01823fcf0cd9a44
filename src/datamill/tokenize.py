"""Tokenizers behind one interface, vectorised over whole columns.

Every tokenizer has a ``name`` and ``tokenize(texts) -> pa.ListArray`` (``list<string>``, one list
per input text). The rule-based ones (``characters``, ``space``, ``space_punct``, ``regex``) run as
a few ``pyarrow.compute`` kernels over the whole column, never a Python loop per text or per token.
The ``bpe`` / ``wordpiece`` ones wrap Hugging Face ``tokenizers`` (:class:`HFTokenizer`), which
encodes batches in parallel in Rust.

Null texts tokenise to empty lists.

Examples:
    >>> get_tokenizer("space_punct").tokenize(["Hello, world!"]).to_pylist()
    [['Hello', ',', 'world', '!']]
    >>> get_tokenizer("characters").tokenize(["héllo", ""]).to_pylist()
    [['h', 'é', 'l', 'l', 'o'], []]
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.checks import TOKENIZER_VOCAB
from datamill.core.errors import ConfigError, DataFileError
from datamill.core.io import PathLike, atomic_path, display_name, read_bytes, read_text
from datamill.core.ragged import encodings_to_csr

__all__ = [
    "TOKENIZERS",
    "CharTokenizer",
    "HFTokenizer",
    "RegexTokenizer",
    "SpacePunctTokenizer",
    "SpaceTokenizer",
    "Tokenizer",
    "as_string_array",
    "get_tokenizer",
    "normalize",
]

Texts: TypeAlias = "Sequence[str | None] | pa.Array | pa.ChunkedArray | np.ndarray[Any, Any]"

#: words (letters, digits, marks, underscore) or single punctuation/symbol characters (Ludwig's
#: ``SPACE_PUNCTUATION_REGEX`` ``\w+|[^\w\s]`` in RE2 syntax with Unicode classes)
_PUNCT = r"([^\p{L}\p{N}\p{M}_\s])"
#: Python's ``str.split()`` whitespace, in RE2 syntax
_WS = r"[\s\x{0b}\p{Z}\x{85}\x{1c}-\x{1f}]+"


def as_string_array(texts: Texts) -> pa.Array:
    """The texts as one contiguous ``pa.string()`` array, nulls replaced by ``""``.

    Examples:
        >>> as_string_array(["a", None]).to_pylist()
        ['a', '']
    """
    if isinstance(texts, pa.ChunkedArray):
        arr = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    elif isinstance(texts, pa.Array):
        arr = texts
    elif isinstance(texts, str):
        arr = pa.array([texts], pa.string())
    else:
        arr = pa.array(
            list(texts) if not isinstance(texts, np.ndarray) else texts.ravel().tolist(),
            pa.string(),
        )
    if pa.types.is_large_string(arr.type) or pa.types.is_string_view(arr.type):
        arr = arr.cast(pa.string())
    elif not pa.types.is_string(arr.type):
        if pa.types.is_null(arr.type):
            arr = arr.cast(pa.string())
        else:
            raise ConfigError(f"expected text (a string column), got {arr.type}")
    if arr.null_count:
        arr = pc.fill_null(arr, "")
    return arr


def normalize(
    texts: Texts, *, lowercase: bool = False, collapse_whitespace: bool = False
) -> pa.Array:
    """Lower-case and/or collapse whitespace, over the whole column.

    ``collapse_whitespace`` replaces every run of whitespace (Python's ``str.split()`` notion,
    Unicode included) by one space and strips both ends, so for one text ``s``,
    ``normalize([s], lowercase=True, collapse_whitespace=True)`` equals the seed's
    ``' '.join(s.lower().split())``. The seed's ``' '.join(' '.join(lines).lower().split())`` over a
    file is that applied to the lines joined by spaces. Lower-casing uses Arrow's (utf8proc)
    Unicode tables without special casing, which can differ from Python's ``str.lower`` for a few
    characters (U+0130, final sigma, some recent additions).

    Args:
        texts: the texts (list, numpy, or pyarrow array).
        lowercase: Unicode lower-casing (``utf8_lower``). Defaults to ``False``.
        collapse_whitespace: see above. Defaults to ``False``.

    Returns:
        a ``pa.string()`` array of the same length.

    Examples:
        >>> normalize(
        ...     ["  The  Time\\tMachine \\n", None], lowercase=True, collapse_whitespace=True
        ... ).to_pylist()
        ['the time machine', '']
    """
    arr = as_string_array(texts)
    if lowercase:
        arr = pc.utf8_lower(arr)
    if collapse_whitespace:
        arr = pc.utf8_trim_whitespace(pc.replace_substring_regex(arr, _WS, " "))
    return arr


def _drop_empty(lists: pa.ListArray) -> pa.ListArray:
    """Remove empty-string tokens from a ``list<string>`` array (vectorised)."""
    values = lists.flatten()
    keep = pc.greater(pc.binary_length(values), 0)
    if pc.all(keep).as_py() is not False:
        return lists
    n = len(lists)
    parents = pc.list_parent_indices(lists).to_numpy()
    keep_np = keep.to_numpy(zero_copy_only=False)
    counts = np.bincount(parents[keep_np], minlength=n)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), values.filter(keep))


def _lists(offsets: NDArray[Any], values: pa.Array) -> pa.ListArray:
    off = offsets.astype(np.int32 if offsets[-1] < 2**31 else np.int64, copy=False)
    if off.dtype == np.int64:
        return pa.LargeListArray.from_arrays(pa.array(off), values)
    return pa.ListArray.from_arrays(pa.array(off), values)


@runtime_checkable
class Tokenizer(Protocol):
    """A tokenizer: ``tokenize(texts) -> pa.ListArray`` of ``list<string>``, one list per text."""

    name: str

    def tokenize(self, texts: Texts) -> pa.ListArray:
        """Tokens of every text."""
        ...


class CharTokenizer:
    """One token per Unicode code point (the seed's character level).

    The whole column is decoded to code points in one call; a token string array is a dictionary
    ``take`` over the distinct code points.

    Examples:
        >>> CharTokenizer().tokenize(["ab c"]).to_pylist()
        [['a', 'b', ' ', 'c']]
    """

    name = "characters"

    def codepoints(self, texts: Texts) -> tuple[NDArray[np.uint32], NDArray[np.int64]]:
        """Code points of all texts, flat, and the per-text offsets (``len(texts) + 1``)."""
        arr = as_string_array(texts)
        lengths = pc.utf8_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
        offsets = np.zeros(len(arr) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if len(arr) == 0:
            return np.zeros(0, np.uint32), offsets
        byte_off = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4)
        data = arr.buffers()[2]
        raw = b"" if data is None else data.to_pybytes()[int(byte_off[0]) : int(byte_off[-1])]
        cps = np.frombuffer(raw.decode("utf-8").encode("utf-32-le"), np.uint32)
        return cps, offsets

    def tokenize(self, texts: Texts) -> pa.ListArray:
        """Characters of every text."""
        cps, offsets = self.codepoints(texts)
        uniq, inverse = np.unique(cps, return_inverse=True)
        chars = pa.array([chr(c) for c in uniq.tolist()], pa.string())  # one per distinct character
        return _lists(offsets, chars.take(pa.array(inverse.astype(np.int32))))


class SpaceTokenizer:
    """Whitespace-separated words (Python's ``str.split()``; ``pc.utf8_split_whitespace``).

    Examples:
        >>> SpaceTokenizer().tokenize([" the  cat\\n", ""]).to_pylist()
        [['the', 'cat'], []]
    """

    name = "space"

    def tokenize(self, texts: Texts) -> pa.ListArray:
        """Words of every text."""
        return _drop_empty(
            pc.utf8_split_whitespace(pc.utf8_trim_whitespace(as_string_array(texts)))
        )


class SpacePunctTokenizer:
    """Words and punctuation as separate tokens (Ludwig's ``space_punct``: ``\\w+|[^\\w\\s]``).

    Each punctuation or symbol character is its own token; words are runs of letters, digits,
    marks and ``_``.

    Examples:
        >>> SpacePunctTokenizer().tokenize(["Don't stop!!"]).to_pylist()
        [['Don', "'", 't', 'stop', '!', '!']]
    """

    name = "space_punct"

    def tokenize(self, texts: Texts) -> pa.ListArray:
        """Words and punctuation of every text."""
        spaced = pc.replace_substring_regex(as_string_array(texts), _PUNCT, r" \1 ")
        return _drop_empty(pc.utf8_split_whitespace(pc.utf8_trim_whitespace(spaced)))


class RegexTokenizer:
    """Split on a regular expression (RE2 syntax); empty pieces are dropped.

    Args:
        pattern: the separator pattern. Defaults to ``r"\\s+"``.

    Examples:
        >>> RegexTokenizer(pattern=r"[,;]\\s*").tokenize(["a, b;c,,d"]).to_pylist()
        [['a', 'b', 'c', 'd']]
    """

    name = "regex"

    def __init__(self, *, pattern: str = r"\s+") -> None:
        if not pattern:
            raise ConfigError("regex tokenizer: pattern must not be empty")
        self.pattern = pattern
        try:
            pc.split_pattern_regex(pa.array([""]), pattern)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ConfigError(f"regex tokenizer: invalid RE2 pattern {pattern!r}: {exc}") from exc

    def tokenize(self, texts: Texts) -> pa.ListArray:
        """Pieces between matches of ``pattern``."""
        return _drop_empty(pc.split_pattern_regex(as_string_array(texts), self.pattern))


def _iter_training_text(files_or_iterator: Any) -> tuple[Iterator[Any], int | None]:
    """Lines to train on from paths (files or ``zip:member``) or an iterable of strings."""
    if isinstance(files_or_iterator, (str, os.PathLike)):
        files_or_iterator = [files_or_iterator]
    items = files_or_iterator
    if (
        isinstance(items, (list, tuple))
        and items
        and all(isinstance(x, (str, os.PathLike)) for x in items)
        and all(isinstance(x, os.PathLike) or _looks_like_path(x) for x in items)
    ):

        def gen() -> Iterator[list[str]]:
            for src in items:
                lines = read_text(src).splitlines()
                for i in range(0, len(lines), 10_000):
                    yield lines[i : i + 10_000]

        return gen(), None
    return iter(items), None


def _looks_like_path(x: str) -> bool:
    from datamill.core.io import split_member

    return "\n" not in x and (Path(x).exists() or split_member(x)[1] is not None)


class HFTokenizer:
    """A Hugging Face ``tokenizers`` BPE or WordPiece model behind the datamill interface.

    Train with :meth:`train`, or wrap a file with :meth:`load`. ``inner`` is the
    ``tokenizers.Tokenizer``. Encoding never adds special tokens.

    Examples:
        >>> lines = ["the cat sat on the mat", "the dog sat on the log"] * 20
        >>> tok = HFTokenizer.train(lines, model="wordpiece", vocab_size=60, min_frequency=1)
        >>> tok.tokenize(["the cat"]).to_pylist()
        [['the', 'cat']]
        >>> ids, offsets = tok.encode_batch(["the cat", "a dog"])
        >>> offsets.tolist()[0], tok.decode(ids[offsets[0]:offsets[1]])
        (0, 'the cat')
    """

    def __init__(self, inner: Any, *, name: str | None = None) -> None:
        if not hasattr(inner, "model") or not hasattr(inner, "encode_batch"):
            raise TypeError(f"HFTokenizer wraps a tokenizers.Tokenizer, got {type(inner).__name__}")
        self.inner = inner
        model = type(inner.model).__name__.lower()
        self.name = name or (
            "wordpiece" if "wordpiece" in model else "bpe" if "bpe" in model else model
        )
        self._id2tok: pa.Array | None = None

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def train(
        cls,
        files_or_iterator: PathLike | Sequence[PathLike] | Iterable[str],
        *,
        model: Literal["bpe", "wordpiece"],
        vocab_size: int,
        special_tokens: Sequence[str] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
        lowercase: bool = True,
        min_frequency: int = 2,
    ) -> HFTokenizer:
        """Train a BPE or WordPiece model (whitespace/punctuation pre-tokenizer).

        Args:
            files_or_iterator: text files (``archive.zip:member`` allowed), or an iterable of texts.
            model: ``"bpe"`` or ``"wordpiece"``.
            vocab_size: the target vocabulary size (specials included).
            special_tokens: added first, in this order. Defaults to ``("[PAD]", "[UNK]", "[CLS]",
                "[SEP]", "[MASK]")``.
            lowercase: lower-case before splitting. Defaults to ``True``.
            min_frequency: merges/words rarer than this are not learnt. Defaults to ``2``.

        Returns:
            the trained tokenizer.

        Raises:
            ConfigError: unknown model or vocab_size < 1. DataFileError: unreadable file.
        """
        from tokenizers import Tokenizer as _Tok
        from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

        if model not in ("bpe", "wordpiece"):
            raise ConfigError(f"model must be 'bpe' or 'wordpiece', got {model!r}")
        TOKENIZER_VOCAB(vocab_size)
        specials = [special_tokens] if isinstance(special_tokens, str) else list(special_tokens)
        unk = "[UNK]" if "[UNK]" in specials else (specials[0] if specials else None)
        if model == "bpe":
            inner = _Tok(models.BPE(unk_token=unk, end_of_word_suffix="</w>"))
            trainer: Any = trainers.BpeTrainer(
                vocab_size=vocab_size,
                min_frequency=min_frequency,
                special_tokens=specials,
                end_of_word_suffix="</w>",
                show_progress=False,
            )
            inner.decoder = decoders.BPEDecoder(suffix="</w>")
        else:
            inner = _Tok(models.WordPiece(unk_token=unk or "[UNK]"))
            trainer = trainers.WordPieceTrainer(
                vocab_size=vocab_size,
                min_frequency=min_frequency,
                special_tokens=specials,
                show_progress=False,
            )
            inner.decoder = decoders.WordPiece()
        if lowercase:
            inner.normalizer = normalizers.Lowercase()
        inner.pre_tokenizer = pre_tokenizers.Whitespace()
        iterator, length = _iter_training_text(files_or_iterator)
        inner.train_from_iterator(iterator, trainer=trainer, length=length)
        return cls(inner, name=model)

    @classmethod
    def load(cls, path: PathLike) -> HFTokenizer:
        """Read a ``tokenizers`` JSON file (or ``archive.zip:member``).

        Raises:
            DataFileNotFoundError: no such file. DataFileError: not a tokenizer file.
        """
        from tokenizers import Tokenizer as _Tok

        data = read_bytes(path)
        try:
            inner = _Tok.from_str(data.decode("utf-8"))
        except Exception as exc:  # the library raises plain Exception subclasses
            raise DataFileError(
                f"not a tokenizers JSON file: {exc}",
                path=display_name(path),
                hint="pass a file written by HFTokenizer.save or tokenizers.Tokenizer.save",
            ) from exc
        return cls(inner)

    def save(self, path: PathLike) -> None:
        """Write the tokenizer JSON atomically."""
        with atomic_path(path) as tmp:
            self.inner.save(str(tmp))

    # -- encoding -----------------------------------------------------------------------------
    def encode_batch(self, texts: Texts) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
        """Ids of every text as CSR: flat int32 ids and int64 offsets (``len(texts) + 1``).

        Uses the library's parallel ``encode_batch_fast`` (no special tokens, no offsets).
        """
        strs = as_string_array(texts).to_pylist()
        ids, offsets = encodings_to_csr(
            self.inner.encode_batch_fast(strs, add_special_tokens=False)
        )
        return ids, offsets

    def _tokens_array(self) -> pa.Array:
        if self._id2tok is None:
            vocab = self.inner.get_vocab(with_added_tokens=True)
            toks = [""] * (max(vocab.values()) + 1 if vocab else 0)
            for t, i in vocab.items():
                toks[i] = t
            self._id2tok = pa.array(toks, pa.string())
        return self._id2tok

    def tokenize(self, texts: Texts) -> pa.ListArray:
        """Token strings of every text."""
        ids, offsets = self.encode_batch(texts)
        return _lists(offsets, self._tokens_array().take(pa.array(ids)))

    # -- vocabulary ---------------------------------------------------------------------------
    def token_to_id(self, token: str) -> int | None:
        """Id of ``token`` or ``None``."""
        out: int | None = self.inner.token_to_id(token)
        return out

    def id_to_token(self, i: int) -> str | None:
        """Token of id ``i`` or ``None``."""
        out: str | None = self.inner.id_to_token(int(i))
        return out

    @property
    def vocab_size(self) -> int:
        """Number of tokens (added tokens included)."""
        return int(self.inner.get_vocab_size(with_added_tokens=True))

    def get_vocab(self) -> dict[str, int]:
        """``{token: id}``."""
        out: dict[str, int] = self.inner.get_vocab(with_added_tokens=True)
        return out

    def decode(self, ids: Sequence[int] | NDArray[Any]) -> str:
        """Text of a sequence of ids (the model's decoder joins sub-words)."""
        out: str = self.inner.decode(
            [int(i) for i in np.asarray(ids).ravel()], skip_special_tokens=False
        )
        return out

    def __repr__(self) -> str:
        return f"HFTokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


def _hf_factory(model: Literal["bpe", "wordpiece"]) -> Callable[..., HFTokenizer]:
    def make(
        *, path: PathLike | None = None, files: Any = None, **train_params: Any
    ) -> HFTokenizer:
        if path is not None:
            tok = HFTokenizer.load(path)
            tok.name = model
            return tok
        if files is None:
            raise ConfigError(
                f"tokenizer {model!r} needs path= (a tokenizer file) or files= (text to train on)"
            )
        return HFTokenizer.train(files, model=model, **train_params)

    return make


#: name -> factory(**params) returning a Tokenizer
TOKENIZERS: dict[str, Callable[..., Any]] = {
    "characters": CharTokenizer,
    "space": SpaceTokenizer,
    "space_punct": SpacePunctTokenizer,
    "regex": RegexTokenizer,
    "bpe": _hf_factory("bpe"),
    "wordpiece": _hf_factory("wordpiece"),
}


def get_tokenizer(name: str, **params: Any) -> Tokenizer:
    """The tokenizer registered as ``name``, built with ``params``.

    ``bpe``/``wordpiece`` take ``path=`` (load a tokenizer file) or ``files=`` plus
    :meth:`HFTokenizer.train` arguments; ``regex`` takes ``pattern=``.

    Raises:
        ConfigError: unknown name (the message lists the valid ones) or bad parameters.

    Examples:
        >>> get_tokenizer("regex", pattern=r"\\|").tokenize(["a|b"]).to_pylist()
        [['a', 'b']]
        >>> get_tokenizer("chars")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: unknown tokenizer 'chars'; valid: bpe, characters, regex,
        space, space_punct, wordpiece
    """
    try:
        factory = TOKENIZERS[name]
    except KeyError:
        raise ConfigError(
            f"unknown tokenizer {name!r}; valid: {', '.join(sorted(TOKENIZERS))}"
        ) from None
    try:
        tok: Tokenizer = factory(**params)
    except TypeError as exc:
        raise ConfigError(f"tokenizer {name!r}: bad parameters {sorted(params)}: {exc}") from exc
    return tok
