"""Journal replay of an iteration's done set at a server's start (``ServeCatalog`` reopening an
iteration): the journal's done runs marked done on a fresh ``Iteration``.

``python benchmarks/bench_replay.py [--units 2000000] [--world 8] [--repeat 3]``: a static iteration
of ``--units`` batches over ``--world`` ranks, 99% of them done (1% random units still pending, so
the done set is ~``units / 100`` runs), replayed the former way (a Python step per unit: the runs
expanded by a generator, each unit's queue and position looked up one at a time) and the vectorised
way (the done units, as ``Journal.done_units`` gives them, + ``IterationState.mark_done``: one
pass); both must leave the same state. Prints
the median seconds of ``--repeat`` runs of each and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from datamill.serve.protocol.iteration import Iteration
from datamill.serve.protocol.state import DONE, runs


def _per_unit(it: Iteration, spans: Any) -> None:
    """The replay before: ``mark_done(u for a, b in spans for u in range(a, b))`` with a Python
    step per unit."""
    for u in (u for a, b in spans for u in range(a, b)):
        q = int(it.queue_of[u])
        if q >= 0:
            it.state[q][it.pos_of[u]] = DONE
    it._recount()


def _vectorised(it: Iteration, units: Any) -> None:
    it.mark_done(units)


def _timed(
    replay: Callable[[Iteration, Any], None],
    make: Callable[[], Iteration],
    done: Any,
    repeat: int,
) -> tuple[float, Iteration]:
    times, it = [], make()
    for _ in range(repeat):
        it = make()
        t0 = time.perf_counter()
        replay(it, done)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), it


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, default=2_000_000)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n, world = args.units, args.world
    per_rank = [n // world + (r < n % world) for r in range(world)]
    pending = np.random.default_rng(0).random(n) < 0.01
    units = np.flatnonzero(~pending)  # what Journal.done_units gives
    spans = runs(units)

    def make() -> Iteration:
        return Iteration("bench", per_rank, world_size=world, boot="b")

    print(f"{n:,} units over {world} ranks, {int((~pending).sum()):,} done in {len(spans):,} runs")
    load0 = os.getloadavg()
    before, slow = _timed(_per_unit, make, spans, args.repeat)
    after, fast = _timed(_vectorised, make, units, args.repeat)
    same = all(np.array_equal(a, b) for a, b in zip(slow.state, fast.state, strict=True))
    print(
        f"replay before (per unit) {before:.3f} s; after (vectorised) {after:.4f} s; "
        f"{before / after:.0f}x; same state: {same}; medians of {args.repeat}; "
        f"load {load0} -> {os.getloadavg()}"
    )
    if not same:
        raise SystemExit("the two replays disagree")


if __name__ == "__main__":
    main()
