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

Ludwig 0.17's text keys are accepted as written and mapped onto the word level of the two-level
layout: ``tokenizer`` (word tokenizer), ``most_common`` (caps ``word_most_common``),
``max_sequence_length`` (caps ``word_sequence_length_limit``), ``sequence_length`` (a fixed word
width), ``vocab_file`` (the word vocabulary), ``padding_symbol``/``unknown_symbol`` (the word
specials). ``layout: ludwig017`` instead writes Ludwig 0.17's single ``<name>`` tensor with its
defaults (a sequence feature with ``layout: ludwig017``: ``<EOS>``, ``<SOS>``, ``<PAD>``, ``<UNK>``
at 0-3, rows wrapped in start .. stop, ``tokenizer`` ``space_punct``, ``lowercase`` false, a
missing text filled with ``<UNK>`` before tokenising). ``ngram_size`` (only read by Ludwig's
``ngram`` tokenizer) and ``compute_idf`` (TF-IDF weights for an encoder) are accepted at their
defaults only; ``cache_encoder_embeddings`` is model-only (see :data:`MODEL_ONLY_KEYS`).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray
from pydantic import Field, model_validator

from datamill.core.constants import PAD, UNK
from datamill.core.errors import ConfigError
from datamill.core.ragged import pad
from datamill.preprocessing.features import sequence
from datamill.preprocessing.features._hf_text import HFIds, hf_finalize, hf_tokens, hf_transform
from datamill.preprocessing.features._ragged import (
    STOPWORDS,
    Ragged,
    compact,
    split_tokens,
    to_string_array,
)
from datamill.preprocessing.features.base import (
    CSR,
    FeatureContext,
    StringFeatureHandler,
    int_type,
)
from datamill.preprocessing.features.base import Params as BaseParams
from datamill.preprocessing.features.sequence import SequenceParams, vocab_from_file
from datamill.preprocessing.features.set_ import RaggedStats, fit_tokens
from datamill.vocab import Vocab

__all__ = ["MODEL_ONLY_KEYS", "Handler", "TextParams", "TextStats"]

LEVELS: tuple[Literal["char", "word"], ...] = ("char", "word")

#: accepted keys that only a model reads (no effect on the preprocessed output), with the reason
MODEL_ONLY_KEYS: dict[str, str] = {
    "cache_encoder_embeddings": "Ludwig caches a pretrained encoder's outputs; needs the model",
}
_LEVEL_KEYS = (
    "char_tokenizer",
    "char_most_common",
    "char_sequence_length_limit",
    "word_tokenizer",
    "word_regex",
    "word_most_common",
    "word_sequence_length_limit",
    "remove_stopwords",
)
_VOCAB_KEYS = ("most_common", "vocab_file", "padding_symbol", "unknown_symbol")


class TextParams(BaseParams):
    """``preprocessing:`` of a text feature."""

    char_tokenizer: str = "characters"
    char_most_common: int = Field(default=70, ge=1)
    char_sequence_length_limit: int = Field(default=1024, ge=1)
    word_tokenizer: str = "space_punct"
    word_regex: str | None = None
    word_most_common: int = Field(default=20000, ge=1)
    word_sequence_length_limit: int = Field(default=256, ge=1)
    #: None: the layout's default (``char_word`` true, ``ludwig017`` false as Ludwig 0.17)
    lowercase: bool | None = None
    remove_stopwords: bool = False
    padding: Literal["right", "left"] = "right"
    tokenizer: str | None = None
    pretrained_model_name_or_path: str | None = None
    sequence_length: int | None = Field(default=None, ge=1)
    max_sequence_length: int | None = Field(default=None, ge=1)
    #: ``char_word`` (``<name>_char`` + ``<name>_word``) or ``ludwig017`` (Ludwig 0.17's one
    # ``<name>`` tensor)
    layout: Literal["char_word", "ludwig017"] = "char_word"
    most_common: int | None = Field(default=None, ge=1)
    vocab_file: str | None = None
    padding_symbol: str = PAD
    unknown_symbol: str = UNK
    ngram_size: int = Field(default=2, ge=1)
    compute_idf: bool = False
    cache_encoder_embeddings: bool = False

    @model_validator(mode="after")
    def _keys_that_apply(self) -> TextParams:
        if self.ngram_size != 2:
            raise ValueError(
                "ngram_size is only read by Ludwig's `ngram` tokenizer, which datamill does not "
                "have; "
                "remove it"
            )
        if self.compute_idf:
            raise ValueError(
                "compute_idf (TF-IDF weights for an encoder) is not computed by datamill; remove it"
            )
        if self.padding_symbol == self.unknown_symbol:
            raise ValueError("padding_symbol and unknown_symbol must differ")
        given = self.model_fields_set
        if self.layout == "ludwig017" or self.hf:
            wrong = sorted(k for k in _LEVEL_KEYS if k in given)
            if wrong:
                what = (
                    "layout: ludwig017"
                    if self.layout == "ludwig017"
                    else "a Hugging Face tokenizer"
                )
                raise ValueError(
                    f"{', '.join(wrong)} apply to the char/word layout, not to {what}; remove them"
                )
        if self.hf:
            wrong = sorted(k for k in (*_VOCAB_KEYS, "lowercase") if k in given)
            if wrong:
                raise ValueError(
                    f"{', '.join(wrong)} do not apply to a Hugging Face tokenizer (its own "
                    "vocabulary); "
                    "remove them"
                )
        return self

    @property
    def lower(self) -> bool:
        """Whether text is lower-cased (``lowercase``, or the layout's default)."""
        if self.lowercase is not None:
            return self.lowercase
        return self.layout == "char_word"

    @property
    def word_limit(self) -> int:
        """The word level's width limit: ``word_sequence_length_limit`` capped by
        ``max_sequence_length``."""
        return min(
            self.word_sequence_length_limit,
            self.max_sequence_length or self.word_sequence_length_limit,
        )

    @property
    def word_most(self) -> int:
        """The word vocabulary's size limit: ``word_most_common`` capped by ``most_common``."""
        return min(self.word_most_common, self.most_common or self.word_most_common)

    def as_sequence(self) -> SequenceParams:
        """The sequence parameters of ``layout: ludwig017`` (Ludwig 0.17's text defaults)."""
        return SequenceParams(
            tokenizer=self.tokenizer or "space_punct",
            regex=self.word_regex,
            lowercase=self.lower,
            most_common=self.most_common or 20000,
            max_sequence_length=self.max_sequence_length or 256,
            padding=self.padding,
            vocab_file=self.vocab_file,
            sequence_length=self.sequence_length,
            padding_symbol=self.padding_symbol,
            unknown_symbol=self.unknown_symbol,
            layout="ludwig017",
        )

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
            raise ConfigError(
                "tokenizer: hf_tokenizer needs pretrained_model_name_or_path (a local "
                "tokenizer.json)"
            )
        return self.pretrained_model_name_or_path


@dataclass(frozen=True)
class TextStats:
    """Mergeable statistics: one :class:`RaggedStats` per level."""

    char: RaggedStats
    word: RaggedStats

    def merge(self, other: TextStats) -> TextStats:
        """Merge level by level."""
        return TextStats(self.char.merge(other.char), self.word.merge(other.word))


class Handler(StringFeatureHandler):
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
    fill_value: ClassVar[Any] = ""  # "<UNK>" would be tokenised into "<", "unk", ">"
    defaults_key: ClassVar[str] = "text"

    @classmethod
    def unfitted_fill(cls) -> Any:
        """Ludwig's schema default ``computed_fill_value`` of text: ``<UNK>``."""
        return "<UNK>"

    @classmethod
    def default_fill(cls, params: dict[str, Any]) -> Any:
        """``<UNK>`` with ``layout: ludwig017`` (Ludwig fills a missing text with it before
        tokenising), else ``""``."""
        return UNK if params.get("layout") == "ludwig017" else cls.fill_value

    _sequence = sequence.Handler()

    def tokens(self, column: pa.Array, params: TextParams, ctx: FeatureContext) -> Any:
        col = to_string_array(column)
        if params.hf:
            return hf_tokens(col, params.hf_name(), ctx)
        if params.layout == "ludwig017":
            return self._sequence.tokens(col, params.as_sequence(), ctx)
        word_tokenizer = params.tokenizer or params.word_tokenizer
        chars = split_tokens(col, params.char_tokenizer, lowercase=params.lower)
        words = split_tokens(
            col,
            word_tokenizer,
            lowercase=params.lower,
            regex=params.word_regex,
            stopwords=STOPWORDS if params.remove_stopwords else None,
        )
        return chars, words

    def take_rows(self, tokens: Any, mask: NDArray[np.bool_]) -> Any:
        if isinstance(tokens, (HFIds, Ragged)):
            return tokens.take_rows(mask)
        return tokens[0].take_rows(mask), tokens[1].take_rows(mask)

    def compact_tokens(self, tokens: Any) -> Any:
        if isinstance(tokens, HFIds):
            return tokens
        if isinstance(tokens, Ragged):
            return compact(tokens)
        return compact(tokens[0]), compact(tokens[1])

    def keys(self, name: str, params: Any = None) -> list[str]:
        if isinstance(params, TextParams) and (params.hf or params.layout == "ludwig017"):
            return [name]
        return [f"{name}_{level}" for level in LEVELS]

    def _tokens(self, column: Any, params: TextParams, ctx: FeatureContext) -> Any:
        return (
            column
            if isinstance(column, (tuple, HFIds, Ragged))
            else self.tokens(column, params, ctx)
        )

    def fit(
        self, column: Any, params: TextParams, ctx: FeatureContext
    ) -> TextStats | RaggedStats | int:
        tokens = self._tokens(column, params, ctx)
        if isinstance(tokens, HFIds):
            return int(np.diff(tokens.offsets).max()) if len(tokens.offsets) > 1 else 0
        if isinstance(tokens, Ragged):
            return fit_tokens(tokens)
        chars, words = tokens
        return TextStats(fit_tokens(chars), fit_tokens(words))

    def merge(
        self, a: TextStats | RaggedStats | int, b: TextStats | RaggedStats | int
    ) -> TextStats | RaggedStats | int:
        if isinstance(a, int) and isinstance(b, int):
            return max(a, b)
        if isinstance(a, RaggedStats) and isinstance(b, RaggedStats):
            return a.merge(b)
        assert isinstance(a, TextStats) and isinstance(b, TextStats)
        return a.merge(b)

    def finalize(
        self, stats: TextStats | RaggedStats | int, params: TextParams, ctx: FeatureContext
    ) -> dict[str, Any]:
        if isinstance(stats, int):
            return hf_finalize(
                stats,
                params.hf_name(),
                params.sequence_length,
                params.max_sequence_length or 256,
                ctx,
            )
        if isinstance(stats, RaggedStats):
            meta = self._sequence.finalize(stats, params.as_sequence(), ctx)
            return {
                **meta,
                "layout": "ludwig017",
                "padding_symbol": params.padding_symbol,
                "unknown_symbol": params.unknown_symbol,
                "pad_idx": 2,
            }
        meta = {}
        char = Vocab.from_counts(
            stats.char.counts, max_size=params.char_most_common, specials=[PAD, UNK], unk_token=UNK
        )
        word_specials = [params.padding_symbol, params.unknown_symbol]
        if params.vocab_file is not None:
            listed = vocab_from_file(params.vocab_file, ctx, word_specials, params.unknown_symbol)
            word = Vocab(
                listed.idx2str,
                str2freq=stats.word.counts.as_dict(),
                unk_token=params.unknown_symbol,
                specials=word_specials,
            )
        else:
            word = Vocab.from_counts(
                stats.word.counts,
                max_size=params.word_most,
                specials=word_specials,
                unk_token=params.unknown_symbol,
            )
        for level, vocab, st, limit in (
            ("char", char, stats.char, params.char_sequence_length_limit),
            ("word", word, stats.word, params.word_limit),
        ):
            meta.update({f"{level}_{k}": v for k, v in vocab.to_dict().items()})
            meta[f"{level}_max_sequence_length"] = max(
                1, min(st.max_length, limit)
            )  # never zero-width
        if params.sequence_length is not None:
            meta["word_max_sequence_length"] = params.sequence_length
        return meta

    def transform(
        self, column: Any, meta: dict[str, Any], params: TextParams, ctx: FeatureContext
    ) -> dict[str, NDArray[Any] | CSR]:
        tokens = self._tokens(column, params, ctx)
        if isinstance(tokens, HFIds):
            return {ctx.name: hf_transform(tokens, meta, params.padding, ctx)}
        if isinstance(tokens, Ragged):
            return self._sequence.transform(tokens, meta, params.as_sequence(), ctx)
        out: dict[str, NDArray[Any] | CSR] = {}
        for level, rag in zip(LEVELS, tokens):
            ids = rag.encode(self.vocab(meta, level))
            out[f"{ctx.name}_{level}"] = pad(
                ids,
                rag.offsets,
                int(meta[f"{level}_max_sequence_length"]),
                side=params.padding,
                dtype=int_type(int(meta[f"{level}_vocab_size"])),
            )[0]
        return out

    @staticmethod
    def vocab(meta: dict[str, Any], level: Literal["char", "word"]) -> Vocab:
        """The ``char`` or ``word`` vocabulary stored in a text feature's metadata."""
        return Vocab.from_dict(
            {k[len(level) + 1 :]: v for k, v in meta.items() if k.startswith(f"{level}_")}
        )
