"""``datamill iterate SOURCE``: iterate any datamill output with the Loader and print throughput."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

__all__ = ["register"]


def _cmd(args: argparse.Namespace) -> int:
    from datamill.core.io import check_output
    from datamill.loader.loader import Loader
    from datamill.sources import open_source

    if args.save_state:
        check_output(args.save_state, is_own=_is_state_file, inputs=[args.source],
                     what="loader state file")
    source = open_source(args.source)
    cols = args.columns.split(",") if args.columns else None
    loader = Loader(source, args.batch_size, shuffle=not args.no_shuffle, seed=args.seed, columns=cols,
                    rank=args.rank, world_size=args.world_size, num_workers=args.num_workers,
                    drop_last=args.drop_last, progress=True)
    if args.resume:
        _resume(loader, args.resume)
    n = int(source.shard_sizes().sum())
    print(f"{type(source).__name__}: {n:,} samples in {source.num_shards} shards; "
          f"rank {args.rank}/{args.world_size}: {len(loader)} batches of {args.batch_size}")
    start = time.perf_counter()
    shapes: dict[str, Any] = {}
    first_epoch = loader.epoch
    for e in range(args.epochs):
        if e:
            loader.set_epoch(first_epoch + e)  # also after an epoch cut short by --limit
        for i, batch in enumerate(loader):
            if not shapes and isinstance(batch, dict):
                shapes = {k: tuple(getattr(v, "shape", (len(v),))) for k, v in batch.items()}
            if args.limit and i + 1 >= args.limit:
                break
        s = loader.stats()
        print(f"epoch {s['epoch']}: read {s['read']:,}, filtered {s['filtered']:,}, failed {s['failed']:,}, "
              f"yielded {s['yielded']:,} in {s['elapsed_s']:.2f} s ({s['samples_per_s']:,.0f} samples/s; "
              f"first batch after {(s['first_batch_s'] or 0) * 1000:.1f} ms)")
    if shapes:
        print("batch: " + ", ".join(f"{k} {v}" for k, v in shapes.items()))
    print(f"total {time.perf_counter() - start:.2f} s")
    if args.save_state:
        from datamill.core.io import atomic_write

        with atomic_write(args.save_state, "w") as f:
            json.dump(loader.state_dict(), f, indent=2, sort_keys=True)
        print(f"state -> {args.save_state}")
    return 0


def _is_state_file(path: Path) -> bool:
    from datamill.core.constants import LOADER_STATE_FORMAT

    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and state.get("format") == LOADER_STATE_FORMAT


def _resume(loader: Any, path: str) -> None:
    """Load a state written by ``--save-state``; every problem names the file."""
    from datamill.core.errors import DataFileNotFoundError, DatamillError, ResumeStateError

    hint = "pass a state JSON written by `datamill iterate --save-state` for this source"
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError as exc:
        raise DataFileNotFoundError("no such resume-state file", path=path, hint=hint) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ResumeStateError(f"cannot read the resume-state file ({exc.__class__.__name__})", path=path,
                               hint=hint) from exc
    except ValueError as exc:
        raise ResumeStateError(f"not valid JSON (truncated or edited?): {exc}", path=path, hint=hint) from exc
    if not isinstance(state, dict):
        raise ResumeStateError(f"expected a JSON object, got {type(state).__name__}", path=path, hint=hint)
    try:
        loader.load_state_dict(state)
    except DatamillError as exc:
        if exc.path is not None:
            raise
        raise ResumeStateError(exc.msg, path=path, hint=exc.hint or hint) from exc
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:  # an edited state's field
        raise ResumeStateError(f"the state is malformed ({exc.__class__.__name__}: {exc})", path=path,
                               hint=hint) from exc


def register(sub: Any) -> None:
    """Add ``datamill iterate``."""
    p = sub.add_parser("iterate", help="iterate a datamill output with the loader; print throughput and stats")
    p.add_argument("source", help="shardset dataset folder, corpus folder, .hdf5 file, Parquet file or folder")
    p.add_argument("--batch-size", type=int, default=256, help="samples per batch (default 256)")
    p.add_argument("--epochs", type=int, default=1, help="epochs to run (default 1)")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    p.add_argument("--no-shuffle", action="store_true", help="keep the source order")
    p.add_argument("--columns", help="comma-separated columns to read (default all)")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--num-workers", type=int, default=0, help="batch-building threads (default 0)")
    p.add_argument("--drop-last", action="store_true", help="equal batches on every rank; drop the partial batch")
    p.add_argument("--limit", type=int, default=0, help="stop each epoch after this many batches")
    p.add_argument("--resume", help="resume from a state JSON written by --save-state")
    p.add_argument("--save-state", help="write the loader state JSON here at the end")
    p.set_defaults(func=_cmd)
