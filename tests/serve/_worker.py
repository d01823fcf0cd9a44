"""A training-process stand-in: iterate a RemoteLoader, log each batch's uids (one JSON line,
flushed).

With ``"stamps": true`` in its options it also writes ``LOG.t``: one JSON line per batch, written
as the batch is logged, ``{"t": time.monotonic(), "lease": id, "pos": position, "acks": {status:
count}, "dropped": batches dropped}`` (the time the loop got the batch, the lease and position of
the batch just handed out, the acknowledgement answers so far), and ``LOG.commits``: one
``{"t": ..., "units": [...]}`` line per lease part the server confirmed committed (written by the
ack thread). A failing checker prints them around a fault (tests/faults/test_netns.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, TextIO


def _stamp(out: TextIO, loader: Any, t: float) -> None:
    with loader._state_lock:
        last = loader._unflushed[-1] if loader._unflushed else (None, None, None)
        acks = dict(loader.stats["acks"])
    lease, _, pos = last
    rec = {"t": t, "lease": lease, "pos": pos, "acks": acks}
    out.write(json.dumps({**rec, "dropped": loader.stats["dropped_lost"]}) + "\n")
    out.flush()


def main(argv: list[str]) -> None:
    from _opts import grouped  # this script's folder is on sys.path

    from datamill.client import RemoteLoader

    url, key, dataset, log, raw = argv
    opts = json.loads(raw)
    sleep = float(opts.pop("sleep", 0.0))
    state_path = opts.pop("state", None)  # write the loader's state_dict() after each logged batch
    stamps = open(log + ".t", "a", encoding="utf-8") if opts.pop("stamps", False) else None  # noqa: SIM115
    commits = open(log + ".commits", "a", encoding="utf-8") if stamps else None  # noqa: SIM115
    if commits is not None:
        out = commits

        def on_commit(units: list[int]) -> None:
            out.write(json.dumps({"t": time.monotonic(), "units": units}) + "\n")
            out.flush()

        opts["on_commit"] = on_commit
    with open(log, "a", encoding="utf-8") as f:
        opts.setdefault("reconnect_s", 60)
        loader = RemoteLoader(url, key, dataset, collate="arrow", **grouped(**opts))
        for logged, batch in enumerate(loader, 1):
            got = time.monotonic()
            f.write(json.dumps(batch.column("uid").to_pylist()) + "\n")
            f.flush()
            if stamps is not None:
                _stamp(stamps, loader, got)
            if state_path:
                with open(state_path + ".tmp", "w", encoding="utf-8") as s:
                    json.dump({"logged": logged, "state": loader.state_dict()}, s)
                os.replace(state_path + ".tmp", state_path)
            if sleep:
                time.sleep(sleep)
        f.write("END\n")
    for extra in (stamps, commits):
        if extra is not None:
            extra.close()


if __name__ == "__main__":
    main(sys.argv[1:6])
