"""The ranges of ``build_bert_samples``'s numeric parameters, shared with ``datamill bert``'s
options.

Kept apart from the builder so the CLI states them without importing it (and its dependencies).
"""

from __future__ import annotations

from datamill.core.checks import Limit

__all__ = [
    "DUPE_FACTOR",
    "MASK_PROB",
    "MAX_PREDICTIONS",
    "MAX_SEQ_LENGTH",
    "SHORT_SEQ_PROB",
    "VOCAB_SIZE",
    "WORKERS",
]

_SPECIALS = 5  # [PAD] [CLS] [SEP] [MASK] [UNK] (BERT_SPECIALS)

MAX_SEQ_LENGTH = Limit(
    "max_seq_length", low=5, high=2**20, hint="[CLS] A [SEP] B [SEP] with A, B >= 1 token"
)
DUPE_FACTOR = Limit("dupe_factor", low=1, high=10_000)
MASK_PROB = Limit("mask_prob", low=0.0, low_open=True, high=1.0, high_open=True, kind="float")
MAX_PREDICTIONS = Limit("max_predictions_per_seq", low=1, high=2**20)
SHORT_SEQ_PROB = Limit("short_seq_prob", low=0.0, high=1.0, kind="float")
VOCAB_SIZE = Limit("vocab_size", low=_SPECIALS + 1, high=2**24)
WORKERS = Limit("workers", low=1, high=1024)
