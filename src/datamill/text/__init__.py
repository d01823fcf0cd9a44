"""Text corpora (CSR ``.npy``), vocabularies, and language-model minibatches.

Examples:
    >>> from datamill.text import build_corpus, random_batches
    >>> c = build_corpus(["the time machine by h g wells"], level="char")
    >>> X, Y = next(iter(random_batches(c, 2, 5, seed=0)))
    >>> X.shape, X.dtype
    ((2, 5), dtype('int32'))
"""

from __future__ import annotations

from datamill.text.batches import LMBatches, random_batches, sequential_batches
from datamill.text.corpus import Corpus
from datamill.text.corpus_build import VocabLimits, build_corpus, build_vocab
from datamill.text.source import CorpusSource
from datamill.text.tok_build import Tokenized, tokenize
from datamill.text.tok_read import ReadOptions

__all__ = [
    "Corpus",
    "CorpusSource",
    "LMBatches",
    "ReadOptions",
    "Tokenized",
    "VocabLimits",
    "build_corpus",
    "build_vocab",
    "random_batches",
    "sequential_batches",
    "tokenize",
]

assert sorted(__all__) == __all__
