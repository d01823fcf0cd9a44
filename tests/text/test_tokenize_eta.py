"""The finish time of ``datamill tokenize``: on a skewed input (files of very different sizes, a
big compressed file that cannot be cut), the real plan (:func:`plan_tasks`), the real order
(:func:`schedule`) and the real estimate (:func:`eta`) give an ETA after 5% of the work within 10%
of the end, and the last 5% of the wall time still does at least 4.5% of the work (no tail).

The clock is a work model, not the machine's (so a loaded machine cannot make it flaky): ``W``
workers take tasks in the scheduled order, each as soon as it is free, and a task takes time in
proportion to its stored bytes plus a fixed per-task cost, progressing evenly. That cost was
measured at 6-8 KiB-equivalent on this machine (300 one-line files against one file of the same
bytes); the plan counts :data:`TASK_COST` (16 KiB), and the test also runs with none and with 3x
the measured one.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from datamill.text import tokenize
from datamill.text.tok_inputs import (
    TASK_COST,
    InputFile,
    Task,
    auto_task_bytes,
    plan_tasks,
    schedule,
)
from datamill.text.tok_run import TokenizeProgress, eta, history_eta
from tests.text.test_tokenize_files import _jsonl, tok_file

__all__ = ["tok_file"]  # the fixture, imported for this module's tests

MB = 1 << 20
SKEWED = [
    InputFile("big.jsonl", "jsonl", None, 300 * MB),
    InputFile("mid.jsonl", "jsonl", None, 40 * MB),
    InputFile("whole.jsonl.gz", "jsonl", "gzip", 12 * MB),  # one task: not seekable
    InputFile("small.txt.zst", "text", "zstd", 3 * MB),
    *[InputFile(f"s{i}.jsonl", "jsonl", None, 1 * MB) for i in range(30)],
    *[InputFile(f"t{i}.txt", "text", None, 20 << 10) for i in range(100)],
]


def _timeline(
    order: Sequence[Task], workers: int, overhead: float
) -> list[tuple[float, float, int]]:
    """``(start, end, weight)`` of every task: list scheduling on ``workers`` equal workers."""
    free = [(0.0, w) for w in range(workers)]
    out = []
    for t in order:
        at, w = heapq.heappop(free)
        end = at + overhead + t.weight - TASK_COST
        out.append((at, end, t.weight))
        heapq.heappush(free, (end, w))
    return out


def _done(timeline: list[tuple[float, float, int]], t: float) -> float:
    s, e, w = (np.asarray(x, float) for x in zip(*timeline, strict=True))
    return float(np.sum(np.clip((t - s) / (e - s), 0, 1) * w))


def _measure(order: Sequence[Task], workers: int, overhead: float) -> tuple[float, float]:
    """(relative ETA error after 5% of the work, share of the work in the last 5% of the time):
    the bar's estimate (:func:`history_eta`) over updates sampled 400 times until then."""
    tl = _timeline(order, workers, overhead)
    total = float(sum(w for _, _, w in tl))
    end = max(e for _, e, _ in tl)
    lo, hi = 0.0, end
    for _ in range(60):  # the time 5% of the work is done (done(t) increases)
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _done(tl, mid) < 0.05 * total else (lo, mid)
    times = [hi * (k + 1) / 400 for k in range(400)]
    left = history_eta([t * 100 / hi for t in times], [_done(tl, t) for t in times], total)
    assert left is not None  # (times scaled so that 5% of the work takes 100 s: a real window)
    return abs(hi + left * hi / 100 - end) / end, (total - _done(tl, 0.95 * end)) / total


@pytest.mark.parametrize("workers", [2, 4, 16])
@pytest.mark.parametrize("overhead_kib", [0, 8, 24])
def test_eta_is_within_10_percent_and_there_is_no_tail(workers: int, overhead_kib: int) -> None:
    total = sum(f.size for f in SKEWED)
    tasks = plan_tasks(SKEWED, task_bytes=auto_task_bytes(total))
    err, tail = _measure(schedule(tasks), workers, overhead_kib * 1024)
    assert err <= 0.10, f"ETA after 5% of the work is off by {err:.1%}"
    assert tail >= 0.045, f"the last 5% of the time did only {tail:.1%} of the work"


def test_input_order_would_leave_a_tail() -> None:
    """The test has teeth: run in input order, the uncut compressed file at the end is a tail."""
    tasks = plan_tasks(SKEWED[:4], task_bytes=auto_task_bytes(sum(f.size for f in SKEWED)))
    tasks = [t for t in tasks if t.file != 2] + [t for t in tasks if t.file == 2]
    _, tail = _measure(tasks, 4, 0.0)
    assert tail < 0.045
    _, tail = _measure(schedule(tasks), 4, 0.0)
    assert tail >= 0.045


def _run(
    *, startup: float, slow_at: float = 1.0, factor: float = 1.0
) -> tuple[list[float], list[float], float]:
    """The updates of a run of 1000 units in 500 batches at 1 unit/s (``startup`` seconds before
    the first), ``factor`` times slower once ``slow_at`` of the work is done (the machine's load
    rose); returns (times, done, finish)."""
    times, done, t = [], [], startup
    for k in range(1, 501):
        t += 2.0 * (factor if k * 2 > slow_at * 1000 else 1.0)
        times.append(t)
        done.append(2.0 * k)
    return times, done, t


def _error(
    times: list[float], done: list[float], finish: float, share: float, *, avg: bool
) -> float:
    """The relative error of the ETA shown once ``share`` of the work is done (``avg``: the
    average rate since the start, the estimate before the windowed one)."""
    i = int(np.searchsorted(done, share * done[-1]))
    t, d = times[: i + 1], done[: i + 1]
    left = eta(t[-1], d[-1], done[-1]) if avg else history_eta(t, d, done[-1])
    assert left is not None
    return abs(t[-1] + left - finish) / finish


def test_the_start_is_not_taken_for_slow_work() -> None:
    """Forking the workers and loading the tokenizer (here a fifth of the work's time) before the
    first update: the average since the start is 4x off after 5% of the work, the bar is not."""
    times, done, finish = _run(startup=200.0)
    assert _error(times, done, finish, 0.05, avg=True) > 2.0
    for share in (0.05, 0.25, 0.5, 0.9):
        assert _error(times, done, finish, share, avg=False) < 0.01


def test_a_load_change_is_followed_within_the_window() -> None:
    """The machine gets twice as slow once 30% of the work is done: no estimate made before can
    know it, but within the window after it the bar's ETA is right again (within 3%), where the
    average since the start is still 10% off at 60% of the work, 5% at 75%."""
    times, done, finish = _run(startup=5.0, slow_at=0.3, factor=2.0)
    for share in (0.6, 0.75, 0.9):
        assert _error(times, done, finish, share, avg=False) < 0.03
    assert _error(times, done, finish, 0.6, avg=True) > 0.10
    assert _error(times, done, finish, 0.75, avg=True) > 0.05


def test_the_bar_counts_every_stored_byte_once(tmp_path: Path, tok_file: Path) -> None:
    seen: list[TokenizeProgress] = []
    real = TokenizeProgress.__init__

    def spy(self: TokenizeProgress, total: int, done: int) -> None:
        real(self, total, done)
        seen.append(self)

    big = _jsonl(tmp_path / "big.jsonl", [f"document {i} " * (i % 40) for i in range(3000)])
    small = _jsonl(tmp_path / "small.jsonl", ["a tiny one"] * 3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TokenizeProgress, "__init__", spy)
        res = tokenize([big, small], out=tmp_path / "o", tokenizer=tok_file, task_bytes=20_000)
    bar = seen[0]
    done = [d for _, d in bar.history]
    stored = big.stat().st_size + small.stat().st_size
    assert bar.total == stored + res.tasks * TASK_COST == done[-1]
    assert done == sorted(done) and bar.docs == res.documents == 3003
    assert bar.tokens == res.tokens
