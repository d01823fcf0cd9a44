"""The BERT builder's options (:class:`BertConfig`) and result (:class:`BertSamples`).

One pydantic model holds the options of :func:`~datamill.pretrain.bert.build_bert_samples`; the CLI
builds it from its flags, the local builder and the Ray engine (through
:mod:`datamill.pretrain.bert.engine`) read it, so every engine takes and refuses the same options.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from datamill.core.errors import ConfigError
from datamill.pretrain.bert._mask import LAYOUTS
from datamill.pretrain.bert._pairs import PAIRING_ALIASES, PAIRINGS
from datamill.pretrain.bert.limits import (
    DUPE_FACTOR,
    MASK_PROB,
    MAX_PREDICTIONS,
    MAX_SEQ_LENGTH,
    SHORT_SEQ_PROB,
    VOCAB_SIZE,
    WORKERS,
)

__all__ = ["BertConfig", "BertSamples", "check_params"]


class BertConfig(BaseModel):
    """The options of :func:`~datamill.pretrain.bert.build_bert_samples` (frozen; unknown keys are
    refused).

    Attributes:
        tokenizer: a tokenizers JSON path, a :class:`datamill.tokenize.HFTokenizer` or a
            ``tokenizers.Tokenizer`` holding ``[PAD] [CLS] [SEP] [MASK] [UNK]``; ``None`` trains a
            WordPiece tokenizer on the text. Defaults to ``None``.
        vocab_size: vocabulary size when training. Defaults to ``30000``.
        max_seq_length: tokens per sample including ``[CLS]`` and two ``[SEP]``. Defaults to
            ``512``.
        dupe_factor: passes over the documents (each with fresh randomness). Defaults to ``10``.
        mask_prob: share of A+B tokens to predict. Defaults to ``0.15``.
        max_predictions_per_seq: cap on masked positions per sample. Defaults to ``20``.
        short_seq_prob: probability of a shorter random target length. Defaults to ``0.1``.
        seed: the root of every random choice. Defaults to ``0``.
        workers: ``1``: one background thread builds samples while the calling thread writes
            Parquet; ``N > 1``: ``N`` worker processes; ``None``: 1 on machines with up to 4 cores
            or for small inputs, else ``cores - 1``. The output does not depend on it. Defaults to
            ``None``.
        layout: ``"padded"`` (``tokens`` padded with ``[PAD]``, ``segment_ids`` with -1) or
            ``"compact"`` (unpadded ``tokens`` + ``segment_a_length``; padded at load time).
            Defaults to ``"padded"``.
        sentence_split: ``"line"`` (each line is a sentence) or ``"period"`` (also cut lines after
            each `` . ``, as d2l.ai does for WikiText, whose lines are paragraphs). Defaults to
            ``"line"``.
        pairing: how sentence pairs are cut from a document. ``"chunk_past_target"``: a chunk grows
            one sentence past the one that reaches the target length, so it holds at least two
            sentences when the document has them, and B is random only when the chunk left none or
            with probability 0.5 (the loop of the article this project started from, transcribed in
            ``benchmarks/bert_seed_script.py``; ``"seed"`` is its deprecated old name).
            ``"google"``: Google BERT's ``create_instances_from_document``
            (create_pretraining_data.py): the chunk stops at the sentence that reaches the target,
            so a long WikiText paragraph is a one-sentence chunk with a random B. Defaults to
            ``"chunk_past_target"``.
        engine: ``"local"`` or ``"ray"`` (the same samples built on a Ray cluster; the output is
            then a shardset dataset folder). Defaults to ``"local"``.
        engine_options: the engine's keyword arguments (Ray: ``address``). Defaults to ``None``.
        overwrite: also replace another kind of datamill output at the output path (an earlier BERT
            output is always replaced atomically; an input or a file of yours never). Defaults to
            ``False``.

    Examples:
        >>> BertConfig(max_seq_length=128).to_dict()
        {'max_seq_length': 128}
        >>> BertConfig(dupe_factor=0)
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: dupe_factor must be an int in [1, 10,000], got 0
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    tokenizer: Any = None
    vocab_size: int = 30000
    max_seq_length: int = 512
    dupe_factor: int = 10
    mask_prob: float = 0.15
    max_predictions_per_seq: int = 20
    short_seq_prob: float = 0.1
    seed: int = 0
    workers: int | None = None
    layout: str = "padded"  # (checked with the others, in check_params)
    sentence_split: str = "line"
    pairing: str = "chunk_past_target"
    engine: str = "local"
    engine_options: dict[str, Any] | None = None
    overwrite: bool = False

    def __init__(self, **options: Any) -> None:
        pairing = options.get("pairing")
        if isinstance(pairing, str) and pairing in PAIRING_ALIASES:
            new = PAIRING_ALIASES[pairing]
            warnings.warn(
                f'pairing="{pairing}" is deprecated: it is the loop now named "{new}"; '
                f'use pairing="{new}"',
                DeprecationWarning,
                stacklevel=3,
            )
            options["pairing"] = new
        try:
            super().__init__(**options)
        except ValidationError as exc:
            err = exc.errors()[0]
            original = err.get("ctx", {}).get("error")
            if isinstance(original, ConfigError):  # check_params, from model_post_init
                raise original from None
            name = ".".join(str(x) for x in err["loc"]) or "options"
            if err["type"] == "extra_forbidden":
                raise ConfigError(
                    f"unknown BERT option {name!r}",
                    hint=f"valid options: {', '.join(type(self).model_fields)}",
                ) from None
            raise ConfigError(f"{name}: {err['msg']}, got {err.get('input')!r}") from None

    def model_post_init(self, context: Any, /) -> None:
        check_params(
            self.max_seq_length,
            self.dupe_factor,
            self.mask_prob,
            self.max_predictions_per_seq,
            self.short_seq_prob,
            self.vocab_size,
            self.layout,
            self.workers,
            self.sentence_split,
            self.pairing,
        )

    @classmethod
    def of(cls, config: BertConfig | None = None, /, **options: Any) -> BertConfig:
        """``config`` (or the defaults) with ``options`` replacing its fields, validated again."""
        if config is not None and not isinstance(
            config, BertConfig
        ):  # (found by tests/fuzz: an AttributeError)
            raise TypeError(f"config must be a BertConfig, got {type(config).__name__}")
        base = config.model_dump(exclude_unset=True) if config is not None else {}
        return cls(**{**base, **options})

    def to_dict(self) -> dict[str, Any]:
        """The options that differ from the defaults, sorted by name."""
        return dict(sorted(self.model_dump(exclude_defaults=True).items()))

    def build_options(self) -> dict[str, Any]:
        """What one engine needs to build (``engine``, ``engine_options`` and ``overwrite`` left
        out)."""
        return self.model_dump(exclude={"engine", "engine_options", "overwrite"})


@dataclass(frozen=True)
class BertSamples:
    """What :func:`build_bert_samples` wrote, with counts and seconds per stage."""

    path: Path
    tokenizer_path: Path
    layout: str
    documents: int
    sentences: int
    samples: int
    tokens: int
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    url: str | None = None
    """The ``s3://`` URL written when ``out`` was on object storage (``path`` is then its
    bucket/key)."""

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("inf")


def check_params(
    max_seq_length: int,
    dupe_factor: int,
    mask_prob: float,
    max_predictions_per_seq: int,
    short_seq_prob: float,
    vocab_size: int,
    layout: str,
    workers: int | None,
    sentence_split: str,
    pairing: str,
) -> None:
    MAX_SEQ_LENGTH(max_seq_length)
    DUPE_FACTOR(dupe_factor)
    MASK_PROB(mask_prob)
    MAX_PREDICTIONS(max_predictions_per_seq)
    SHORT_SEQ_PROB(short_seq_prob)
    VOCAB_SIZE(vocab_size)
    if workers is not None:
        WORKERS(workers)
    checks = [
        (layout in LAYOUTS, f"layout must be one of {list(LAYOUTS)}, got {layout!r}"),
        (
            sentence_split in ("line", "period"),
            f"sentence_split must be 'line' or 'period', got {sentence_split!r}",
        ),
        (pairing in PAIRINGS, f"pairing must be one of {list(PAIRINGS)}, got {pairing!r}"),
    ]
    for ok, msg in checks:
        if not ok:
            raise ConfigError(msg)
