"""text → two padded id matrices, characters and words, with two vocabularies (Ludwig 0.3 text).

HDF5 keys: ``<name>_char`` and ``<name>_word`` (0 = ``<PAD>``, 1 = ``<UNK>``; ids in the smallest
signed int dtype for each vocabulary, as Ludwig's ``int_type``), built like a
sequence feature each. Parameters use Ludwig's names: ``char_tokenizer`` (default ``characters``),
``char_most_common`` (70), ``char_sequence_length_limit`` (1024), ``word_tokenizer``
(``space_punct``), ``word_most_common`` (20000), ``word_sequence_length_limit`` (256),
``lowercase`` (true), ``padding`` (right/left); plus ``remove_stopwords`` (false; a small built-in
English list, applied to words after lowercasing) and ``word_regex`` for ``word_tokenizer: regex``.

Metadata is flat with a ``char_`` / ``word_`` prefix, as Ludwig lays it out: ``char_idx2str``,
``char_str2idx``, ``char_str2freq``, ``char_vocab_size``, ``char_max_sequence_length`` and the same
with ``word_``.

Modern Ludwig text (one token sequence, what transformer encoders need): with
``pretrained_model_name_or_path`` (a local ``tokenizer.json`` or a folder holding one; nothing is
downloaded) or ``tokenizer: hf_tokenizer``, the output is the single key ``<name>`` of the Hugging
Face tokenizer's ids, ``sequence_length`` / ``max_sequence_length`` (256) wide (see
:mod:`datamill.preprocessing.features._hf_text`). ``tokenizer`` set to another name is the word
tokenizer of the two-level layout.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray
from pydantic import Field

from datamill.core.constants import PAD, UNK
from datamill.core.errors import ConfigError
from datamill.core.ragged import pad
from datamill.preprocessing.features._hf_text import HFIds, hf_finalize, hf_tokens, hf_transform
from datamill.preprocessing.features._ragged import (
    STOPWORDS,
    compact,
    split_tokens,
    to_string_array,
)
from datamill.preprocessing.features.base import (
    COMMON_STRATEGIES,
    CSR,
    FeatureContext,
    FeatureHandler,
    int_type,
)
from datamill.preprocessing.features.base import Params as BaseParams
from datamill.preprocessing.features.set_ import RaggedStats, fit_tokens
from datamill.vocab import Vocab

__all__ = ["Handler", "TextParams", "TextStats"]

LEVELS: tuple[Literal["char", "word"], ...] = ("char", "word")


class TextParams(BaseParams):
    """``preprocessing:`` of a text feature."""

    char_tokenizer: str = "characters"
    char_most_common: int = Field(default=70, ge=1)
    char_sequence_length_limit: int = Field(default=1024, ge=1)
    word_tokenizer: str = "space_punct"
    word_regex: str | None = None
    word_most_common: int = Field(default=20000, ge=1)
    word_sequence_length_limit: int = Field(default=256, ge=1)
    lowercase: bool = True
    remove_stopwords: bool = False
    padding: Literal["right", "left"] = "right"
    tokenizer: str | None = None
    pretrained_model_name_or_path: str | None = None
    sequence_length: int | None = Field(default=None, ge=1)
    max_sequence_length: int = Field(default=256, ge=1)

    @property
    def hf(self) -> bool:
        """Whether this is a single-sequence Hugging Face tokenizer text feature."""
        return self.pretrained_model_name_or_path is not None or self.tokenizer == "hf_tokenizer"

    def hf_name(self) -> str:
        """The tokenizer location (``pretrained_model_name_or_path``).

        Raises:
            ConfigError: ``tokenizer: hf_tokenizer`` without it.
        """
        if self.pretrained_model_name_or_path is None:
            raise ConfigError("tokenizer: hf_tokenizer needs pretrained_model_name_or_path (a local tokenizer.json)")
        return self.pretrained_model_name_or_path


@dataclass(frozen=True)
class TextStats:
    """Mergeable statistics: one :class:`RaggedStats` per level."""

    char: RaggedStats
    word: RaggedStats

    def merge(self, other: TextStats) -> TextStats:
        """Merge level by level."""
        return TextStats(self.char.merge(other.char), self.word.merge(other.word))


class Handler(FeatureHandler):
    """Text feature handler.

    Examples:
        >>> import pyarrow as pa
        >>> from datamill.preprocessing.features import FeatureContext
        >>> h, ctx = Handler(), FeatureContext("review", "review", None, None)
        >>> p = h.Params()
        >>> meta = h.finalize(h.fit(pa.array(["Hi, you", "you"]), p, ctx), p, ctx)
        >>> meta["word_idx2str"], meta["char_vocab_size"]
        (['<PAD>', '<UNK>', 'you', ',', 'hi'], 9)
        >>> out = h.transform(pa.array(["you hi"]), meta, p, ctx)
        >>> out["review_word"].tolist(), out["review_char"].shape
        ([[2, 4, 0]], (1, 7))
    """

    type_name: ClassVar[str] = "text"
    Params: ClassVar[builtins.type[TextParams]] = TextParams
    input_type: ClassVar[str] = "string"
    missing_value_strategy: ClassVar[str] = "fill_with_const"
    fill_value: ClassVar[Any] = ""  # "<UNK>" would be tokenised into "<", "unk", ">"
    strategies: ClassVar[tuple[str, ...]] = COMMON_STRATEGIES
    defaults_key: ClassVar[str] = "text"

    def tokens(self, column: pa.Array, params: TextParams, ctx: FeatureContext) -> Any:
        col = to_string_array(column)
        if params.hf:
            return hf_tokens(col, params.hf_name(), ctx)
        word_tokenizer = params.tokenizer or params.word_tokenizer
        chars = split_tokens(col, params.char_tokenizer, lowercase=params.lowercase)
        words = split_tokens(col, word_tokenizer, lowercase=params.lowercase, regex=params.word_regex,
                             stopwords=STOPWORDS if params.remove_stopwords else None)
        return chars, words

    def take_rows(self, tokens: Any, mask: NDArray[np.bool_]) -> Any:
        if isinstance(tokens, HFIds):
            return tokens.take_rows(mask)
        return tokens[0].take_rows(mask), tokens[1].take_rows(mask)

    def compact_tokens(self, tokens: Any) -> Any:
        if isinstance(tokens, HFIds):
            return tokens
        return compact(tokens[0]), compact(tokens[1])

    def keys(self, name: str, params: Any = None) -> list[str]:
        if isinstance(params, TextParams) and params.hf:
            return [name]
        return [f"{name}_{level}" for level in LEVELS]

    def _tokens(self, column: Any, params: TextParams, ctx: FeatureContext) -> Any:
        return column if isinstance(column, (tuple, HFIds)) else self.tokens(column, params, ctx)

    def fit(self, column: Any, params: TextParams, ctx: FeatureContext) -> TextStats | int:
        tokens = self._tokens(column, params, ctx)
        if isinstance(tokens, HFIds):
            return int(np.diff(tokens.offsets).max()) if len(tokens.offsets) > 1 else 0
        chars, words = tokens
        return TextStats(fit_tokens(chars), fit_tokens(words))

    def merge(self, a: TextStats | int, b: TextStats | int) -> TextStats | int:
        if isinstance(a, int) and isinstance(b, int):
            return max(a, b)
        assert isinstance(a, TextStats) and isinstance(b, TextStats)
        return a.merge(b)

    def finalize(self, stats: TextStats | int, params: TextParams, ctx: FeatureContext) -> dict[str, Any]:
        if isinstance(stats, int):
            return hf_finalize(stats, params.hf_name(), params.sequence_length, params.max_sequence_length, ctx)
        meta: dict[str, Any] = {}
        for level, st, most, limit in (
            ("char", stats.char, params.char_most_common, params.char_sequence_length_limit),
            ("word", stats.word, params.word_most_common, params.word_sequence_length_limit),
        ):
            vocab = Vocab.from_counts(st.counts, max_size=most, specials=[PAD, UNK], unk_token=UNK)
            meta.update({f"{level}_{k}": v for k, v in vocab.to_dict().items()})
            meta[f"{level}_max_sequence_length"] = max(1, min(st.max_length, limit))  # never zero-width
        return meta

    def transform(self, column: Any, meta: dict[str, Any], params: TextParams,
                  ctx: FeatureContext) -> dict[str, NDArray[Any] | CSR]:
        tokens = self._tokens(column, params, ctx)
        if isinstance(tokens, HFIds):
            return {ctx.name: hf_transform(tokens, meta, params.padding, ctx)}
        out: dict[str, NDArray[Any] | CSR] = {}
        for level, rag in zip(LEVELS, tokens):
            ids = rag.encode(self.vocab(meta, level))
            out[f"{ctx.name}_{level}"] = pad(ids, rag.offsets, int(meta[f"{level}_max_sequence_length"]),
                                             side=params.padding, dtype=int_type(int(meta[f"{level}_vocab_size"])))[0]
        return out

    @staticmethod
    def vocab(meta: dict[str, Any], level: Literal["char", "word"]) -> Vocab:
        """The ``char`` or ``word`` vocabulary stored in a text feature's metadata."""
        return Vocab.from_dict({k[len(level) + 1:]: v for k, v in meta.items() if k.startswith(f"{level}_")})
