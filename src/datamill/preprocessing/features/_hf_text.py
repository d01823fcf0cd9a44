"""Private: modern Ludwig text (one token sequence) with a Hugging Face ``tokenizers`` file.

Used by the text type when ``pretrained_model_name_or_path`` (or ``tokenizer: hf_tokenizer``) is
set. The tokenizer comes from a **local** file: a ``tokenizer.json`` or a folder holding one (as
``save_pretrained`` writes it); nothing is downloaded, a hub name is refused. Rows are encoded with
the tokenizer's own special tokens (its post-processor: ``[CLS] ... [SEP]`` for BERT), as Ludwig's
``HFTokenizer`` does, padded with the tokenizer's ``padding_symbol`` id (``[PAD]``/``<pad>`` found
in its vocabulary, else 0) to ``sequence_length`` or ``min(longest row, max_sequence_length)``;
longer rows keep their first tokens. Output: ``<name>`` ids in the smallest signed int dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.errors import ConfigError
from datamill.core.ragged import encodings_to_csr, pad
from datamill.preprocessing.features.base import FeatureContext, int_type

__all__ = ["HFIds", "hf_finalize", "hf_tokens", "hf_transform", "tokenizer_path"]

_PAD_NAMES = ("[PAD]", "<pad>", "<PAD>", "<|pad|>")


@dataclass(frozen=True)
class HFIds:
    """Token ids of a block as CSR."""

    ids: NDArray[np.int32]
    offsets: NDArray[np.int64]

    def take_rows(self, mask: NDArray[np.bool_]) -> HFIds:
        """The rows where ``mask`` is true."""
        rows = np.flatnonzero(mask)
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        lengths = ends - starts
        offsets = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.repeat(starts - offsets[:-1], lengths) + np.arange(
            int(offsets[-1]), dtype=np.int64
        )
        return HFIds(self.ids[flat], offsets)


def tokenizer_path(name: str, ctx: FeatureContext) -> Path:
    """The local ``tokenizer.json`` that ``name`` points to (relative to the dataset's folder).

    Raises:
        ConfigError: no such local file or folder (nothing is downloaded).
    """
    path = Path(name)
    if not path.is_absolute() and ctx.base_dir is not None and not path.exists():
        path = ctx.base_dir / path
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(
            f"feature {ctx.name!r}: pretrained_model_name_or_path {name!r} is not a local "
            "tokenizer.json (or a folder holding one); datamill downloads nothing",
            path=str(path),
            hint="save the tokenizer locally (tokenizer.save_pretrained(DIR)) and "
            "point to that folder",
        )
    return path


@lru_cache(maxsize=8)
def _load(path: str) -> Any:
    from datamill.tokenize import HFTokenizer

    return HFTokenizer.load(path).inner


def hf_tokens(column: pa.Array, name: str, ctx: FeatureContext) -> HFIds:
    """One block's token ids (with the tokenizer's special tokens)."""
    tok = _load(str(tokenizer_path(name, ctx)))
    ids, offsets = encodings_to_csr(
        tok.encode_batch_fast(column.to_pylist(), add_special_tokens=True)
    )
    return HFIds(np.asarray(ids, np.int32), np.asarray(offsets, np.int64))


def hf_finalize(
    longest: int,
    name: str,
    sequence_length: int | None,
    max_sequence_length: int,
    ctx: FeatureContext,
) -> dict[str, Any]:
    """The metadata: the tokenizer's vocabulary (``idx2str``), its pad id and the padded width."""
    path = tokenizer_path(name, ctx)
    tok = _load(str(path))
    vocab = tok.get_vocab(with_added_tokens=True)
    idx2str = [""] * (max(vocab.values()) + 1 if vocab else 0)
    for token, i in vocab.items():
        idx2str[i] = token
    pad_id = next((vocab[p] for p in _PAD_NAMES if p in vocab), 0)
    return {
        "idx2str": idx2str,
        "vocab_size": len(idx2str),
        "pad_id": pad_id,
        "tokenizer_file": str(path),
        "max_sequence_length": sequence_length or max(1, min(longest, max_sequence_length)),
    }


def hf_transform(
    ids: HFIds, meta: dict[str, Any], padding: str, ctx: FeatureContext
) -> NDArray[Any]:
    """The padded id matrix of one block."""
    out: NDArray[Any] = pad(
        ids.ids,
        ids.offsets,
        int(meta["max_sequence_length"]),
        fill=int(meta["pad_id"]),
        side="left" if padding == "left" else "right",
        dtype=int_type(int(meta["vocab_size"])),
    )[0]
    return out
