"""Token ids of a BERT Parquet dataset decoded with the tokenizer beside it
(``<stem>.tokenizer.json``, written by ``build_bert_samples``), for the samples page.

Examples:
    >>> tokenizer_vocab("/no/such/file.parquet") is None
    True
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["TOKEN_COLUMNS", "TokenizerVocab", "tokenizer_vocab"]

TOKEN_COLUMNS = ("tokens", "masked_labels")
"""The columns of a BERT Parquet dataset that hold token ids."""


class TokenizerVocab:
    """``decode(ids) -> tokens`` over a Hugging Face ``tokenizers`` tokenizer (the samples page's
    vocabulary interface); an id the tokenizer does not know reads ``<id N>``."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def decode(self, ids: NDArray[np.int64]) -> NDArray[np.str_]:
        """The token of each id."""
        out = [self.tokenizer.id_to_token(int(i)) for i in ids.tolist()]  # a cell: <= 512 ids
        return np.asarray([f"<id {i}>" if t is None else t for i, t in zip(ids, out, strict=True)])


def tokenizer_vocab(path: str | os.PathLike[str]) -> TokenizerVocab | None:
    """The tokenizer beside a Parquet file (``<stem>.tokenizer.json``), or ``None`` when there is
    none (or ``tokenizers`` is not installed, or the file cannot be read)."""
    p = Path(path)
    tok = p.with_suffix(".tokenizer.json")
    if p.suffix not in (".parquet", ".pq") or not tok.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    try:
        return TokenizerVocab(Tokenizer.from_file(str(tok)))
    except Exception:  # noqa: BLE001 - a tokenizer that cannot be read: ids are shown as ids
        return None
