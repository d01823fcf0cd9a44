"""Running the BERT sample tasks: one task = (dupe round, document shard), in-process or in a pool.

Shards are fixed document ranges of about ``SHARD_TOKENS`` tokens, so the output (content and
order) depends only on the corpus, the parameters and the seed, never on the number of workers.
Each task derives its generators from ``rng_for(seed, "bert-*", dupe, shard)``. Workers read the
corpus from ``.npy`` files memory-mapped read-only (any start method works; nothing big is pickled)
and return Arrow record batches, which the parent writes in task order.
"""

from __future__ import annotations

import functools
import gc
import itertools
import multiprocessing as mp
import os
import time
from collections.abc import Generator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.parallel import die_with_parent, ordered_map
from datamill.core.rng import rng_for
from datamill.pretrain.bert._docs import TokenizedDocuments
from datamill.pretrain.bert._mask import MaskConfig, assemble
from datamill.pretrain.bert._pairs import pair_builder, truncate_spans

__all__ = ["SHARD_TOKENS", "TaskConfig", "TaskResult", "plan_shards", "plan_tasks", "run_tasks"]

SHARD_TOKENS = (
    1 << 20
)  # corpus tokens per document shard (a task); fixed, so output ignores workers
BATCH_SAMPLES = 4096  # samples per record batch / Parquet row group


@dataclass(frozen=True)
class TaskConfig:
    """The parameters every task needs (small, picklable)."""

    seed: int
    max_num_tokens: int
    short_seq_prob: float
    mask: MaskConfig
    pairing: str = "chunk_past_target"


@dataclass
class TaskResult:
    """Record batches of one task plus counters and seconds spent per stage."""

    batches: list[pa.RecordBatch]
    samples: int = 0
    tokens: int = 0
    timings: dict[str, float] = field(default_factory=dict)


def plan_shards(
    corpus: TokenizedDocuments, shard_tokens: int | None = None
) -> list[tuple[int, int]]:
    """Cut the documents into consecutive ranges of about ``shard_tokens`` tokens each."""
    shard_tokens = SHARD_TOKENS if shard_tokens is None else shard_tokens
    doc_tok = corpus.sent_offsets[corpus.doc_offsets]  # token offset of each document start (+ end)
    total = int(doc_tok[-1])
    cuts = np.searchsorted(doc_tok[:-1], np.arange(0, max(total, 1), shard_tokens), side="left")
    bounds = np.unique(np.concatenate([[0], cuts, [corpus.num_documents]]))
    return [(int(a), int(b)) for a, b in itertools.pairwise(bounds) if b > a]


class _State:
    """Per-process corpus (ids as an array, offsets as lists for the Python pair loop)."""

    ids: NDArray[np.int32]
    sent_offsets: list[int]
    doc_offsets: list[int]
    specials_in_ids: dict[
        tuple[int, ...], bool
    ]  # per set of special ids: does the corpus hold one?

    def has_specials(self, special_ids: tuple[int, ...]) -> bool:
        """Whether any corpus id is special (checked once per set of ids, in slices)."""
        if special_ids not in self.specials_in_ids:
            wanted = np.asarray(special_ids, dtype=np.int64)
            step = 1 << 24
            # the Ray engine's ids are per-block arrays (``arrays``); here: slices (views) of one
            # array
            parts = getattr(self.ids, "arrays", None) or [
                self.ids[lo : lo + step] for lo in range(0, len(self.ids), step)
            ]
            self.specials_in_ids[special_ids] = any(bool(np.isin(a, wanted).any()) for a in parts)
        return self.specials_in_ids[special_ids]


_STATE: _State | None = None


def _init_state(
    ids: NDArray[np.int32], sent_offsets: NDArray[np.int64], doc_offsets: NDArray[np.int64]
) -> _State:
    st = _State()
    st.ids = ids
    st.sent_offsets = sent_offsets.tolist()
    st.doc_offsets = doc_offsets.tolist()
    st.specials_in_ids = {}
    return st


def _worker_init(folder: str) -> None:
    global _STATE
    die_with_parent()  # a kill -9 of `datamill bert` must not leave workers running
    d = Path(folder)
    _STATE = _init_state(
        np.load(d / "ids.npy", mmap_mode="r"),
        np.load(d / "sent_offsets.npy"),
        np.load(d / "doc_offsets.npy"),
    )


def _run_task(
    st: _State, cfg: TaskConfig, dupe: int, shard: int, doc_lo: int, doc_hi: int
) -> TaskResult:
    t0 = time.perf_counter()
    spans = pair_builder(cfg.pairing)(
        st.sent_offsets,
        st.doc_offsets,
        doc_lo,
        doc_hi,
        max_num_tokens=cfg.max_num_tokens,
        short_seq_prob=cfg.short_seq_prob,
        rng=rng_for(cfg.seed, "bert-pairs", dupe, shard),
    )
    t1 = time.perf_counter()
    spans = truncate_spans(
        spans, cfg.max_num_tokens, rng_for(cfg.seed, "bert-truncate", dupe, shard)
    )
    res = TaskResult(batches=[], samples=len(spans), tokens=int((spans.la + spans.lb + 3).sum()))
    specials = st.has_specials(cfg.mask.special_ids)
    for b, lo in enumerate(range(0, len(spans), BATCH_SAMPLES)):
        part = spans.slice(lo, lo + BATCH_SAMPLES)
        res.batches.append(
            assemble(
                st.ids,
                part,
                cfg.mask,
                rng_for(cfg.seed, "bert-mask", dupe, shard, b),
                specials_in_ids=specials,
            )
        )
    t2 = time.perf_counter()
    res.timings = {"pairs": t1 - t0, "mask_pad_arrow": t2 - t1}
    return res


def _pool_task(cfg: TaskConfig, dupe: int, shard: int, doc_lo: int, doc_hi: int) -> TaskResult:
    if _STATE is None:  # pragma: no cover - the initializer always ran
        raise RuntimeError("BERT worker used before its initializer")
    return _run_task(_STATE, cfg, dupe, shard, doc_lo, doc_hi)


def _pool_task_of(cfg: TaskConfig, task: tuple[int, int, int, int]) -> TaskResult:
    return _pool_task(cfg, *task)


def plan_tasks(corpus: TokenizedDocuments, dupe_factor: int) -> list[tuple[int, int, int, int]]:
    """Every task as ``(dupe, shard, first document, end document)``, in output order."""
    shards = plan_shards(corpus)
    return [(d, s, lo, hi) for d in range(dupe_factor) for s, (lo, hi) in enumerate(shards)]


def run_tasks(
    corpus: TokenizedDocuments,
    cfg: TaskConfig,
    tasks: list[tuple[int, int, int, int]],
    *,
    workers: int,
    scratch: Path,
    backend: str | None = None,
) -> Generator[TaskResult, None, None]:
    """Yield the results of ``tasks`` in order.

    ``workers == 1``: one background thread builds samples while the caller writes (numpy and the
    Parquet writer release the GIL, so both cores work). ``workers > 1``: a process pool.
    """
    backend = backend or ("thread" if workers <= 1 else "process")
    if backend == "thread" or len(tasks) <= 1:
        st = _init_state(corpus.ids, corpus.sent_offsets, corpus.doc_offsets)
        with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="bert") as tpool:
            yield from ordered_map(
                lambda t: _run_task(st, cfg, *t), tasks, pool=tpool, window=2 * max(1, workers)
            )
        return
    scratch.mkdir(parents=True, exist_ok=True)
    np.save(scratch / "ids.npy", corpus.ids)
    np.save(scratch / "sent_offsets.npy", corpus.sent_offsets)
    np.save(scratch / "doc_offsets.npy", corpus.doc_offsets)
    # fork where available: spawn would re-import the caller's __main__ (scripts without a main
    # guard would break); workers only run numpy on memory-mapped files, never the tokenizer.
    # gc.freeze() keeps the children's garbage collector from touching (and so copying) every
    # object the parent holds.
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    gc.freeze()
    try:
        pool = ProcessPoolExecutor(
            max_workers=min(workers, len(tasks)),
            mp_context=ctx,
            initializer=_worker_init,
            initargs=(os.fspath(scratch),),
        )
        try:
            yield from ordered_map(
                functools.partial(_pool_task_of, cfg), tasks, pool=pool, window=2 * workers
            )
        except BaseException:  # an error, a full disk, Ctrl-C or close(): pending tasks are dropped
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
    finally:
        gc.unfreeze()
