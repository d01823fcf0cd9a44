"""The command-line option groups, each declared once (flag, type, default and help text), for
every command that offers it: ``--batch-size``; ``--seed``/``--no-shuffle``/``--drop-last`` (the
order); ``--epoch``; ``--epochs``; ``--rank``/``--world-size``; ``--columns``;
``--cache-dir``/``--cache-limit``; ``--num-workers`` (the loader's threads); ``--workers`` (worker
processes); ``--overwrite``; ``--engine``/``--address``; the served iteration's
``--url``/``--key``/``--mode``/``--name``/``--transport``. ``--quiet`` is global
(:mod:`datamill.cli` takes it anywhere).

A value is checked where it is declared (:class:`~datamill.core.checks.Limit`), so a command line
and the API refuse the same values with the same words; parsed values are turned back into API
arguments by the helpers here (:func:`columns_of`, :func:`cache_bytes`).

Examples:
    >>> import argparse
    >>> p = argparse.ArgumentParser()
    >>> add_batch_size(p)
    >>> add_order(p)
    >>> add_columns(p)
    >>> args = p.parse_args(["--batch-size", "8", "--seed", "3", "--columns", "x,y"])
    >>> args.batch_size, args.seed, args.no_shuffle, columns_of(args.columns)
    (8, 3, False, ['x', 'y'])
"""

from __future__ import annotations

import argparse

from datamill.core.checks import (
    BATCH_SIZE,
    CACHE_MIB,
    EPOCHS,
    NUM_WORKERS,
    SEED,
    WORLD_SIZE,
    Limit,
)

__all__ = [
    "EPOCH",
    "PROCESSES",
    "RANK",
    "add_batch_size",
    "add_cache",
    "add_columns",
    "add_engine",
    "add_epoch",
    "add_epochs",
    "add_order",
    "add_overwrite",
    "add_processes",
    "add_ranks",
    "add_seed",
    "add_served",
    "add_threads",
    "cache_bytes",
    "columns_of",
]

RANK = Limit("rank", low=0, high=WORLD_SIZE.high)
"""A rank (checked against ``world_size`` by the API)."""
EPOCH = Limit("epoch", low=0)
"""An epoch number."""
PROCESSES = Limit("workers", low=1, high=1024)
"""Worker processes."""

Parser = argparse.ArgumentParser | argparse._ArgumentGroup


def add_batch_size(p: Parser, *, default: int = 256) -> None:
    """``--batch-size N``: samples per batch."""
    p.add_argument(
        "--batch-size",
        type=BATCH_SIZE.arg,
        default=default,
        help=f"samples per batch (default {default})",
    )


def add_seed(p: Parser, *, what: str = "shuffle seed") -> None:
    """``--seed N`` (``what`` it seeds, for the help)."""
    p.add_argument("--seed", type=SEED.arg, default=0, help=f"{what} (default 0)")


def add_order(p: Parser, *, drop_last: bool = False) -> None:
    """The order group: ``--seed``, ``--no-shuffle`` and (``drop_last``) ``--drop-last``."""
    add_seed(p)
    p.add_argument("--no-shuffle", action="store_true", help="keep the source order")
    if drop_last:
        p.add_argument(
            "--drop-last",
            action="store_true",
            help="equal batches on every rank; drop the partial batch",
        )


def add_epoch(p: Parser) -> None:
    """``--epoch N``: the epoch to iterate."""
    p.add_argument("--epoch", type=EPOCH.arg, default=0, help="epoch to iterate (default 0)")


def add_epochs(p: Parser, *, what: str = "run") -> None:
    """``--epochs N``: epochs to ``what`` (run, plan...)."""
    p.add_argument("--epochs", type=EPOCHS.arg, default=1, help=f"epochs to {what} (default 1)")


def add_threads(p: Parser) -> None:
    """``--num-workers N``: the loader's batch-building threads (``Workers(threads=)``)."""
    p.add_argument(
        "--num-workers",
        type=NUM_WORKERS.arg,
        default=0,
        help="the loader's batch-building threads (default 0)",
    )


def add_processes(p: Parser, *, default: str = "the cores") -> None:
    """``--workers N``: worker processes (``default``: what ``None`` means, for the help)."""
    p.add_argument(
        "--workers", type=PROCESSES.arg, default=None, help=f"worker processes (default: {default})"
    )


def add_served(p: Parser, *, url_required: bool = False, url_help: str | None = None) -> None:
    """A served iteration (:class:`~datamill.client.RemoteLoader`): ``--url``, ``--key``,
    ``--mode``, ``--name`` and ``--transport``. Without ``url_required`` the others apply with
    ``--url`` only, and ``--transport`` defaults to ``None`` (the command checks it needs
    ``--url``); ``--key`` defaults to ``None`` (``$DATAMILL_KEY`` when the loader is made)."""
    p.add_argument(
        "--url",
        required=url_required,
        help=url_help or "the server running `datamill serve`, e.g. http://127.0.0.1:8470",
    )
    p.add_argument("--key", default=None, help="API key (default $DATAMILL_KEY)")
    p.add_argument(
        "--mode",
        choices=["static", "dynamic"],
        default="static",
        help="static (a fixed plan per rank) or dynamic (batches to whoever asks) (default static)",
    )
    p.add_argument(
        "--name", default=None, help="iteration name (processes with one name share an iteration)"
    )
    p.add_argument(
        "--transport",
        choices=["built", "direct"],
        default="built" if url_required else None,
        help="built: the server builds the batches; direct: this process builds them from the "
        "dataset's client location (docs/serving-scale.md) (default built)",
    )


def add_ranks(p: Parser, *, rank: bool = True) -> None:
    """``--rank R`` (with ``rank``) and ``--world-size W``."""
    if rank:
        p.add_argument("--rank", type=RANK.arg, default=0, help="this process's rank (default 0)")
    p.add_argument(
        "--world-size", type=WORLD_SIZE.arg, default=1, help="ranks in the job (default 1)"
    )


def add_columns(p: Parser, *, help: str = "comma-separated columns to read (default all)") -> None:
    """``--columns a,b``; :func:`columns_of` gives the list."""
    p.add_argument("--columns", default=None, help=help)


def columns_of(text: str | None) -> list[str] | None:
    """``"a,b"`` -> ``["a", "b"]``; ``None`` or ``""`` -> ``None`` (every column)."""
    return [c for c in text.split(",") if c] or None if text else None


def add_cache(p: Parser, *, limit: bool = True) -> None:
    """``--cache-dir`` and (``limit``) ``--cache-limit MiB``: the local shard cache of remote
    sources; :func:`cache_bytes` converts the limit."""
    p.add_argument(
        "--cache-dir",
        help="local shard cache for s3:// sources (default: a datamill folder in TMPDIR)",
    )
    if limit:
        p.add_argument(
            "--cache-limit",
            type=CACHE_MIB.arg,
            default=None,
            help="shard cache size in MiB (default unbounded)",
        )


def cache_bytes(mib: float | None) -> int | None:
    """``--cache-limit`` (MiB) in bytes."""
    return None if mib is None else int(mib * 2**20)


def add_overwrite(p: Parser, *, target: str = "--out", note: str = "") -> None:
    """``--overwrite``: replace another kind of datamill output at ``target`` (``note``: what
    the command replaces anyway, for the help)."""
    p.add_argument(
        "--overwrite",
        action="store_true",
        help=f"also replace another kind of datamill output at {target}{note} (never an input or "
        "a file of yours)",
    )


def add_engine(p: Parser, *, output: str) -> None:
    """``--engine local|ray`` (``output``: what a Ray run writes) and ``--address``."""
    p.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help=f"local: this machine (default); ray: a Ray cluster, {output}",
    )
    p.add_argument(
        "--address", help="with --engine ray: the cluster (auto or HOST:PORT; default: a local Ray)"
    )
