"""WordPiece training from word counts: the library's trainer, fed the counts of a vectorised cut.

``tokenizers``' trainer normalises and pre-tokenises every line of the corpus (about 3 MB/s here,
the largest cost of ``datamill bert`` on raw text) only to count words; what it learns is a
function of those counts alone (the alphabet is sorted by character, merges are picked by pair
count with ties broken by pair ids). So the counts are made the vectorised way: the chunks of
:func:`datamill.pretrain.bert._fasttok.cut_text` are counted with one ``bincount``; an ASCII chunk
is already a word (the BERT normaliser and pre-tokeniser leave it whole), and each distinct chunk
with other characters goes through the library's normaliser and pre-tokeniser once, its count given
to every word it yields. The trainer then reads each word as often as it occurs, in long runs
(``"word word word ..."``) through a whitespace pre-tokenizer and no normaliser, which is about 5x
cheaper per word than the BERT pipeline on raw lines.

The library's trainer is not deterministic (huggingface/tokenizers#1794): it gives the ``##c``
tokens their ids in hash-map order, and merges of equal count are broken by those ids, so two
trainings on the same text differ. Here every initial token gets a fixed id: the trainer is given
the base alphabet (sorted by code point, as the library sorts it) and then the ``##c`` tokens
(sorted) as extra special tokens, which it puts first, so it never has to create one; they are
dropped from the added tokens afterwards (they stay in the vocabulary, as in the library's
result). The result is what ``train_from_iterator`` makes from the lines themselves when its hash
order happens to create the ``##c`` tokens in sorted order, and the same on every run
(``tests/pretrain/test_bert_wptrain.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.arrow import from_numpy, large_strings, to_numpy
from datamill.pretrain.bert._fasttok import ChunkedText

__all__ = ["initial_tokens", "train_from_chunks", "word_counts"]

_PIECE_BYTES = 4096  # text per sequence fed to the trainer (short sequences are cheaper per word)
_FEED_BATCH = 1024  # sequences per item of the iterator


def word_counts(text: ChunkedText, inner: Any) -> tuple[list[str], NDArray[np.int64]]:
    """The words ``inner``'s normaliser and pre-tokeniser make of the text, and how often each
    occurs."""
    counts = text.counts()
    ascii_ = to_numpy(pc.string_is_ascii(text.chunks))
    words = text.chunks.filter(from_numpy(ascii_))
    wcounts = counts[ascii_]
    other = text.chunks.filter(from_numpy(~ascii_)).to_pylist()
    if other:  # each distinct non-ASCII chunk through the library once
        extra: dict[str, int] = {}
        for chunk, c in zip(other, counts[~ascii_].tolist(), strict=True):
            normalized = (
                inner.normalizer.normalize_str(chunk) if inner.normalizer is not None else chunk
            )
            for w, _ in inner.pre_tokenizer.pre_tokenize_str(normalized):
                extra[w] = extra.get(w, 0) + c
        # merge with the ASCII words (a word may come from both: "café" -> "cafe"); no group_by:
        # acero imports pyarrow.dataset and with it pandas
        new = large_strings(list(extra))
        new_counts = np.fromiter(extra.values(), np.int64, len(extra))
        at = pc.index_in(new, value_set=words)
        found = ~to_numpy(pc.is_null(at))
        wcounts = wcounts.copy()
        np.add.at(
            wcounts, to_numpy(at.filter(from_numpy(found))).astype(np.int64), new_counts[found]
        )
        words = pa.concat_arrays([words, new.filter(from_numpy(~found))])
        wcounts = np.concatenate([wcounts, new_counts[~found]])
    return words.to_pylist(), np.asarray(wcounts, dtype=np.int64)


def _runs(words: list[str], counts: NDArray[np.int64]) -> Iterator[list[str]]:
    """Each word as often as it occurs, as runs ``"w w w ... "`` of about ``_PIECE_BYTES``."""
    batch: list[str] = []
    for w, c in zip(words, counts.tolist(), strict=True):
        unit = w + " "
        k = max(1, _PIECE_BYTES // len(unit))
        full, rest = divmod(c, k)
        if full:
            batch.extend([unit * k] * full)
        if rest:
            batch.append(unit * rest)
        if len(batch) >= _FEED_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def initial_tokens(words: list[str], prefix: str = "##") -> list[str]:
    """The tokens the trainer starts from, in a fixed order: every character of ``words`` (sorted by
    code point) and then ``prefix + c`` for every character that occurs after a word's first
    (sorted).

    Examples:
        >>> initial_tokens(["ab", "ba", "c"])
        ['a', 'b', 'c', '##a', '##b']
    """
    alphabet = sorted(set("".join(words)))
    inner = sorted(set("".join(w[1:] for w in words)))
    return alphabet + [prefix + c for c in inner]


def train_from_chunks(
    text: ChunkedText,
    *,
    vocab_size: int,
    min_frequency: int,
    special_tokens: list[str],
    timings: dict[str, float] | None = None,
) -> Any:
    """A WordPiece ``tokenizers.Tokenizer`` (BERT normaliser and pre-tokeniser) trained on ``text``.

    ``timings`` (if given) receives ``train_merges``: the seconds after the last word was fed (the
    merge phase, whose cost follows the number of distinct words, not the size of the text).
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    bert = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    bert.normalizer = normalizers.BertNormalizer(lowercase=text.lowercase)
    bert.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words, counts = word_counts(text, bert)
    inner = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    inner.pre_tokenizer = (
        pre_tokenizers.WhitespaceSplit()
    )  # words hold no whitespace: runs split back exactly
    fixed = [t for t in initial_tokens(words) if t not in special_tokens]
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[*special_tokens, *fixed],
        show_progress=False,
    )
    fed = [0.0]

    def runs() -> Iterator[list[str]]:
        yield from _runs(words, counts)
        fed[0] = time.perf_counter()

    inner.train_from_iterator(runs(), trainer=trainer)
    if timings is not None and fed[0]:
        timings["train_merges"] = time.perf_counter() - fed[0]
    inner.normalizer = bert.normalizer
    inner.pre_tokenizer = bert.pre_tokenizer
    inner.decoder = decoders.WordPiece()
    cfg = json.loads(inner.to_str())  # rebuilt from JSON: nothing left of the training set-up, and
    wanted = set(
        special_tokens
    )  # the fixed initial tokens are vocabulary entries, not added tokens
    cfg["added_tokens"] = [t for t in cfg["added_tokens"] if t["content"] in wanted]
    return Tokenizer.from_str(json.dumps(cfg, ensure_ascii=False))
