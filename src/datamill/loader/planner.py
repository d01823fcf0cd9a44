"""Plan a run without reading data: shard reads, memory, cache traffic, first batch, shuffle
quality.

The order, the rank split and the loading schedule are pure functions (:mod:`datamill.loader.order`,
:class:`~datamill.loader.stages.EpochPlan`, :class:`~datamill.loader.cache.BuildReader`), so
:func:`plan_run` computes *exactly* what a :class:`~datamill.loader.Loader` with
``Workers(threads=0)`` will do, from shard sizes alone:

* **shard reads** per rank, in order (a build loads a shard a little before its first batch needs
  it);
* **peak shards in memory** per rank (loaded ahead by ``prefetch`` and the next shuffle window,
  released after their last batch);
* **bytes fetched** per epoch from remote storage through a node-local shard cache of
  ``cache_limit`` bytes shared by the ranks of a node (least recently used evicted first);
* **time to first batch** from a read speed (measured by the CLI on one shard);
* **shuffle quality** of rank 0's sequence: the distances between neighbouring samples' original
  positions (as streaming's simulator reports), and the share of neighbours from the same shard.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from datamill.core.checks import (
    BATCH_SIZE,
    EPOCHS,
    NUM_WORKERS,
    PREFETCH,
    SEED,
    WINDOW,
    WORLD_SIZE,
    Limit,
    check_int,
)
from datamill.core.errors import ConfigError
from datamill.loader.cache import ahead_window, read_target
from datamill.loader.options import Batching, Workers, checked_groups
from datamill.loader.order import default_window, global_order, split_for_rank
from datamill.loader.stages import EpochPlan

__all__ = ["RunPlan", "build_schedule", "plan_run", "shuffle_quality"]

BLOCK_ROWS = 8192  # the same block of batches per task as datamill.loader.service.BLOCK_ROWS


def build_schedule(
    plan: EpochPlan,
    sizes: NDArray[np.int64],
    *,
    prefetch: int,
    num_workers: int = 0,
    window: int = 0,
) -> tuple[list[int], int]:
    """``(shards in the order a build loads them, most held at once)`` for a whole-epoch build.

    Mirrors :class:`~datamill.loader.cache.BuildReader` as the service drives it: before each task
    (a block of batches) every shard its batches need is loaded plus ``prefetch`` more, and with
    ``window`` (the shuffle window, as every build has) the next window
    (:func:`~datamill.loader.cache.read_target`); the shards
    whose last batch has been consumed are released, which with ``num_workers`` threads lags
    ``num_workers * prefetch - 1`` tasks behind.

    Examples:
        >>> plan = EpochPlan.make(
        ...     np.array([4, 4, 4]),
        ...     seed=0,
        ...     epoch=0,
        ...     shuffle=False,
        ...     window=None,
        ...     rank=0,
        ...     world_size=1,
        ...     drop_last=False,
        ...     batch_size=4,
        ... )
        >>> build_schedule(plan, np.array([4, 4, 4]), prefetch=1)
        ([0, 1, 2], 2)
    """
    by_first, first, last = plan.by_first, plan.first_batch, plan.last_batch
    by_last = plan.by_last
    mean = int(sizes.mean()) if len(sizes) else 1
    per = max(1, min(BLOCK_ROWS, mean) // plan.batch_size)
    lag = max(0, num_workers * prefetch - 1)
    ends = [min(plan.total_batches, lo + per) - 1 for lo in range(0, plan.total_batches, per)]
    loaded = needed = released = peak = 0
    for i, hi in enumerate(ends):
        while needed < len(by_first) and first[by_first[needed]] <= hi:
            needed += 1
        target = read_target(len(by_first), needed, released, prefetch=prefetch, window=window)
        while loaded < target:
            loaded += 1
            peak = max(peak, loaded - released)
        if i - lag >= 0:
            done = ends[i - lag]
            while released < len(by_last) and last[by_last[released]] <= done:
                released += 1
    return by_first[:loaded].tolist(), peak


def shuffle_quality(seq: NDArray[np.int64], shard_of: NDArray[np.int64]) -> dict[str, float]:
    """Neighbour statistics of a visiting order: distance quantiles, entropy, same-shard share.

    ``entropy_bits`` is the Shannon entropy of ``floor(log2(1 + |distance|))`` (streaming's measure
    of how far apart neighbours come from); ``same_shard`` the share of neighbours from one shard.

    Examples:
        >>> q = shuffle_quality(np.arange(10), np.zeros(10, dtype=np.int64))
        >>> q["median_distance"], q["same_shard"]
        (1.0, 1.0)
    """
    if len(seq) < 2:
        return {
            "median_distance": 0.0,
            "p10_distance": 0.0,
            "p90_distance": 0.0,
            "entropy_bits": 0.0,
            "same_shard": 0.0,
        }
    dist = np.abs(np.diff(seq))
    bins = np.floor(np.log2(1 + dist)).astype(np.int64)
    p = np.bincount(bins) / len(bins)
    p = p[p > 0]
    return {
        "median_distance": float(np.median(dist)),
        "p10_distance": float(np.quantile(dist, 0.1)),
        "p90_distance": float(np.quantile(dist, 0.9)),
        "entropy_bits": float(-(p * np.log2(p)).sum()),
        "same_shard": float((shard_of[seq[1:]] == shard_of[seq[:-1]]).mean()),
    }


@dataclass
class RunPlan:
    """What :func:`plan_run` computed (``ranks[r]`` per rank, ``epochs[e]`` per epoch, totals)."""

    ranks: list[dict[str, Any]] = field(default_factory=list)
    epochs: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    def as_text(self, *, show: int = 12) -> str:
        """A human-readable report (the first ``show`` shard reads of each rank)."""
        s = self.settings
        head = (
            f"{s['samples']:,} samples in {s['shards']} shards ({s['bytes'] / 2**20:,.1f} MiB); "
            f"batch {s['batch_size']}, world {s['world_size']} ({s['ranks_per_node']} per node), "
            f"window {s['window']} shards, prefetch {s['prefetch']}, cache limit "
            f"{s['cache_limit'] / 2**20:,.1f} MiB"
        )
        out = [head]
        for r in self.ranks:
            reads = r["reads"]
            more = f" ... (+{len(reads) - show})" if len(reads) > show else ""
            out.append(
                f"rank {r['rank']}: {r['batches']} batches, {len(reads)} shard reads "
                f"[{' '.join(map(str, reads[:show]))}{more}], peak {r['peak_shards']} shards in "
                "memory "
                f"({r['peak_bytes'] / 2**20:,.1f} MiB), first batch after "
                f"{r['first_batch_s'] * 1000:,.1f} ms"
            )
        for e in self.epochs:
            q = e["quality"]
            out.append(
                f"epoch {e['epoch']}: fetched {e['fetched_bytes'] / 2**20:,.1f} MiB "
                f"({e['fetches']} shard "
                f"downloads, {e['hits']} cache hits); neighbours: median distance "
                f"{q['median_distance']:,.0f}, "
                f"p10 {q['p10_distance']:,.0f}, p90 {q['p90_distance']:,.0f}, entropy "
                f"{q['entropy_bits']:.2f} bits, "
                f"same shard {q['same_shard']:.1%}"
            )
        return "\n".join(out)


RANKS_PER_NODE = Limit("ranks_per_node", low=1, high=WORLD_SIZE.high)
READ_SPEED = Limit("read_bytes_per_s", low=0, low_open=True, high=1e15, kind="float")
READER_THREADS = Limit("reader_threads", low=1, high=1024)


def _check_plan(
    samples: int,
    *,
    batch_size: int,
    world_size: int,
    seed: int,
    window: int | None,
    prefetch: int,
    num_workers: int,
    epochs: int,
    cache_limit: int | None,
    ranks_per_node: int | None,
    read_bytes_per_s: float,
    reader_threads: int | None,
) -> None:
    """Every argument of :func:`plan_run` in its range; a world larger than the samples is
    refused."""
    BATCH_SIZE(batch_size)
    WORLD_SIZE(world_size)
    SEED(seed)
    PREFETCH(prefetch)
    NUM_WORKERS(num_workers)
    EPOCHS(epochs)
    READ_SPEED(read_bytes_per_s)
    for limit, value in (
        (WINDOW, window),
        (RANKS_PER_NODE, ranks_per_node),
        (READER_THREADS, reader_threads),
    ):
        if value is not None:
            limit(value)
    if cache_limit is not None:
        check_int(cache_limit, name="cache_limit", low=0, high=2**62)
    if world_size > max(1, samples):
        raise ConfigError(
            f"world_size={world_size:,} is larger than the {samples:,} samples: ranks would get "
            "no data",
            hint="use at most one rank per sample",
        )


def _rank_summary(
    rank: int,
    plan: EpochPlan,
    reads: list[int],
    peak: int,
    nbytes: NDArray[np.int64],
    threads: int,
    read_bytes_per_s: float,
) -> dict[str, Any]:
    """A rank's first-epoch reads, peak shards and bytes (at most), time to its first batch."""
    first = [k for k in reads if plan.first_batch[k] == 0][: max(1, len(reads))]
    lens = sorted((int(nbytes[k]) for k in first), reverse=True)
    first_s = max(lens[0] if lens else 0, -(-sum(lens) // max(1, threads))) / read_bytes_per_s
    held = sorted(nbytes[reads].tolist(), reverse=True)[:peak]
    return {
        "rank": rank,
        "batches": plan.total_batches,
        "reads": reads,
        "peak_shards": peak,
        "peak_bytes": int(sum(held)),
        "first_batch_s": first_s,
    }


def _cached(cache: OrderedDict[int, int], k: int, size: int, limit: int) -> bool:
    """Whether a node's LRU cache holds shard ``k`` (a hit); else it is fetched into it."""
    if k in cache:
        cache.move_to_end(k)
        return True
    cache[k] = size
    while sum(cache.values()) > limit and len(cache) > 1:
        cache.popitem(last=False)
    return False


# long (83 lines): a simulation of one run (per epoch: every rank's read schedule,
# then the node caches replaying those reads in lockstep); its counters and caches live in the loop
def plan_run(
    shard_sizes: Sequence[int] | NDArray[np.int64],
    /,
    *,
    batch_size: int,
    world_size: int = 1,
    seed: int = 0,
    batching: Batching | None = None,
    workers: Workers | None = None,
    epochs: int = 1,
    shard_bytes: Sequence[int] | NDArray[np.int64] | None = None,
    cache_limit: int | None = None,
    ranks_per_node: int | None = None,
    read_bytes_per_s: float = 200e6,
    reader_threads: int | None = None,
) -> RunPlan:
    """Plan ``epochs`` epochs of a run from shard sizes alone (no data read).

    Args:
        shard_sizes: rows per shard.
        batch_size: samples per batch.
        world_size: ranks. Defaults to ``1``.
        seed: the run's seed. Defaults to ``0``.
        batching: the Loader's :class:`~datamill.loader.options.Batching`; its ``shuffle``,
            ``window`` (``None``: the Loader's default) and ``drop_last`` are planned. Defaults to
            ``Batching()``.
        workers: the Loader's :class:`~datamill.loader.options.Workers`; its ``prefetch`` (shards
            loaded ahead) and ``threads`` (batch-building threads hold shards longer) are
            planned. Defaults to ``Workers()``.
        epochs: epochs planned (the shard cache persists across them). Defaults to ``1``.
        shard_bytes: bytes per shard (to fetch and hold). Defaults to ``None`` (1 byte per row).
        cache_limit: node-local shard cache size in bytes. Defaults to ``None`` (unbounded).
        ranks_per_node: ranks sharing one cache. Defaults to ``None`` (all of them).
        read_bytes_per_s: read speed for the time to first batch. Defaults to ``200e6``.
        reader_threads: shards read at once. Defaults to ``None`` (the Loader's: ``min(8, max(2,
            prefetch))``).

    Returns:
        The :class:`RunPlan`.

    Examples:
        >>> p = plan_run(
        ...     [100] * 8, batch_size=10, world_size=2, batching=Batching(window=2), cache_limit=300
        ... )
        >>> [len(r["reads"]) for r in p.ranks], p.epochs[0]["fetches"]
        ([4, 4], 8)
    """
    b, w = checked_groups(batching, workers)
    shuffle, window, drop_last = b.shuffle, b.window, b.drop_last
    prefetch, num_workers = w.prefetch, w.threads
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    nbytes = sizes.copy() if shard_bytes is None else np.asarray(shard_bytes, dtype=np.int64)
    _check_plan(
        int(sizes.sum()),
        batch_size=batch_size,
        world_size=world_size,
        seed=seed,
        window=window,
        prefetch=prefetch,
        num_workers=num_workers,
        epochs=epochs,
        cache_limit=cache_limit,
        ranks_per_node=ranks_per_node,
        read_bytes_per_s=read_bytes_per_s,
        reader_threads=reader_threads,
    )
    win = default_window(sizes, shard_bytes) if window is None else int(window)
    per_node = world_size if ranks_per_node is None else int(ranks_per_node)
    threads = min(8, max(2, prefetch)) if reader_threads is None else int(reader_threads)
    limit = int(nbytes.sum()) if cache_limit is None else int(cache_limit)
    caches: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(-(-world_size // per_node))]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    shard_of = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    out = RunPlan(
        settings={
            "samples": int(sizes.sum()),
            "shards": len(sizes),
            "bytes": int(nbytes.sum()),
            "batch_size": batch_size,
            "world_size": world_size,
            "ranks_per_node": per_node,
            "window": win,
            "prefetch": prefetch,
            "num_workers": num_workers,
            "cache_limit": limit,
        }
    )
    for epoch in range(epochs):
        order = global_order(sizes, seed=seed, epoch=epoch, shuffle=shuffle, window=win)
        fetched = fetches = hits = 0
        reads_per_rank, seqs = [], []
        for rank in range(world_size):
            seq = split_for_rank(order, rank=rank, world_size=world_size, drop_last=drop_last)
            plan = EpochPlan.from_sequence(seq, sizes, batch_size=batch_size, drop_last=drop_last)
            reads, peak = build_schedule(
                plan,
                sizes,
                prefetch=prefetch,
                num_workers=num_workers,
                window=ahead_window(win, prefetch),
            )
            reads_per_rank.append((plan, reads))
            seqs.append(plan.seq)
            if epoch == 0:
                out.ranks.append(
                    _rank_summary(rank, plan, reads, peak, nbytes, threads, read_bytes_per_s)
                )
        # the ranks of a node read in lockstep: interleave their reads by the batch that needs them
        events = sorted(
            (int(plan.first_batch[k]), rank, i, k)
            for rank, (plan, reads) in enumerate(reads_per_rank)
            for i, k in enumerate(reads)
        )
        for _, rank, _, k in events:
            if _cached(caches[rank // per_node], k, int(nbytes[k]), limit):
                hits += 1
            else:
                fetches, fetched = fetches + 1, fetched + int(nbytes[k])
        quality = shuffle_quality(seqs[0] if seqs else np.zeros(0, dtype=np.int64), shard_of)
        out.epochs.append(
            {
                "epoch": epoch,
                "fetched_bytes": fetched,
                "fetches": fetches,
                "hits": hits,
                "quality": quality,
                "samples": int(offsets[-1]),
            }
        )
    return out
