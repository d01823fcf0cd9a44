#!/usr/bin/env python
"""Regenerate the web UI screenshots in docs/ (docs/ui-*.png) from a real server and Debian's
Chromium.

    python scripts/screenshots.py [--out docs] [--data $DATAMILL_DATA]

Builds a shardset dataset from cifar10_tiny in a temporary folder, starts ``datamill serve`` on a
free loopback port, iterates it once from a RemoteLoader, then opens each page in headless Chromium
(/usr/bin/chromium through playwright; never ``playwright install``) and saves a screenshot. The
server is stopped by its pid at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa

from datamill.client import Leases

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]


def build(data: Path, root: Path) -> None:
    """cifar10_tiny as shardsets image (PNG bytes + a path to a copy), label and caption (80%)."""
    from datamill.core.io import read_table
    from datamill.shards.dataset import ShardsetDataset

    src = data / "cifar10_tiny"
    labels = read_table(src / "labels.csv").rename_columns(["uid", "image_path", "label"])
    files = labels.column("image_path").to_pylist()
    (root / "cifar_images").mkdir(parents=True)
    for f in files:
        shutil.copy(src / f, root / "cifar_images" / Path(f).name)
    images = pa.table(
        {
            "uid": labels.column("uid"),
            "png": pa.array([(src / f).read_bytes() for f in files]),
            "image_path": [f"../cifar_images/{Path(f).name}" for f in files],
        }
    )
    ds = ShardsetDataset.create(root / "cifar", images, uid="uid", shardset="image", shard_size=25)
    ds = ds.add("label", labels.select(["uid", "label"]), route=True)
    lab = labels.take(pa.array(np.flatnonzero(np.arange(labels.num_rows) % 5 != 4)))
    ds = ds.add(
        "caption",
        pa.table(
            {
                "uid": lab.column("uid"),
                "caption": [f"a small photo of a {x}" for x in lab.column("label").to_pylist()],
            }
        ),
        route=True,
    )
    rng = np.random.default_rng(
        0
    )  # a float32 score and a 12-value embedding: how numbers and vectors render
    n = labels.num_rows
    ds.add(
        "feat",
        pa.table(
            {
                "uid": labels.column("uid"),
                "score": pa.array(rng.random(n, dtype=np.float32)),
                "emb": pa.array(
                    list(rng.standard_normal((n, 12)).astype(np.float32)), pa.list_(pa.float32())
                ),
            }
        ),
        route=True,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "docs"))
    p.add_argument(
        "--data", default=os.environ.get("DATAMILL_DATA", str(ROOT.parent / "shared" / "data"))
    )
    args = p.parse_args()
    from playwright.sync_api import sync_playwright

    from datamill.client import Client, RemoteLoader
    from datamill.serve.http.auth import create_key
    from datamill.serve.journal.store import Journal

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="datamill-shots-") as tmp:
        base = Path(tmp)
        build(Path(args.data), base / "root")
        journal = Journal(base / "state")
        _, key = create_key(journal, role="admin", note="screenshots")
        journal.close()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "datamill.cli",
                "serve",
                str(base / "root"),
                "--port",
                str(port),
                "--state",
                str(base / "state"),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(300):
                try:
                    urllib.request.urlopen(url + "/api/v1/health", timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.1)
            with Client(url, key) as c:
                ds = c.register("cifar", name="cifar10_tiny")
            for epoch in (0, 1):  # two epochs of one named run: the run page compares them
                loader = RemoteLoader(
                    url,
                    key,
                    "cifar10_tiny",
                    batch_size=4,
                    collate="arrow",
                    epoch=epoch,
                    leases=Leases(size=1, name="demo"),
                )
                for _ in loader:
                    time.sleep(0.05 * (epoch + 1))
            with Client(url, key) as c:
                c.iteration("cifar10_tiny", batch_size=8, leases=Leases(name="cancelled-try"))
                c.cancel(
                    c.iteration("cifar10_tiny", batch_size=8, leases=Leases(name="cancelled-try"))[
                        "id"
                    ]
                )
                c.iteration("cifar10_tiny", batch_size=16, leases=Leases(name="waiting"))
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                page.goto(url + "/ui/login")
                page.fill("#key", key)
                page.click("form[action='/ui/login'] button[type=submit]")
                page.wait_for_selector("nav[aria-label=Main]")
                shots = {
                    "datasets": "/ui/datasets",
                    "dataset": f"/ui/datasets/{ds['id']}",
                    "samples": f"/ui/datasets/{ds['id']}/samples?limit=12",
                    "iteration": f"/ui/iterations/{loader.iteration_id}",
                    "iterations": "/ui/iterations",
                    "run": "/ui/runs/demo",
                }
                for name, path in shots.items():
                    page.goto(url + path)
                    if name == "dataset":
                        page.click("#columns tr[data-column='label'] button.values")
                        page.wait_for_selector(
                            "#columns tr[data-values-for='label'] [data-status=done]"
                        )
                    page.wait_for_load_state("load")
                    page.screenshot(
                        path=str(out / f"ui-{name}.png"), full_page=name in ("dataset", "iteration")
                    )
                    print(f"wrote {out / f'ui-{name}.png'}")
                page.set_viewport_size({"width": 400, "height": 860})  # a phone: nothing overflows
                page.goto(url + f"/ui/iterations/{loader.iteration_id}")
                page.screenshot(path=str(out / "ui-iteration-400px.png"))
                print(f"wrote {out / 'ui-iteration-400px.png'}")
                browser.close()
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
