"""set → int8 multi-hot rows over the set vocabulary (Ludwig's set feature).

Each value is tokenised (``tokenizer``, default ``space``); the vocabulary is ``<PAD>`` (0),
``<UNK>`` (1), then the ``most_common`` most frequent tokens (occurrences counted over all rows;
ties by token ascending). Row ``i`` of the output has a 1 in column ``j`` when token ``j`` occurs in
row ``i`` (column 0 stays 0; unknown tokens set column 1).

Layout: dense ``n × vocab_size`` int8 while ``n_fit × vocab_size`` bytes stays under
``max_dense_bytes`` (default 256 MiB; ``n_fit`` = rows the statistics were fitted on); above that
the metadata records ``layout: "csr"`` and transform returns a :class:`CSR` (per row the sorted
distinct token ids in ``indices[offsets[i]:offsets[i+1]]``), written as the HDF5 group ``<name>``
with datasets ``indices``/``offsets`` and attributes ``layout="csr"``, ``vocab_size``. The choice is
made once in ``finalize`` so every block and later unseen data use the same layout.

Metadata: the vocabulary (``idx2str``/``str2idx``/``str2freq``/``vocab_size``), ``max_set_size``
(most tokens in one row) and ``layout``.

``layout: ludwig017`` gives Ludwig 0.17's rows: a set is bool over a vocabulary without ``<PAD>``,
``<UNK>`` moved to id 3 (Ludwig's ``add_or_move_symbol``); a bag has ``<EOS>``, ``<SOS>``,
``<PAD>``, ``<UNK>`` at 0-3; ``max_set_size`` is the most tokens in one row + 2, as Ludwig stores
it.
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

#: Ludwig 0.17's special symbols (stop, start, padding, unknown at ids 0-3)
LUDWIG_SPECIALS = ("<EOS>", "<SOS>", PAD, UNK)
from datamill.preprocessing.features._ragged import Ragged, compact, split_tokens
from datamill.preprocessing.features.base import (
    CSR,
    FeatureContext,
    StringFeatureHandler,
)
from datamill.preprocessing.features.base import Params as BaseParams
from datamill.vocab import TokenCounts, Vocab

__all__ = ["Handler", "RaggedStats", "SetParams", "TokenFeatureHandler", "TokenParams"]

DEFAULT_MAX_DENSE_BYTES = 256 * 2**20


class TokenParams(BaseParams):
    """The tokenising and vocabulary settings every tokenised feature (set, sequence) has."""

    tokenizer: str = "space"
    regex: str | None = None
    lowercase: bool = False
    most_common: int = Field(default=10000, ge=1)
    min_frequency: int = Field(default=1, ge=1)


class SetParams(TokenParams):
    """``preprocessing:`` of a set feature."""

    max_dense_bytes: int = Field(default=DEFAULT_MAX_DENSE_BYTES, ge=0)
    #: ``datamill`` (``<PAD>`` 0, ``<UNK>`` 1, int8/float32) or ``ludwig017`` (Ludwig 0.17's
    # vocabulary and dtype)
    layout: Literal["datamill", "ludwig017"] = "datamill"


@dataclass(frozen=True)
class RaggedStats:
    """Mergeable statistics of a tokenised column: token counts, longest row, rows seen."""

    counts: TokenCounts
    max_length: int
    rows: int

    def merge(self, other: RaggedStats) -> RaggedStats:
        """Sum counts and rows; keep the longest row."""
        return RaggedStats(
            self.counts.merge(other.counts),
            max(self.max_length, other.max_length),
            self.rows + other.rows,
        )


def fit_tokens(rag: Ragged) -> RaggedStats:
    """Statistics of one block of tokens."""
    longest = int(rag.lengths.max()) if len(rag) else 0
    return RaggedStats(rag.count(), longest, len(rag))


class TokenFeatureHandler(StringFeatureHandler):
    """A type read as rows of tokens (set, bag, sequence): ``tokens`` splits a block once (a
    :class:`Ragged`), ``fit`` counts the tokens (:class:`RaggedStats`), and a missing value is the
    unknown token; a subclass declares ``tokens``, ``finalize`` and ``transform``."""

    fill_value: ClassVar[Any] = UNK

    def take_rows(self, tokens: Ragged, mask: NDArray[np.bool_]) -> Ragged:
        return tokens.take_rows(mask)

    def compact_tokens(self, tokens: Ragged) -> Ragged:
        return compact(tokens)

    def _tokens(
        self, column: pa.Array | Ragged, params: TokenParams, ctx: FeatureContext
    ) -> Ragged:
        return column if isinstance(column, Ragged) else self.tokens(column, params, ctx)

    def fit(
        self, column: pa.Array | Ragged, params: TokenParams, ctx: FeatureContext
    ) -> RaggedStats:
        return fit_tokens(self._tokens(column, params, ctx))

    def merge(self, a: RaggedStats, b: RaggedStats) -> RaggedStats:
        return a.merge(b)


class Handler(TokenFeatureHandler):
    """Set feature handler (bag subclasses it with float32 frequencies).

    Examples:
        >>> import pyarrow as pa
        >>> from datamill.preprocessing.features import FeatureContext
        >>> h, ctx = Handler(), FeatureContext("tags", "tags", None, None)
        >>> p = h.Params()
        >>> col = pa.array(["a b", "b", "c b"])
        >>> meta = h.finalize(h.fit(col, p, ctx), p, ctx)
        >>> meta["idx2str"], meta["max_set_size"]
        (['<PAD>', '<UNK>', 'b', 'a', 'c'], 2)
        >>> h.transform(pa.array(["a b", "z"]), meta, p, ctx)["tags"].tolist()
        [[0, 0, 1, 1, 0], [0, 1, 0, 0, 0]]
    """

    type_name: ClassVar[str] = "set"
    Params: ClassVar[builtins.type[SetParams]] = SetParams
    defaults_key: ClassVar[str] = "set"
    dtype: ClassVar[builtins.type[np.generic]] = np.int8
    size_key: ClassVar[str] = "max_set_size"

    def tokens(self, column: pa.Array, params: SetParams, ctx: FeatureContext) -> Ragged:
        return split_tokens(
            column,
            params.tokenizer,
            lowercase=params.lowercase,
            regex=params.regex,
            keep_case=(UNK,),
        )

    def _ludwig_vocab(self, stats: RaggedStats, params: SetParams) -> Vocab:
        """Ludwig 0.17's vocabulary: the most frequent tokens laid out by :meth:`_ludwig_layout`."""
        plain = Vocab.from_counts(
            stats.counts,
            min_freq=params.min_frequency,
            max_size=params.most_common,
            specials=(),
            unk_token=None,
        )
        tokens, specials = self._ludwig_layout(list(plain.idx2str))
        return Vocab(tokens, str2freq=stats.counts.as_dict(), unk_token=UNK, specials=specials)

    def _ludwig_layout(self, frequent: list[str]) -> tuple[list[str], list[str]]:
        """Ludwig 0.17's set vocabulary (and its specials): the most frequent tokens, ``<UNK>``
        moved to id 3."""
        tokens = [t for t in frequent if t != UNK]
        return [*tokens[:3], UNK, *tokens[3:]], [UNK]

    def finalize(
        self, stats: RaggedStats, params: SetParams, ctx: FeatureContext
    ) -> dict[str, Any]:
        if params.layout == "ludwig017":
            vocab = self._ludwig_vocab(stats, params)
            longest = stats.max_length + 2  # as Ludwig stores it (room for start and stop symbols)
        else:
            vocab = Vocab.from_counts(
                stats.counts,
                min_freq=params.min_frequency,
                max_size=params.most_common,
                specials=[PAD, UNK],
                unk_token=UNK,
            )
            longest = stats.max_length
        dense_bytes = stats.rows * len(vocab) * np.dtype(self._dtype(params)).itemsize
        layout = "dense" if dense_bytes <= params.max_dense_bytes else "csr"
        return {**vocab.to_dict(), self.size_key: longest, "layout": layout}

    def _dtype(self, params: SetParams) -> builtins.type[np.generic]:
        return np.bool_ if params.layout == "ludwig017" and self.dtype == np.int8 else self.dtype

    def transform(
        self,
        column: pa.Array | Ragged,
        meta: dict[str, Any],
        params: SetParams,
        ctx: FeatureContext,
    ) -> dict[str, NDArray[Any] | CSR]:
        rag = self._tokens(column, params, ctx)
        vocab = Vocab.from_dict(meta)
        size = len(vocab)
        n = len(rag)
        key = rag.row_ids * size + rag.encode(vocab).astype(np.int64)
        if meta.get("layout", "dense") == "dense":
            return {ctx.name: self._dense(key, n, size).astype(self._dtype(params), copy=False)}
        uniq, counts = np.unique(key, return_counts=True)  # sorted: by row, then by id
        rows, ids = np.divmod(uniq, size)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(rows, minlength=n), out=offsets[1:])
        values = counts.astype(np.float32) if self.dtype == np.float32 else None
        return {ctx.name: CSR(ids.astype(np.int32), offsets, size, values)}

    def _dense(self, key: NDArray[np.int64], n: int, size: int) -> NDArray[Any]:
        out = np.zeros(n * size, self.dtype)
        out[key] = 1
        return out.reshape(n, size)
