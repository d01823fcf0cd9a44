"""The WordPiece tokenizer behind BERT sample building: train, load, check specials, encode to CSR.

Trains with the ``tokenizers`` library directly, with BERT's normalizer and pre-tokenizer (which
:class:`datamill.tokenize.HFTokenizer` does not use); encoding goes through
``HFTokenizer.encode_batch`` or the exact vectorised path of ``_fasttok``; training goes through
word counts (``_wptrain``), both from one vectorised cut of the text (:func:`cut`). An HFTokenizer
*object* is accepted as ``tokenizer=`` through its ``.inner``. The rest of the BERT builder only
sees :class:`BertTokenizer` (ids of the special tokens, non-special ids, ``encode`` -> values +
offsets).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.errors import ConfigError, DataFileError, DataFileNotFoundError
from datamill.core.ragged import concat_csr
from datamill.pretrain.bert._fasttok import ChunkedText, cut_text, encode_chunked, fast_path_config

__all__ = [
    "BERT_SPECIALS",
    "BertTokenizer",
    "cut",
    "resolve_tokenizer",
    "train_wordpiece",
    "train_wordpiece_chunked",
    "train_wordpiece_library",
]

#: the special tokens every BERT tokenizer must have (PAD first so that it gets id 0 when trained)
BERT_SPECIALS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]")

_ENCODE_CHUNK = 8192  # sentences per encode_batch call (bounds the Encoding objects alive at once)
_FAST_CHUNK_BYTES = (
    4 << 20
)  # text per block of the vectorised cut (bounds the temporaries whatever the corpus)


def _slices(texts: Sequence[str] | pa.Array, size: int) -> Iterator[list[str] | pa.Array]:
    for lo in range(0, len(texts), size):
        yield texts[lo : lo + size] if isinstance(texts, pa.Array) else list(texts[lo : lo + size])


def _concat(
    parts: list[tuple[NDArray[np.int32], NDArray[np.int64]]],
) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
    return concat_csr(parts, dtype=np.int32)


@dataclass(frozen=True)
class BertTokenizer:
    """A ``tokenizers.Tokenizer`` plus the ids BERT needs (``pad``, ``cls``, ``sep``, ``mask``,
    ``unk``)."""

    inner: Any
    pad: int
    cls: int
    sep: int
    mask: int
    unk: int
    vocab_size: int
    special_ids: tuple[int, ...]
    fast: dict[str, Any] | None = (
        None  # see _bert_fasttok: exact vectorised path for BERT tokenizers
    )

    def non_special_ids(self) -> NDArray[np.int32]:
        """Every id that is not a special token (the pool of the 10% random replacements)."""
        ids = np.arange(self.vocab_size, dtype=np.int32)
        return ids[~np.isin(ids, np.asarray(self.special_ids, dtype=np.int32))]

    def encode(
        self, texts: Sequence[str] | pa.Array
    ) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
        """Encode sentences without special tokens -> (flat int32 ids, int64 offsets, len n+1)."""
        if self.fast is None:
            return self.encode_library(texts)
        return self.encode_chunked(cut(texts, lowercase=bool(self.fast["lowercase"])))

    def encode_chunked(self, text: ChunkedText) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
        """:meth:`encode` of lines already cut by :func:`cut` (the fast path only)."""
        if self.fast is None:
            raise ConfigError("this tokenizer has no vectorised path; use encode()")
        out = encode_chunked(self.inner, text, self.fast)
        pa.default_memory_pool().release_unused()
        return out

    def encode_library(
        self, texts: Sequence[str] | pa.Array
    ) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
        """:meth:`encode` through the library's batch encoder only (``HFTokenizer.encode_batch``, in
        chunks)."""
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
            msg = (
                f"the tokenizer lacks the BERT special tokens {missing}; expected all of "
                f"{list(BERT_SPECIALS)}"
            )
            hint = (
                "train it with special_tokens=[PAD] [CLS] [SEP] [MASK] [UNK], or omit "
                "--tokenizer to train one"
            )
            if path is not None:
                raise DataFileError(msg, path=path, hint=hint)
            raise ConfigError(msg, hint=hint)
        size = int(inner.get_vocab_size(with_added_tokens=True))
        return cls(
            inner=inner,
            pad=ids["[PAD]"],
            cls=ids["[CLS]"],
            sep=ids["[SEP]"],
            mask=ids["[MASK]"],
            unk=ids["[UNK]"],
            vocab_size=size,
            special_ids=tuple(sorted(int(v) for v in ids.values())),
            fast=fast_path_config(inner),
        )


def cut(texts: Sequence[str] | pa.Array, *, lowercase: bool) -> ChunkedText:
    """Cut lines once for both :func:`train_wordpiece_chunked` and
    :meth:`BertTokenizer.encode_chunked`."""
    return cut_text(texts, lowercase=lowercase, block_bytes=_FAST_CHUNK_BYTES)


def train_wordpiece(
    sentences: Sequence[str] | pa.Array,
    *,
    vocab_size: int,
    lowercase: bool = True,
    min_frequency: int = 2,
) -> BertTokenizer:
    """Train a BERT-style WordPiece tokenizer (BERT normalizer and pre-tokenizer) on ``sentences``.

    The result is the tokenizer ``tokenizers``' ``train_from_iterator`` makes from the sentences,
    reached from vectorised word counts (:mod:`datamill.pretrain.bert._wptrain`).
    """
    return train_wordpiece_chunked(
        cut(sentences, lowercase=lowercase), vocab_size=vocab_size, min_frequency=min_frequency
    )


def train_wordpiece_chunked(
    text: ChunkedText,
    *,
    vocab_size: int,
    min_frequency: int = 2,
    timings: dict[str, float] | None = None,
) -> BertTokenizer:
    """:func:`train_wordpiece` on lines already cut by :func:`cut` (lowercasing as they were cut);
    ``timings`` receives the seconds of the merge phase (``train_merges``)."""
    if vocab_size < len(BERT_SPECIALS) + 1:
        raise ConfigError(f"vocab_size must be > {len(BERT_SPECIALS)}, got {vocab_size}")
    from datamill.pretrain.bert._wptrain import train_from_chunks

    inner = train_from_chunks(
        text,
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(BERT_SPECIALS),
        timings=timings,
    )
    return BertTokenizer.wrap(inner)


def train_wordpiece_library(
    sentences: Sequence[str] | pa.Array,
    *,
    vocab_size: int,
    lowercase: bool = True,
    min_frequency: int = 2,
) -> BertTokenizer:
    """:func:`train_wordpiece` through the library's own ``train_from_iterator`` (the reference)."""

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
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(BERT_SPECIALS),
        show_progress=False,
    )
    inner.train_from_iterator(batches(), trainer=trainer, length=len(sentences))
    return BertTokenizer.wrap(inner)


def resolve_tokenizer(tokenizer: Any) -> BertTokenizer | None:
    """``None`` (train later), a path to a tokenizer JSON, an HFTokenizer or a
    ``tokenizers.Tokenizer``."""
    if tokenizer is None:
        return None
    if isinstance(tokenizer, BertTokenizer):
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        path = Path(tokenizer)
        if not path.exists():
            raise DataFileNotFoundError(
                "no such tokenizer file",
                path=path,
                hint="pass a tokenizers JSON file, or omit it to train one",
            )
        from tokenizers import Tokenizer

        try:
            inner = Tokenizer.from_file(os.fspath(path))
        except Exception as exc:  # the library raises a bare Exception on bad JSON
            raise DataFileError(
                f"cannot load a tokenizers JSON file: {exc}",
                path=path,
                hint="save it with Tokenizer.save() / HFTokenizer.save()",
            ) from exc
        return BertTokenizer.wrap(inner, path=path)
    inner = getattr(
        tokenizer, "inner", tokenizer
    )  # datamill.tokenize.HFTokenizer keeps it in .inner
    if not (hasattr(inner, "token_to_id") and hasattr(inner, "encode_batch_fast")):
        raise ConfigError(
            f"tokenizer must be a path, a datamill HFTokenizer or a tokenizers.Tokenizer, "
            f"got {type(tokenizer).__name__}"
        )
    return BertTokenizer.wrap(inner)
