"""The command-line option groups, each declared once (flag, type, default and help text), for
every command that offers it: ``--batch-size``; ``--seed``/``--no-shuffle``/``--drop-last`` (the
order); ``--rank``/``--world-size``; ``--columns``; ``--cache-dir``/``--cache-limit``;
``--overwrite``; ``--engine``. ``--quiet`` is global (:mod:`datamill.cli` takes it anywhere).

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

from datamill.core.checks import BATCH_SIZE, CACHE_MIB, SEED, WORLD_SIZE, Limit

__all__ = [
    "RANK",
    "add_batch_size",
    "add_cache",
    "add_columns",
    "add_engine",
    "add_order",
    "add_overwrite",
    "add_ranks",
    "add_seed",
    "cache_bytes",
    "columns_of",
]

RANK = Limit("rank", low=0, high=WORLD_SIZE.high)
"""A rank (checked against ``world_size`` by the API)."""

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


def add_overwrite(p: Parser, *, target: str = "--out") -> None:
    """``--overwrite``: replace another kind of datamill output at ``target``."""
    p.add_argument(
        "--overwrite",
        action="store_true",
        help=f"also replace another kind of datamill output at {target} (never an input or a "
        "file of yours)",
    )


def add_engine(p: Parser, *, output: str) -> None:
    """``--engine local|ray`` (``output``: what a Ray run writes)."""
    p.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help=f"local: this machine (default); ray: a Ray cluster, {output}",
    )
