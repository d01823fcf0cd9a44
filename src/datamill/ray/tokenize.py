"""``datamill tokenize --engine ray``: the same tasks as the local engine, each a Ray task.

Each Ray task runs :func:`datamill.text.tok_task.run_task` (the local engine's task body), so the
shards in the work folder, and the dataset made from them, are byte-identical to a local run. The
work folder must be reachable from every node at the same path (one machine, or a shared mount). The
tasks are submitted largest first in a bounded window; the progress bar advances as each finishes.

Examples:
    >>> from datamill.ray.tokenize import run_tasks
    >>> callable(run_tasks)
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from datamill.core.errors import DatamillError
from datamill.ray._runtime import MAX_RETRIES, Spread, connect, ordered_results, unwrap
from datamill.text.tok_inputs import Task
from datamill.text.tok_run import TokenizeProgress
from datamill.text.tok_task import TaskConfig, run_task

__all__ = ["run_tasks"]


def _task(cfg: TaskConfig, task: Task) -> dict[str, Any]:
    return run_task(cfg, task)


def run_tasks(
    cfg: TaskConfig,
    todo: list[Task],
    *,
    address: str | None,
    total: int,
    done: int,
    on_done: Callable[[dict[str, Any]], None],
) -> dict[int, dict[str, Any]]:
    """Run ``todo`` on Ray (``address``, or a local instance); each receipt goes to ``on_done`` as
    it comes back; returns the tasks' receipts.

    Raises:
        DatamillError: a task's own error (a bad record, located), or a Ray failure after retries.
    """
    ray = connect(address)
    remote = ray.remote(max_retries=MAX_RETRIES)(_task)
    spread = Spread()
    cfg_ref = ray.put(cfg)
    bar = TokenizeProgress(total, done)
    out: dict[int, dict[str, Any]] = {}
    weights = {t.index: t.weight for t in todo}

    def submit(item: tuple[int, Task]) -> Any:
        return remote.options(scheduling_strategy=spread(item[0])).remote(cfg_ref, item[1])

    window = max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
    try:
        for r in ordered_results(submit, list(enumerate(todo)), window=window):
            out[int(r["task"])] = r
            bar.update(weights[int(r["task"])], int(r["documents"]), int(r["tokens"]))
            on_done(r)
    except DatamillError:
        raise
    except Exception as exc:
        raise unwrap(exc, what="tokenizing") from exc
    finally:
        bar.close()
    return out
