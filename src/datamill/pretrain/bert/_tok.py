"""The WordPiece tokenizer behind BERT sample building: train, load, check specials, encode to CSR.

Trains with the ``tokenizers`` library directly, with BERT's normalizer and pre-tokenizer (which
:class:`datamill.tokenize.HFTokenizer` does not use); encoding goes through
``HFTokenizer.encode_batch`` or the exact vectorised path of ``_bert_fasttok``. An HFTokenizer
*object* is accepted as ``tokenizer=`` through its ``.inner``. The rest of the BERT builder only sees
:class:`BertTokenizer` (ids of the special tokens, non-special ids, ``encode`` -> values + offsets).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.errors import ConfigError, DataFileError, DataFileNotFoundError
from datamill.core.ragged import concat_csr

__all__ = ["BERT_SPECIALS", "BertTokenizer", "resolve_tokenizer", "train_wordpiece"]

#: the special tokens every BERT tokenizer must have (PAD first so that it gets id 0 when trained)
BERT_SPECIALS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]")

_ENCODE_CHUNK = 8192  # sentences per encode_batch call (bounds the Encoding objects alive at once)
_FAST_CHUNK_BYTES = 2 << 20  # text per vectorised chunk (bounds the temporaries whatever the corpus)


def _slices(texts: Sequence[str] | pa.Array, size: int) -> Iterator[list[str] | pa.Array]:
    for lo in range(0, len(texts), size):
        yield texts[lo:lo + size] if isinstance(texts, pa.Array) else list(texts[lo:lo + size])


def _byte_slices(texts: Sequence[str] | pa.Array, nbytes: int) -> Iterator[pa.Array]:
    """Consecutive slices of about ``nbytes`` of text each (at least one line per slice)."""
    arr = texts if isinstance(texts, pa.Array) else pa.array(list(texts), pa.large_string())
    if len(arr) == 0:
        return
    ends = np.cumsum(pc.binary_length(arr).to_numpy(zero_copy_only=False).astype(np.int64))
    cuts = np.searchsorted(ends, np.arange(nbytes, int(ends[-1]), nbytes), side="left") + 1
    bounds = np.unique(np.concatenate([[0], cuts, [len(arr)]]))
    for lo, hi in itertools.pairwise(bounds):
        yield arr.slice(int(lo), int(hi - lo))


def _concat(parts: list[tuple[NDArray[np.int32], NDArray[np.int64]]]) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
    return concat_csr(parts, dtype=np.int32)


@dataclass(frozen=True)
class BertTokenizer:
    """A ``tokenizers.Tokenizer`` plus the ids BERT needs (``pad``, ``cls``, ``sep``, ``mask``, ``unk``)."""

    inner: Any
    pad: int
    cls: int
    sep: int
    mask: int
    unk: int
    vocab_size: int
    special_ids: tuple[int, ...]
    fast: dict[str, Any] | None = None  # see _bert_fasttok: exact vectorised path for BERT tokenizers

    def non_special_ids(self) -> NDArray[np.int32]:
        """Every id that is not a special token (the pool of the 10% random replacements)."""
        ids = np.arange(self.vocab_size, dtype=np.int32)
        return ids[~np.isin(ids, np.asarray(self.special_ids, dtype=np.int32))]

    def encode(self, texts: Sequence[str] | pa.Array) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
        """Encode sentences without special tokens -> (flat int32 ids, int64 offsets, len n+1)."""
        if self.fast is None:
            return self.encode_library(texts)
        from datamill.pretrain.bert._fasttok import WordCache, encode_lines

        cache = WordCache()
        parts = [encode_lines(self.inner, chunk, self.fast, cache) for chunk in _byte_slices(texts, _FAST_CHUNK_BYTES)]
        pa.default_memory_pool().release_unused()
        return _concat(parts)

    def encode_library(self, texts: Sequence[str] | pa.Array) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
        """:meth:`encode` through the library's batch encoder only (``HFTokenizer.encode_batch``, in chunks)."""
        from datamill.tokenize import HFTokenizer

        hf = HFTokenizer(self.inner)
        return _concat([hf.encode_batch(chunk) for chunk in _slices(texts, _ENCODE_CHUNK)])

    def decode_tokens(self, ids: Iterable[int]) -> list[str]:
        """Token strings of ``ids`` (no merging of word pieces)."""
        return [str(self.inner.id_to_token(int(i))) for i in ids]

    def to_json(self) -> str:
        """The tokenizer as the ``tokenizers`` JSON string."""
        return str(self.inner.to_str())

    @classmethod
    def wrap(cls, inner: Any, *, path: str | os.PathLike[str] | None = None) -> BertTokenizer:
        """Check that ``inner`` (a ``tokenizers.Tokenizer``) knows every BERT special token."""
        ids = {t: inner.token_to_id(t) for t in BERT_SPECIALS}
        missing = [t for t, i in ids.items() if i is None]
        if missing:
            msg = (f"the tokenizer lacks the BERT special tokens {missing}; expected all of "
                   f"{list(BERT_SPECIALS)}")
            hint = "train it with special_tokens=[PAD] [CLS] [SEP] [MASK] [UNK], or omit --tokenizer to train one"
            if path is not None:
                raise DataFileError(msg, path=path, hint=hint)
            raise ConfigError(msg, hint=hint)
        from datamill.pretrain.bert._fasttok import fast_path_config

        size = int(inner.get_vocab_size(with_added_tokens=True))
        return cls(inner=inner, pad=ids["[PAD]"], cls=ids["[CLS]"], sep=ids["[SEP]"],
                   mask=ids["[MASK]"], unk=ids["[UNK]"], vocab_size=size,
                   special_ids=tuple(sorted(int(v) for v in ids.values())), fast=fast_path_config(inner))


def train_wordpiece(sentences: Sequence[str] | pa.Array, *, vocab_size: int, lowercase: bool = True,
                    min_frequency: int = 2) -> BertTokenizer:
    """Train a BERT-style WordPiece tokenizer (BERT normalizer and pre-tokenizer) on ``sentences``."""

    def batches() -> Iterator[list[str]]:
        for chunk in _slices(sentences, _ENCODE_CHUNK):
            yield chunk.to_pylist() if isinstance(chunk, pa.Array) else chunk

    if vocab_size < len(BERT_SPECIALS) + 1:
        raise ConfigError(f"vocab_size must be > {len(BERT_SPECIALS)}, got {vocab_size}")
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    inner = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    inner.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    inner.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    inner.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                        special_tokens=list(BERT_SPECIALS), show_progress=False)
    inner.train_from_iterator(batches(), trainer=trainer, length=len(sentences))
    return BertTokenizer.wrap(inner)


def resolve_tokenizer(tokenizer: Any) -> BertTokenizer | None:
    """``None`` (train later), a path to a tokenizer JSON, an HFTokenizer or a ``tokenizers.Tokenizer``."""
    if tokenizer is None:
        return None
    if isinstance(tokenizer, BertTokenizer):
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        path = Path(tokenizer)
        if not path.exists():
            raise DataFileNotFoundError("no such tokenizer file", path=path,
                                        hint="pass a tokenizers JSON file, or omit it to train one")
        from tokenizers import Tokenizer

        try:
            inner = Tokenizer.from_file(os.fspath(path))
        except Exception as exc:  # the library raises a bare Exception on bad JSON
            raise DataFileError(f"cannot load a tokenizers JSON file: {exc}", path=path,
                                hint="save it with Tokenizer.save() / HFTokenizer.save()") from exc
        return BertTokenizer.wrap(inner, path=path)
    inner = getattr(tokenizer, "inner", tokenizer)  # datamill.tokenize.HFTokenizer keeps it in .inner
    if not (hasattr(inner, "token_to_id") and hasattr(inner, "encode_batch_fast")):
        raise ConfigError(f"tokenizer must be a path, a datamill HFTokenizer or a tokenizers.Tokenizer, "
                          f"got {type(tokenizer).__name__}")
    return BertTokenizer.wrap(inner)
