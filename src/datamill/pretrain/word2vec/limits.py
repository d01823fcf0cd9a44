"""The ranges of ``build_skipgram``'s numeric parameters, shared with ``datamill word2vec``'s
options."""

from __future__ import annotations

from datamill.core.checks import Limit

__all__ = ["NUM_NEGATIVES", "SUBSAMPLE_T", "W2V_MIN_FREQ", "W2V_WINDOW"]

W2V_WINDOW = Limit("window", low=1, high=10_000)
NUM_NEGATIVES = Limit(
    "num_negatives", low=0, high=1_000, hint="word2vec uses 5-20 negatives per context word"
)
W2V_MIN_FREQ = Limit("min_freq", low=1)
SUBSAMPLE_T = Limit("subsample_t", low=0.0, low_open=True, high=None, kind="float")
