"""The BERT builder's options and result: :class:`BertSamples` and the one options check.

Shared by the local builder (:mod:`datamill.pretrain.bert._build`), the CLI and the Ray engine
(through :mod:`datamill.pretrain.bert.engine`), so every engine refuses the same bad options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from datamill.core.errors import ConfigError
from datamill.pretrain.bert._mask import LAYOUTS
from datamill.pretrain.bert._pairs import PAIRINGS
from datamill.pretrain.bert._tok import BERT_SPECIALS

__all__ = ["BertSamples", "check_params"]


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
    """The ``s3://`` URL written when ``out`` was on object storage (``path`` is then its bucket/key)."""

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("inf")


def check_params(max_seq_length: int, dupe_factor: int, mask_prob: float, max_predictions_per_seq: int,
                  short_seq_prob: float, vocab_size: int, layout: str, workers: int | None,
                  sentence_split: str, pairing: str) -> None:
    checks = [
        (max_seq_length >= 5, f"max_seq_length must be >= 5 ([CLS] A [SEP] B [SEP] with A, B >= 1 token), got {max_seq_length}"),
        (max_seq_length < 2**31, f"max_seq_length is too large: {max_seq_length}"),
        (dupe_factor >= 1, f"dupe_factor must be >= 1, got {dupe_factor}"),
        (0.0 < mask_prob < 1.0, f"mask_prob must be in (0, 1), got {mask_prob}"),
        (max_predictions_per_seq >= 1, f"max_predictions_per_seq must be >= 1, got {max_predictions_per_seq}"),
        (0.0 <= short_seq_prob <= 1.0, f"short_seq_prob must be in [0, 1], got {short_seq_prob}"),
        (vocab_size > len(BERT_SPECIALS), f"vocab_size must be > {len(BERT_SPECIALS)}, got {vocab_size}"),
        (layout in LAYOUTS, f"layout must be one of {list(LAYOUTS)}, got {layout!r}"),
        (workers is None or workers >= 1, f"workers must be >= 1, got {workers}"),
        (sentence_split in ("line", "period"), f"sentence_split must be 'line' or 'period', got {sentence_split!r}"),
        (pairing in PAIRINGS, f"pairing must be one of {list(PAIRINGS)}, got {pairing!r}"),
    ]
    for ok, msg in checks:
        if not ok:
            raise ConfigError(msg)
