"""The word2vec builder (:func:`build_skipgram`); public through :mod:`datamill.pretrain.word2vec`.

word2vec skip-gram training data: subsampling, context windows, negative sampling, padded batches.

The d2l.ai "Dataset for Pretraining Word Embeddings" pipeline as the seed writes it, with its
per-token Python loops replaced by numpy:

1. sentences are lines split on whitespace; a :class:`~datamill.vocab.Vocab` with ``min_freq``
   (``<unk>`` is id 0; PTB's own ``<unk>`` tokens and rare words map to it);
2. subsampling keeps a token with probability ``min(1, sqrt(t / f(w)))`` (one uniform per token),
   ``f(w)`` the share of ``w`` among all tokens, ``<unk>`` included, and ``<unk>`` is subsampled
   like any other word (the seed's ``subsampling``: on PTB train f is over 887,521 tokens and about
   354,100 are kept). ``drop_unk=True`` drops every ``<unk>`` token first (what later d2l code
   does; f is then over the known tokens and ``<unk>`` is never a center, context or negative);
3. each token of a sentence of >= 2 tokens is a center; window ``w ~ U{1..window}``; its contexts
   are the sentence's tokens within distance ``w``, itself excluded;
4. ``num_negatives`` negatives per context word from ``count(w) ** 0.75``, never equal to a
   context of the example (alias table, collisions redrawn). ``count`` is, by default, the counts of
   the subsampled corpus (the seed's ``count_corpus(corpus)``), or with
   ``negative_counts="before_subsampling"`` the counts before subsampling. The candidates are
   ids ``0 .. V-1``, ``<unk>`` included: the seed's ``range(len(counter))`` when every vocabulary
   word occurs, as on PTB (a word without a count has weight 0; where the seed's counter lacks
   ``<unk>`` its range would drop the last word instead); with ``drop_unk=True`` they are ids
   ``1 .. V-1`` (later d2l's ``range(1, len(vocab))``);
5. batches are the seed's ``batchify``: ``centers (B, 1)``, ``contexts_negatives``, ``masks``,
   ``labels`` ``(B, L)``, L the longest example of the batch, padded with 0.

Differences from the seed: the random streams are numpy's (distributions are the same), and the
vocabulary breaks frequency ties by token (the seed by first occurrence), so some ids differ.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.constants import VOCAB_FILE, WORD2VEC_FORMAT
from datamill.core.errors import CacheError, ConfigError, DataFileError
from datamill.core.faults import fault_point
from datamill.core.fingerprint import fingerprint_bytes, fingerprint_obj
from datamill.core.io import (
    PathLike,
    atomic_dir,
    check_output,
    check_utf8,
    display_name,
    is_blank,
    read_bytes,
)
from datamill.core.progress import progress as progress_bar
from datamill.core.rng import rng_for
from datamill.pretrain.word2vec._batch import SkipGramSource
from datamill.pretrain.word2vec._sample import (
    AliasTable,
    Sentences,
    centers_and_contexts,
    draw_negatives,
    split_lines,
    subsample,
)
from datamill.pretrain.word2vec.limits import NUM_NEGATIVES, SUBSAMPLE_T, W2V_MIN_FREQ, W2V_WINDOW
from datamill.vocab import TokenCounts, Vocab

__all__ = ["MANIFEST", "SkipGramSamples", "build_skipgram", "is_skipgram_folder"]

MANIFEST = "skipgram.json"
"""The commit marker of a saved example folder (written last)."""
UNK_TOKEN = "<unk>"
_ARRAYS = ("centers", "context_offsets", "contexts", "negative_offsets", "negatives")


class SkipGramSamples:
    """Skip-gram examples as CSR arrays plus their vocabulary; see :func:`build_skipgram`.

    Attributes:
        centers: int32 ``(N,)`` center ids. context_offsets / negative_offsets: int64 ``(N + 1,)``.
        contexts / negatives: int32 ids; example ``i`` has
        ``contexts[context_offsets[i]:context_offsets[i + 1]]``.
        vocab: the :class:`~datamill.vocab.Vocab` (``<unk>`` = 0). info: counts, parameters,
            timings.

    Examples:
        >>> import tempfile
        >>> s = build_skipgram([["a", "b", "c"], ["b", "c"]], window=1, num_negatives=2, min_freq=1,
        ...                    subsample_t=1.0, progress=False)
        >>> s.example(0)[1], len(s.example(0)[2])
        ([1], 2)
        >>> t = SkipGramSamples.load(s.save(tempfile.mkdtemp()))
        >>> t.example(0) == s.example(0), t.fingerprint() == s.fingerprint()
        (True, True)
    """

    def __init__(
        self,
        *,
        centers: NDArray[np.int32],
        context_offsets: NDArray[np.int64],
        contexts: NDArray[np.int32],
        negative_offsets: NDArray[np.int64],
        negatives: NDArray[np.int32],
        vocab: Vocab,
        info: dict[str, Any],
    ) -> None:
        self.centers, self.context_offsets, self.contexts = centers, context_offsets, contexts
        self.negative_offsets, self.negatives, self.vocab, self.info = (
            negative_offsets,
            negatives,
            vocab,
            info,
        )

    def __len__(self) -> int:
        return len(self.centers)

    def __repr__(self) -> str:
        return (
            f"SkipGramSamples(examples={len(self):,}, pairs={len(self.contexts):,}, "
            f"negatives={len(self.negatives):,}, vocab_size={len(self.vocab):,})"
        )

    def example(self, i: int) -> tuple[int, list[int], list[int]]:
        """``(center, contexts, negatives)`` of example ``i``, as the seed's lists."""
        c, n = self.context_offsets, self.negative_offsets
        return (
            int(self.centers[i]),
            self.contexts[c[i] : c[i + 1]].tolist(),
            self.negatives[n[i] : n[i + 1]].tolist(),
        )

    def fingerprint(self) -> str:
        """Identity of these examples (from the input's fingerprint and the parameters)."""
        return str(self.info["fingerprint"])

    def source(self, *, shard_size: int = 16384) -> SkipGramSource:
        """The examples as a :class:`~datamill.core.source.Source` (``center``, ``contexts``,
        ``negatives``)."""
        return SkipGramSource(
            self.centers,
            self.context_offsets,
            self.contexts,
            self.negative_offsets,
            self.negatives,
            fingerprint=self.fingerprint(),
            shard_size=shard_size,
        )

    # ---------------------------------------------------------------- persistence
    def save(
        self, directory: PathLike, *, overwrite: bool = False, inputs: Sequence[PathLike] = ()
    ) -> Path:
        """Write the folder beside the old one (``.npy`` arrays, ``vocab.json``, ``skipgram.json``
        last), then switch.

        Args:
            directory: the output folder. An earlier skip-gram folder there is replaced as a whole
                (an interrupted save keeps it); anything else is refused.
            overwrite: also replace another kind of datamill output. Defaults to ``False``.
            inputs: paths the folder must not be (nor hold), e.g. the corpus file. Defaults to
                ``()``.

        Raises:
            DataFileError: ``directory`` is an input or is not a skip-gram folder.
            OutputError: the disk is full (the previous folder is kept).
        """
        out = check_output(
            directory,
            is_own=is_skipgram_folder,
            inputs=inputs,
            what="word2vec folder",
            overwrite=overwrite,
        )
        with atomic_dir(out) as tmp:
            for name in _ARRAYS:
                np.save(tmp / f"{name}.npy", np.ascontiguousarray(getattr(self, name)))
                fault_point("word2vec.array_written")
            self.vocab.save(tmp / VOCAB_FILE)
            with open(tmp / MANIFEST, "w", encoding="utf-8") as f:
                json.dump({"format": WORD2VEC_FORMAT, **self.info}, f, indent=2, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            for entry in tmp.iterdir():
                if entry.name != MANIFEST:
                    with open(entry, "rb") as fh:
                        os.fsync(fh.fileno())
            fault_point("word2vec.before_switch")
        return out

    @classmethod
    def load(cls, directory: PathLike) -> SkipGramSamples:
        """Memory-map a folder written by :meth:`save`.

        Raises:
            CacheError: no ``skipgram.json`` (unfinished or foreign folder), wrong format, or bad
                arrays.
        """
        d = Path(directory)
        try:
            info = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CacheError(
                f"not a finished skip-gram folder ({MANIFEST} unreadable: {exc})",
                path=d,
                hint="rebuild it with `datamill word2vec ... --out DIR`",
            ) from exc
        if info.pop("format", None) != WORD2VEC_FORMAT:
            raise CacheError(f"expected format {WORD2VEC_FORMAT!r} in {MANIFEST}", path=d)
        try:
            arrays = {name: np.load(d / f"{name}.npy", mmap_mode="r") for name in _ARRAYS}
        except (OSError, ValueError) as exc:
            raise CacheError(f"cannot read the example arrays: {exc}", path=d) from exc
        return cls(**arrays, vocab=Vocab.load(d / VOCAB_FILE), info=info)


def is_skipgram_folder(path: Path) -> bool:
    """Whether ``path`` is a folder written by :meth:`SkipGramSamples.save` (its ``skipgram.json``).

    Examples:
        >>> is_skipgram_folder(Path("no-such-folder"))
        False
    """
    try:
        info = json.loads((Path(path) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and info.get("format") == WORD2VEC_FORMAT


def _check_params(window: int, num_negatives: int, min_freq: int, subsample_t: float) -> None:
    W2V_WINDOW(window)
    NUM_NEGATIVES(num_negatives)
    W2V_MIN_FREQ(min_freq)
    SUBSAMPLE_T(subsample_t)


def _read(
    source: PathLike | Sequence[Sequence[str]],
) -> tuple[pa.Array, NDArray[np.int64], str, str]:
    """(flat tokens, sentence offsets, display name, input fingerprint)."""
    if isinstance(source, (str, os.PathLike)):
        name = display_name(source)
        data = read_bytes(source)
        if is_blank(data):
            raise DataFileError("the file is empty; expected text", path=name)
        if not data.isascii():
            check_utf8(data, path=name)
        tokens, offsets = split_lines(data)
        return tokens, offsets, name, fingerprint_bytes(data)
    if any(isinstance(s, (str, bytes)) for s in source):
        raise ConfigError(
            "expected a path or a list of token lists (sentences), got a list of strings",
            hint="wrap it: [tokens], or split each sentence: [line.split() for line in lines]",
        )
    sentences = [list(s) for s in source]
    lengths = np.array([len(s) for s in sentences], dtype=np.int64)
    try:
        tokens = pa.array([t for s in sentences for t in s], pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ConfigError(
            f"tokens must be strings: {exc}", hint="map ids to strings first"
        ) from exc
    return tokens, np.concatenate([[0], np.cumsum(lengths)]), "<tokens>", fingerprint_obj(sentences)


def _vocab_and_ids(tokens: pa.Array, min_freq: int) -> tuple[Vocab, NDArray[np.int32]]:
    """One ``dictionary_encode`` pass gives both the counts and the ids (the vocab maps the distinct
    tokens)."""
    enc = pc.dictionary_encode(tokens)
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks()
    codes = enc.indices.to_numpy(zero_copy_only=False)
    counts = np.bincount(codes, minlength=len(enc.dictionary)).astype(np.int64)
    vocab = Vocab.from_counts(
        TokenCounts(enc.dictionary, counts),
        min_freq=min_freq,
        specials=[UNK_TOKEN],
        unk_token=UNK_TOKEN,
    )
    return vocab, vocab.encode(enc.dictionary, dtype=np.int32)[codes]


def _negative_table(counts: NDArray[np.int64], *, drop_unk: bool) -> AliasTable:
    """``count ** 0.75`` over the candidate ids: ``1..V-1`` with ``drop_unk``, else ``0..V-1``."""
    first = 1 if drop_unk else 0
    return AliasTable(
        counts[first:].astype(np.float64) ** 0.75,
        values=np.arange(first, len(counts), dtype=np.int64),
    )


# long (101 lines, 43 of docstring): one pipeline in order (read, vocabulary, subsample, contexts,
# negatives, metadata), each step a call
def build_skipgram(
    source: PathLike | Sequence[Sequence[str]],
    /,
    *,
    window: int = 5,
    num_negatives: int = 5,
    min_freq: int = 10,
    subsample_t: float = 1e-4,
    seed: int = 0,
    negative_counts: Literal["subsampled", "before_subsampling", "seed"] = "subsampled",
    drop_unk: bool = False,
    progress: bool = True,
) -> SkipGramSamples:
    """Build skip-gram examples (centers, contexts, negatives) from sentences.

    Args:
        source: a text file (one sentence per line, tokens separated by whitespace), an
            ``archive.zip:member``, or a list of token lists.
        window: the largest context window. Defaults to ``5``.
        num_negatives: negatives per context word (K). Defaults to ``5``.
        min_freq: words seen fewer times become ``<unk>``. Defaults to ``10``.
        subsample_t: subsampling threshold t. Defaults to ``1e-4``.
        seed: seed of every random stage. Defaults to ``0``.
        negative_counts: the counts raised to 0.75 for negatives: ``"subsampled"`` (the corpus after
            subsampling, as the seed does) or ``"before_subsampling"`` (as later d2l code does).
            ``"seed"`` is a deprecated alias of ``"before_subsampling"``. Defaults to
            ``"subsampled"``.
        drop_unk: drop every ``<unk>`` token before subsampling (later d2l code) instead of
            subsampling it like any word (the seed). Defaults to ``False``.
        progress: show a progress bar over the stages. Defaults to ``True``.

    Returns:
        The :class:`SkipGramSamples` (``.save(dir)``, ``.source()``: padded batches with
        :func:`datamill.loader.read_batches`).

    Raises:
        ConfigError: ``window < 1``, ``num_negatives < 0``, ``min_freq < 1``, ``subsample_t <= 0``
            or an unknown ``negative_counts``.

    Warns:
        DeprecationWarning: ``negative_counts="seed"`` (use ``"before_subsampling"``).
        DataFileError: the corpus is empty, has no word kept by the vocabulary, or no sentence of
            at least 2 tokens after subsampling (``path`` names the input).

    Examples:
        >>> s = build_skipgram(
        ...     [["a", "b", "c", "d"], ["e", "f"]],
        ...     window=2,
        ...     num_negatives=1,
        ...     min_freq=1,
        ...     subsample_t=1.0,
        ...     progress=False,
        ... )
        >>> len(s), s.info["tokens_after_subsampling"], s.vocab.idx2str[0]
        (6, 6, '<unk>')
    """
    _check_params(window, num_negatives, min_freq, subsample_t)
    if negative_counts == "seed":
        warnings.warn(
            'negative_counts="seed" is deprecated: it means the counts before subsampling; '
            'use negative_counts="before_subsampling"',
            DeprecationWarning,
            stacklevel=2,
        )
        negative_counts = "before_subsampling"
    if negative_counts not in ("subsampled", "before_subsampling"):
        raise ConfigError(
            f"negative_counts must be 'subsampled' or 'before_subsampling', got {negative_counts!r}"
        )
    times: dict[str, float] = {}
    bar = progress_bar(total=5, desc="word2vec", unit="stage", disable=None if progress else True)
    t0 = time.perf_counter()
    tokens, offsets, name, input_fp = _read(source)
    if len(tokens) == 0:
        raise DataFileError("expected at least one token, got an empty corpus", path=name)
    times["read"] = time.perf_counter() - t0
    bar.update(1)

    t0 = time.perf_counter()
    vocab, ids = _vocab_and_ids(tokens, min_freq)
    raw = Sentences(ids, offsets)
    known = Sentences(
        raw.ids[raw.ids != 0], np.concatenate([[0], np.cumsum(raw.ids != 0)])[offsets]
    )
    if known.num_tokens == 0:
        raise DataFileError(
            f"no word occurs min_freq={min_freq} times (all {len(tokens):,} tokens are rare or "
            f"{UNK_TOKEN})",
            path=name,
            hint="lower min_freq",
        )
    corpus = known if drop_unk else raw
    counts = np.bincount(corpus.ids, minlength=len(vocab)).astype(np.int64)
    times["vocab"] = time.perf_counter() - t0
    bar.update(1)

    t0 = time.perf_counter()
    kept = subsample(corpus, counts, t=subsample_t, rng=rng_for(seed, "word2vec.subsample"))
    times["subsample"] = time.perf_counter() - t0
    bar.update(1)

    t0 = time.perf_counter()
    centers, ctx_off, ctx = centers_and_contexts(
        kept, max_window=window, rng=rng_for(seed, "word2vec.windows")
    )
    if len(centers) == 0:
        raise DataFileError(
            f"no sentence has at least 2 tokens after subsampling ({kept.num_tokens:,} tokens "
            "kept)",
            path=name,
            hint="use a larger corpus or a larger subsample_t",
        )
    times["contexts"] = time.perf_counter() - t0
    bar.update(1)

    t0 = time.perf_counter()
    if negative_counts == "subsampled":
        counts = np.bincount(kept.ids, minlength=len(vocab)).astype(np.int64)
    table = _negative_table(counts, drop_unk=drop_unk)
    neg_off, neg = draw_negatives(
        ctx_off, ctx, k=num_negatives, table=table, rng=rng_for(seed, "word2vec.negatives")
    )
    times["negatives"] = time.perf_counter() - t0
    bar.update(1)
    bar.close()

    params = {
        "window": window,
        "num_negatives": num_negatives,
        "min_freq": min_freq,
        "subsample_t": subsample_t,
        "seed": seed,
        "negative_counts": negative_counts,
        "drop_unk": drop_unk,
    }
    info = {
        **params,
        "source": name,
        "vocab_size": len(vocab),
        "tokens": len(tokens),
        "tokens_known": known.num_tokens,
        "tokens_after_subsampling": kept.num_tokens,
        "examples": len(centers),
        "pairs": len(ctx),
        "num_negative_ids": len(neg),
        "fingerprint": fingerprint_obj([input_fp, "datamill.word2vec@1", params]),
        "seconds": {k: round(v, 4) for k, v in times.items()},
    }
    return SkipGramSamples(
        centers=centers,
        context_offsets=ctx_off,
        contexts=ctx,
        negative_offsets=neg_off,
        negatives=neg,
        vocab=vocab,
        info=info,
    )
