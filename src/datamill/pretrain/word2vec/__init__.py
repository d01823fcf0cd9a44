"""word2vec skip-gram samples: subsampling, context windows, negatives, padded batches.

The builder is :func:`build_skipgram` (its steps and the seed's semantics are described in
:mod:`datamill.pretrain.word2vec._build`); ``datamill word2vec`` is
:mod:`datamill.pretrain.word2vec.cli`.

Examples:
    >>> from datamill.pretrain.word2vec import build_skipgram
    >>> len(build_skipgram([["a", "b", "c"]], min_freq=1, subsample_t=1.0, progress=False))
    3
"""

from __future__ import annotations

from datamill.pretrain.word2vec._build import (
    MANIFEST,
    SkipGramSamples,
    build_skipgram,
    is_skipgram_folder,
)

__all__ = ["MANIFEST", "SkipGramSamples", "build_skipgram", "is_skipgram_folder"]
assert sorted(__all__) == __all__
