"""``datamill serve iterate DATASET --url URL`` (and ``datamill iterate DATASET --url URL``): a
client of a running server, iterating a served dataset once and printing its throughput.

It lives with the client it drives (:class:`~datamill.client.RemoteLoader`), not with the server;
``datamill serve`` registers it as its ``iterate`` command.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from datamill.core.checks import Limit
from datamill.core.cliargs import (
    add_batch_size,
    add_columns,
    add_epoch,
    add_ranks,
    add_seed,
    add_served,
    columns_of,
)

__all__ = ["add_iterate_options", "run_iterate"]


def run_iterate(args: argparse.Namespace) -> int:
    """Iterate a served dataset once and print throughput (``datamill serve iterate``, ``datamill
    iterate --url``): the command's parsed options, whole (:func:`add_iterate_options`).

    ``args.key`` defaults to ``$DATAMILL_KEY``; ``args.transport``: ``"built"`` (the server builds
    the batches) or ``"direct"`` (this process builds them from the dataset's client location).
    ``epoch`` and ``reconnect_timeout`` default to ``0`` and ``3`` seconds when absent.

    Raises:
        RemoteError: the server cannot be reached within ``reconnect_timeout`` seconds, or refused a
            request.
    """
    from datamill.client import Leases, RemoteLoader, Transport

    key = args.key if args.key is not None else os.environ.get("DATAMILL_KEY")
    transport = args.transport or "built"
    loader = RemoteLoader(
        args.url,
        key,
        args.dataset,
        batch_size=args.batch_size,
        seed=args.seed,
        epoch=getattr(args, "epoch", 0),
        columns=columns_of(args.columns),
        rank=args.rank,
        collate="arrow",
        leases=Leases(world_size=args.world_size, mode=args.mode, name=args.name),
        transport=Transport(transport, reconnect_s=getattr(args, "reconnect_timeout", 3.0)),
    )
    start = time.perf_counter()
    rows = batches = 0
    for batch in loader:
        rows += batch.num_rows
        batches += 1
        if args.limit and batches >= args.limit:
            break
    dt = time.perf_counter() - start
    print(
        f"iteration {loader.iteration_id}: {batches:,} batches, {rows:,} samples in {dt:.2f} s "
        f"({rows / max(dt, 1e-9):,.0f} samples/s; waited {loader.stall_s:.2f} s for data; "
        f"transport {transport})"
    )
    if args.save_state:
        from datamill.core.io import atomic_write

        with atomic_write(args.save_state, "w") as f:
            json.dump(loader.state_dict(), f, indent=2, sort_keys=True)
    return 0


def add_iterate_options(p: argparse.ArgumentParser) -> None:
    """The options of ``datamill serve iterate``."""
    p.add_argument("dataset", help="registered dataset id or name")
    add_served(p, url_required=True)
    add_batch_size(p)
    add_seed(p)
    add_epoch(p)
    add_columns(p)
    add_ranks(p)
    p.add_argument(
        "--limit",
        type=Limit("limit", low=0).arg,
        default=0,
        help="stop after this many batches (default 0: all)",
    )
    p.add_argument(
        "--save-state", default=None, help="write the RemoteLoader state JSON here at the end"
    )
    p.add_argument(
        "--reconnect-timeout",
        type=Limit("reconnect_timeout", low=0, high=3600, kind="float").arg,
        default=3.0,
        help="seconds to keep retrying an unreachable server before failing (default 3)",
    )
