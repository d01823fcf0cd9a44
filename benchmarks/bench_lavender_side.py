"""lavender-data's side of ``bench_loader.py``: run with the Python of a venv holding
``lavender-data``.

lavender-data pins numpy 2.1.2 and pyarrow 19.0.1, so it cannot share datamill's venv. Install it in
its own venv: ``python3 -m venv /work/lvenv && /work/lvenv/bin/pip install lavender-data tqdm``.
(0.1.10 imports tqdm without declaring it.)

Given the folder that ``bench_loader.py`` wrote (``features/``, ``label/``, ``extra/``, each with
``shard.00000.parquet`` ...: lavender's own layout), this script:

1. starts a lavender-data server on localhost, with its home, SQLite database and ``.env`` in a
   temporary folder (removed at the end), and the UI and auth off;
2. registers the dataset (UID column ``uid``) with the three shardsets, and waits for them to sync;
3. iterates with the client's ``LavenderDataLoader(shuffle=True, shuffle_block_size=7,
   batch_size=256)``, the same window as datamill's default, for ``--batches`` batches;
4. prints one JSON line: samples, seconds, samples/s, time to first batch, setup seconds, and the
   peak RSS of the server processes and of this client.

It never imports datamill. On failure, it prints a JSON line with an ``error`` field.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except OSError:
            pass
    return out


def _hwm_mib(pids: list[int]) -> float:
    """Sum of the peak RSS (VmHWM) of ``pids``, MiB."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def _wait_for(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def run(root: Path, batches: int, port: int, batch_size: int, block: int) -> dict[str, Any]:
    from lavender_data.client import LavenderDataLoader
    from lavender_data.client import api as lv

    home = Path(tempfile.mkdtemp(prefix="lavender-home-"))
    env = {
        **os.environ,
        "HOME": str(home),
        "LAVENDER_DATA_DISABLE_UI": "true",
        "LAVENDER_DATA_DISABLE_AUTH": "true",
        "LAVENDER_DATA_HOST": "127.0.0.1",
        "LAVENDER_DATA_PORT": str(port),
    }
    exe = Path(sys.executable).parent / "lavender-data"
    log = open(home / "server.log", "wb")  # noqa: SIM115 - the server writes to it; closed in the finally below
    server = subprocess.Popen(
        [str(exe), "server", "run", "--init"],
        cwd=home,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        t0 = time.perf_counter()
        _wait_for(f"http://127.0.0.1:{port}/version", 90)
        lv.init(api_url=f"http://127.0.0.1:{port}")
        ds = lv.create_dataset(
            name=f"bench{os.getpid()}",
            uid_column_name="uid",
            shardset_location=f"file://{root / 'features'}/",
        )
        for name in ("label", "extra"):
            lv.create_shardset(ds.id, f"file://{root / name}/")
        deadline = time.monotonic() + 600
        while True:  # the shardsets are inspected in the background
            if time.monotonic() > deadline:
                raise TimeoutError("the shardsets did not finish syncing within 600 s")
            d = lv.get_dataset(ds.id)
            if len(d.shardsets) == 3 and all(
                lv.get_sync_shardset_status(ds.id, s.id) is None for s in d.shardsets
            ):
                break
            time.sleep(0.5)
        setup = time.perf_counter() - t0
        t = time.perf_counter()
        it = LavenderDataLoader(
            dataset_id=ds.id,
            shuffle=True,
            shuffle_seed=0,
            shuffle_block_size=block,
            batch_size=batch_size,
        )
        samples, first, n = 0, None, 0
        for batch in it:
            if first is None:
                first = time.perf_counter() - t
            samples += len(batch["uid"])
            n += 1
            if n >= batches:
                break
        seconds = time.perf_counter() - t
        return {
            "samples": samples,
            "batches": n,
            "seconds": seconds,
            "samples_per_s": samples / seconds,
            "first_batch_s": first,
            "setup_s": setup,
            "server_peak_mib": _hwm_mib(_tree(server.pid)),
            "client_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "batch_type": type(batch["uid"]).__name__,
            "lavender_version": _version(),
        }
    except Exception as exc:  # the server log is removed below: keep its end in the message
        log.flush()
        tail = (home / "server.log").read_bytes()[-400:].decode(errors="replace").strip()
        raise RuntimeError(f"{type(exc).__name__}: {exc}; server log ends: {tail!r}") from exc
    finally:
        for p in reversed(_tree(server.pid)):
            try:
                os.kill(p, 15)
            except OSError:
                pass
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            for p in _tree(server.pid):
                try:
                    os.kill(p, 9)
                except OSError:
                    pass
            server.wait(10)
        log.close()
        shutil.rmtree(home, ignore_errors=True)  # its SQLite DB, .env, log and cache


def _version() -> str:
    from importlib.metadata import version

    return version("lavender-data")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "root", type=Path, help="the folder bench_loader.py wrote (features/, label/, extra/)"
    )
    ap.add_argument("--batches", type=int, default=100, help="batches to time (default 100)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--block", type=int, default=7, help="shuffle_block_size in shards (default 7)")
    ap.add_argument("--port", type=int, default=18731)
    args = ap.parse_args()
    try:
        out = run(args.root.resolve(), args.batches, args.port, args.batch_size, args.block)
    except Exception as exc:  # noqa: BLE001 - reported to bench_loader.py as data, not a traceback
        out = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
