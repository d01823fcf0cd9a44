"""Running tokenize tasks on this machine (worker processes) and the progress every engine shows.

:class:`TokenizeProgress` is a tqdm bar over the stored bytes of all tasks (the finished tasks of an
interrupted run count as done from the start), with the documents and tokens/s beside it. Its ETA
(:func:`history_eta`) is the work left at the rate of a recent window: the last
:data:`ETA_WINDOW` of the time since the first batch ended, at least :data:`ETA_MIN_SECONDS`.
Measured from the first batch, the start (forking the workers, loading the tokenizer) is not taken
for slow work; over a recent window, a machine whose load changes mid-run (other jobs starting or
ending) gives an ETA that follows within that window, where the average since the start would
carry the old rate to the end. Tasks cut to a small fraction of the input and run largest first
keep every worker busy with work of the same kind until the end, so the rate is the rate of the
rest.
"""

from __future__ import annotations

import bisect
import functools
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from typing import Any

from datamill.core.parallel import die_with_parent
from datamill.core.progress import progress
from datamill.text.tok_inputs import Task
from datamill.text.tok_task import TaskConfig, run_task

__all__ = [
    "ETA_MIN_SECONDS",
    "ETA_WINDOW",
    "TokenizeProgress",
    "eta",
    "history_eta",
    "run_local",
]


def eta(elapsed: float, done: float, total: float) -> float | None:
    """Seconds left at the average rate so far (``None`` before any work is done).

    Examples:
        >>> eta(10.0, 25.0, 100.0)
        30.0
    """
    if done <= 0:
        return None
    return elapsed * (total - done) / done


ETA_WINDOW = 0.3
"""The share of the time since the first update over which :func:`history_eta` measures the rate."""
ETA_MIN_SECONDS = 10.0
"""The shortest window (seconds) :func:`history_eta` measures the rate over."""


def history_eta(times: Sequence[float], done: Sequence[float], total: float) -> float | None:
    """Seconds left after the updates ``(times[i], done[i])`` (``done`` cumulative, increasing):
    the work left at the rate over the recent window (:data:`ETA_WINDOW` of the time since the
    first update, at least :data:`ETA_MIN_SECONDS`); ``None`` before two updates.

    Examples:
        >>> history_eta([5.0, 10.0], [10.0, 25.0], 100.0)  # 15 in 5 s since the first update
        25.0
        >>> t = [float(s) for s in range(1, 101)]  # 1/s for 60 s, then 0.5/s
        >>> d = [s if s <= 60 else 60 + (s - 60) / 2 for s in t]
        >>> history_eta(t, d, 100.0)  # the rate of the last 30 s
        40.0
    """
    n = len(times)
    if n < 2 or times[-1] <= times[0] or done[-1] <= done[0]:
        return None
    now = float(times[-1])
    window = max(ETA_MIN_SECONDS, ETA_WINDOW * (now - times[0]))
    i = min(bisect.bisect_left(times, now - window), n - 2)
    while i > 0 and (times[i] >= now or done[i] >= done[-1]):
        i -= 1  # updates at the same moment: widen to one that measures a rate
    return max(0.0, (total - float(done[-1])) * (now - times[i]) / (float(done[-1]) - done[i]))


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    m, s = divmod(int(seconds + 0.5), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m:02d}:{s:02d}"


class TokenizeProgress:
    """The progress bar of a run: stored bytes, the ETA of :func:`history_eta`, documents,
    tokens/s; ``history`` keeps ``(seconds, bytes done)`` of every update."""

    def __init__(self, total: int, done: int) -> None:
        self.total, self.done, self.start_done = total, done, done
        self.docs = self.tokens = 0
        self.t0 = time.perf_counter()
        self.history: list[tuple[float, int]] = []
        self._times: list[float] = []
        self._done: list[int] = []
        self._shown = 0.0
        self._lock = threading.Lock()
        self.bar = progress(
            desc="tokenize",
            total=total,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            initial=done,
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {postfix}]",
        )

    def update(self, nbytes: int, docs: int, tokens: int) -> None:
        """Count ``nbytes`` stored bytes, ``docs`` documents and ``tokens`` tokens more."""
        with self._lock:
            self.done += nbytes
            self.docs += docs
            self.tokens += tokens
            now = time.perf_counter() - self.t0
            self.history.append((now, self.done))
            self._times.append(now)
            self._done.append(self.done)
            self.bar.update(nbytes)
            if now - self._shown > 0.5 and hasattr(self.bar, "set_postfix_str"):
                self._shown = now
                left = history_eta(self._times, self._done, self.total)
                self.bar.set_postfix_str(
                    f"ETA {_clock(left)}, docs={self.docs:,}, "
                    f"tok/s={self.tokens / max(now, 1e-9):,.0f}",
                    refresh=False,
                )

    def close(self) -> None:
        self.bar.close()


_CFG: TaskConfig | None = None
_QUEUE: Any = None


def _init(cfg: TaskConfig, queue: Any) -> None:
    global _CFG, _QUEUE
    die_with_parent()
    _CFG, _QUEUE = cfg, queue


def _report(nbytes: int, docs: int, tokens: int) -> None:
    _QUEUE.put((nbytes, docs, tokens))


def _pool_task(task: Task) -> dict[str, Any]:
    assert _CFG is not None
    return run_task(_CFG, task, _report)


def _report_done(on_done: Callable[[dict[str, Any]], None], fut: Future[dict[str, Any]]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        on_done(fut.result())


def _drain(queue: Any, bar: TokenizeProgress) -> None:
    while (msg := queue.get()) is not None:
        bar.update(*msg)


def run_local(
    cfg: TaskConfig,
    todo: list[Task],
    *,
    workers: int,
    total: int,
    done: int,
    on_done: Callable[[dict[str, Any]], None],
) -> dict[int, dict[str, Any]]:
    """Run ``todo`` (in this order) in ``workers`` processes (in-process for one); each receipt
    goes to ``on_done`` as its task ends; returns the receipts."""
    bar = TokenizeProgress(total, done)
    try:
        if workers <= 1 or len(todo) <= 1:
            out = {}
            for t in todo:
                out[t.index] = r = run_task(cfg, t, bar.update)
                on_done(r)
            return out
        return _in_pool(cfg, todo, workers, bar, on_done)
    finally:
        bar.close()


def _in_pool(
    cfg: TaskConfig,
    todo: list[Task],
    workers: int,
    bar: TokenizeProgress,
    on_done: Callable[[dict[str, Any]], None],
) -> dict[int, dict[str, Any]]:
    # fork: spawn would re-import the caller's __main__; TOKENIZERS_PARALLELISM=false while the
    # workers are forked, so each uses one core (no warning about parallelism used before a fork)
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    queue = ctx.SimpleQueue()
    drainer = threading.Thread(target=_drain, args=(queue, bar), daemon=True)
    drainer.start()
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    out: dict[int, dict[str, Any]] = {}
    try:
        with ProcessPoolExecutor(
            max_workers=min(workers, len(todo)),
            mp_context=ctx,
            initializer=_init,
            initargs=(cfg, queue),
        ) as pool:
            futures: list[Future[dict[str, Any]]] = [pool.submit(_pool_task, t) for t in todo]
            for fut in futures:
                fut.add_done_callback(functools.partial(_report_done, on_done))
            finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in finished if f.exception() is not None]
            if failed:
                pool.shutdown(wait=True, cancel_futures=True)
                raise failed[0].exception()  # type: ignore[misc]  # checked not None above
            for fut in futures:
                r = fut.result()
                out[int(r["task"])] = r
    finally:
        if old is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old
        queue.put(None)
        drainer.join()
    return out
