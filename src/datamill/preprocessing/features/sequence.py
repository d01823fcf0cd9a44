"""sequence → ``n × l`` token ids, 0 = ``<PAD>``, 1 = ``<UNK>`` (Ludwig's sequence feature).

The ids' dtype is the smallest signed integer holding the vocabulary (Ludwig's ``int_type``).

Each value is tokenised (``tokenizer``, default ``space``), tokens mapped through a vocabulary
(``<PAD>``, ``<UNK>``, then the ``most_common`` most frequent, ties by token ascending; or the
tokens of ``vocab_file``, one per line, in that order). ``l = min(longest row,
max_sequence_length)`` is fixed at fit time (at least 1, so the matrix is never zero-width) and
stored in the metadata as ``max_sequence_length``; longer rows keep their
first ``l`` tokens; ``padding: right`` (default) or ``left``.

Ludwig's options: ``sequence_length`` fixes ``l`` whatever the data; ``padding_symbol`` and
``unknown_symbol`` name ids 0 and 1; ``start_stop: true`` wraps every row in ``start_symbol``
(``<SOS>``) and ``stop_symbol`` (``<EOS>``), ids 2 and 3, counted in ``l`` (what seq2seq outputs
need). datamill keeps padding at id 0 (Ludwig 0.5+ puts ``<EOS>``, ``<SOS>``, ``<PAD>``, ``<UNK>``
at 0-3): the ids differ, the tokens do not. ``layout: ludwig017`` gives Ludwig 0.17's ids:
``<EOS>``, ``<SOS>``, ``<PAD>``, ``<UNK>`` (stop, start, padding and unknown symbols) at 0-3, every
row wrapped in start .. stop (the stop symbol cut with the rest of a row longer than the width), the
width ``min(longest + 2, max_sequence_length)``.
"""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray
from pydantic import Field

from datamill.core.constants import PAD, UNK
from datamill.core.errors import ConfigError
from datamill.core.io import read_text
from datamill.core.ragged import pad
from datamill.preprocessing.features._ragged import Ragged, split_tokens
from datamill.preprocessing.features.base import (
    CSR,
    FeatureContext,
    int_type,
)
from datamill.preprocessing.features.set_ import RaggedStats, TokenFeatureHandler, TokenParams
from datamill.vocab import Vocab

__all__ = ["Handler", "SequenceParams"]


class SequenceParams(TokenParams):
    """``preprocessing:`` of a sequence feature."""

    most_common: int = Field(default=20000, ge=1)
    max_sequence_length: int = Field(default=256, ge=1)
    padding: Literal["right", "left"] = "right"
    vocab_file: str | None = None
    sequence_length: int | None = Field(default=None, ge=1)
    padding_symbol: str = PAD
    unknown_symbol: str = UNK
    start_stop: bool = False
    start_symbol: str = "<SOS>"
    stop_symbol: str = "<EOS>"
    #: ``datamill`` (``<PAD>`` 0, ``<UNK>`` 1) or ``ludwig017`` (Ludwig 0.17's ids and start/stop
    # wrapping)
    layout: Literal["datamill", "ludwig017"] = "datamill"

    @property
    def wrapped(self) -> bool:
        """Whether every row is wrapped in the start and stop symbols."""
        return self.start_stop or self.layout == "ludwig017"

    def specials(self) -> list[str]:
        """The special tokens at ids 0.. (padding, unknown, then start and stop when ``start_stop``;
        Ludwig 0.17's stop, start, padding, unknown with ``layout: ludwig017``)."""
        if self.layout == "ludwig017":
            return [self.stop_symbol, self.start_symbol, self.padding_symbol, self.unknown_symbol]
        return [
            self.padding_symbol,
            self.unknown_symbol,
            *([self.start_symbol, self.stop_symbol] if self.start_stop else []),
        ]

    def special_ids(self) -> dict[str, int]:
        """Ids of the ``pad``, ``unk``, ``start`` and ``stop`` symbols (start/stop only when
        wrapped)."""
        if self.layout == "ludwig017":
            return {"stop": 0, "start": 1, "pad": 2, "unk": 3}
        return {"pad": 0, "unk": 1, **({"start": 2, "stop": 3} if self.start_stop else {})}


def add_start_stop(
    ids: NDArray[Any], offsets: NDArray[np.int64], start: int, stop: int
) -> tuple[NDArray[Any], NDArray[np.int64]]:
    """Every CSR row wrapped in ``start`` .. ``stop`` (vectorised).

    Examples:
        >>> v, o = add_start_stop(np.array([5, 6, 7]), np.array([0, 2, 2, 3]), 2, 3)
        >>> v.tolist(), o.tolist()
        ([2, 5, 6, 3, 2, 3, 2, 7, 3], [0, 4, 6, 9])
    """
    offsets = np.asarray(offsets, np.int64)
    n = len(offsets) - 1
    new_offsets = offsets - offsets[0] + 2 * np.arange(n + 1, dtype=np.int64)
    out = np.empty(int(new_offsets[-1]), dtype=ids.dtype)
    out[new_offsets[:-1]] = start
    out[new_offsets[1:] - 1] = stop
    body = np.ones(len(out), bool)
    body[new_offsets[:-1]] = False
    body[new_offsets[1:] - 1] = False
    out[body] = ids[offsets[0] : offsets[-1]]
    return out, new_offsets


def vocab_from_file(
    path: str, ctx: FeatureContext, specials: list[str] | None = None, unk_token: str | None = None
) -> Vocab:
    """The specials (``<PAD>``, ``<UNK>``) then the file's tokens (one per line, first occurrence
    kept)."""
    specials = specials or [PAD, UNK]
    unk_token = unk_token or specials[1]
    full = Path(path)
    if not full.is_absolute() and ctx.base_dir is not None:
        full = ctx.base_dir / full
    try:
        text = read_text(full)
    except FileNotFoundError as exc:
        raise ConfigError(
            f"feature {ctx.name!r}: vocab_file not found: {full}", path=str(full)
        ) from exc
    tokens = [
        t
        for t in dict.fromkeys(line.strip() for line in text.splitlines())
        if t and t not in specials
    ]
    return Vocab([*specials, *tokens], unk_token=unk_token, specials=specials)


class Handler(TokenFeatureHandler):
    """Sequence feature handler.

    Examples:
        >>> import pyarrow as pa
        >>> from datamill.preprocessing.features import FeatureContext
        >>> h, ctx = Handler(), FeatureContext("seq", "seq", None, None)
        >>> p = h.Params(padding="left")
        >>> meta = h.finalize(h.fit(pa.array(["x y z", "y"]), p, ctx), p, ctx)
        >>> meta["idx2str"], meta["max_sequence_length"]
        (['<PAD>', '<UNK>', 'y', 'x', 'z'], 3)
        >>> h.transform(pa.array(["y", "q y"]), meta, p, ctx)["seq"].tolist()
        [[0, 0, 2], [0, 1, 2]]
    """

    type_name: ClassVar[str] = "sequence"
    Params: ClassVar[builtins.type[SequenceParams]] = SequenceParams
    defaults_key: ClassVar[str] = "sequence"

    @classmethod
    def default_fill(cls, params: dict[str, Any]) -> Any:
        """The unknown symbol (Ludwig fills a missing sequence with ``unknown_symbol``)."""
        return params.get("unknown_symbol") or cls.fill_value

    def tokens(self, column: pa.Array, params: SequenceParams, ctx: FeatureContext) -> Ragged:
        # a missing value (filled with the unknown symbol) stays unknown under lowercase; Ludwig
        # 0.17 lower-cases it into a token of its own, which layout: ludwig017 keeps
        keep = (params.unknown_symbol,) if params.layout == "datamill" else ()
        return split_tokens(
            column, params.tokenizer, lowercase=params.lowercase, regex=params.regex, keep_case=keep
        )

    def finalize(
        self, stats: RaggedStats, params: SequenceParams, ctx: FeatureContext
    ) -> dict[str, Any]:
        specials = params.specials()
        if params.vocab_file is not None:
            vocab = vocab_from_file(params.vocab_file, ctx, specials, params.unknown_symbol)
            freq = stats.counts.as_dict()
            vocab = Vocab(
                vocab.idx2str, str2freq=freq, unk_token=params.unknown_symbol, specials=specials
            )
        else:
            vocab = Vocab.from_counts(
                stats.counts,
                min_freq=params.min_frequency,
                max_size=params.most_common,
                specials=specials,
                unk_token=params.unknown_symbol,
            )
        longest = stats.max_length + (2 if params.wrapped else 0)
        width = params.sequence_length or max(1, min(longest, params.max_sequence_length))
        return {**vocab.to_dict(), "max_sequence_length": width}

    def transform(
        self,
        column: pa.Array | Ragged,
        meta: dict[str, Any],
        params: SequenceParams,
        ctx: FeatureContext,
    ) -> dict[str, NDArray[Any] | CSR]:
        rag = self._tokens(column, params, ctx)
        ids, offsets = rag.encode(Vocab.from_dict(meta)), rag.offsets
        special = params.special_ids()
        if params.wrapped:
            ids, offsets = add_start_stop(ids, offsets, special["start"], special["stop"])
        return {
            ctx.name: pad(
                ids,
                offsets,
                int(meta["max_sequence_length"]),
                side=params.padding,
                fill=special["pad"],
                dtype=int_type(int(meta["vocab_size"])),
            )[0]
        }
