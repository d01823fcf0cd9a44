"""``datamill demo``: an end-to-end tour on the shared datasets.

Each capability contributes a section from its own ``demo`` module (``run(data_dir, work_dir)``),
listed in ``DEMO_MODULES``; sections run in order inside one temporary folder.
"""

from __future__ import annotations

import argparse
import importlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from datamill.core.errors import DataFileNotFoundError

__all__ = ["DEMO_MODULES", "find_data_dir", "register", "run_demo"]

DEMO_MODULES = (
    "datamill.preprocessing.demo",
    "datamill.text.demo",
    "datamill.pretrain.word2vec.demo",
    "datamill.pretrain.bert.demo",
    "datamill.shards.demo",
    "datamill.loader.demo",
    "datamill.serve.demo",
)


def find_data_dir(explicit: str | None = None) -> Path:
    """``--data``, else ``$DATAMILL_DATA``, else ``../shared/data`` from here or from the repo."""
    candidates: list[str | None]
    if explicit is not None:
        candidates = [explicit]
    else:
        candidates = [
            os.environ.get("DATAMILL_DATA"),
            "../shared/data",
            str(Path(__file__).resolve().parents[3] / ".." / "shared" / "data"),
        ]
    for c in candidates:
        if c and (Path(c) / "house_prices_train.csv").exists():
            return Path(c).resolve()
    raise DataFileNotFoundError(
        "cannot find the shared data folder",
        path=explicit or "../shared/data",
        hint="pass --data DIR or set DATAMILL_DATA",
    )


def run_demo(
    data_dir: Path, *, work_dir: Path | None = None, only: list[str] | None = None
) -> None:
    """Run every available demo section (or those whose name contains one of ``only``)."""
    with tempfile.TemporaryDirectory(prefix="datamill-demo-") as tmp:
        work = Path(work_dir or tmp)
        print(f"datamill demo: data from {data_dir}, outputs in {work}")
        for name in DEMO_MODULES:
            if only and not any(o in name for o in only):
                continue
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError as exc:
                if exc.name is not None and name.startswith(exc.name):
                    continue
                raise
            start = time.perf_counter()
            module.run(data_dir, work)
            print(
                f"  [{name.rsplit('.', 2)[-2]}.{name.rsplit('.', 1)[-1]} took "
                f"{time.perf_counter() - start:.2f} s]"
            )


def _cmd(args: argparse.Namespace) -> int:
    run_demo(
        find_data_dir(args.data),
        work_dir=Path(args.work_dir) if args.work_dir else None,
        only=args.only,
    )
    return 0


def register(sub: Any) -> None:
    """Add ``datamill demo``."""
    p = sub.add_parser("demo", help="end-to-end demo on ../shared/data")
    p.add_argument("--data", help="the shared data folder (default: ../shared/data)")
    p.add_argument("--work-dir", help="keep outputs here instead of a temporary folder")
    p.add_argument(
        "--only", nargs="*", help="run only the sections whose module name contains these"
    )
    p.set_defaults(func=_cmd)
