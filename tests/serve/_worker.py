"""A training-process stand-in: iterate a RemoteLoader, log each batch's uids (one JSON line,
flushed)."""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> None:
    from _opts import grouped  # this script's folder is on sys.path

    from datamill.client import RemoteLoader

    url, key, dataset, log, raw = argv
    opts = json.loads(raw)
    sleep = float(opts.pop("sleep", 0.0))
    state_path = opts.pop("state", None)  # write the loader's state_dict() after each logged batch
    with open(log, "a", encoding="utf-8") as f:
        opts.setdefault("reconnect_s", 60)
        loader = RemoteLoader(url, key, dataset, collate="arrow", **grouped(**opts))
        for logged, batch in enumerate(loader, 1):
            f.write(json.dumps(batch.column("uid").to_pylist()) + "\n")
            f.flush()
            if state_path:
                with open(state_path + ".tmp", "w", encoding="utf-8") as s:
                    json.dump({"logged": logged, "state": loader.state_dict()}, s)
                os.replace(state_path + ".tmp", state_path)
            if sleep:
                time.sleep(sleep)
        f.write("END\n")


if __name__ == "__main__":
    main(sys.argv[1:6])
