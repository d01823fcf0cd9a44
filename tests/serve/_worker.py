"""A training-process stand-in: iterate a RemoteLoader, log each batch's uids (one JSON line, flushed)."""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> None:
    from datamill.serve import RemoteLoader

    url, key, dataset, log, raw = argv
    opts = json.loads(raw)
    sleep = float(opts.pop("sleep", 0.0))
    with open(log, "a", encoding="utf-8") as f:
        loader = RemoteLoader(url, key, dataset, collate="arrow", reconnect_s=60, **opts)
        for batch in loader:
            f.write(json.dumps(batch.column("uid").to_pylist()) + "\n")
            f.flush()
            if sleep:
                time.sleep(sleep)
        f.write("END\n")


if __name__ == "__main__":
    main(sys.argv[1:6])
