"""Limits checked before a request does any work (a 400 JSON error that says what was expected).

The request models (:mod:`datamill.serve.http.routes.models`) bound each field alone; these checks
bound fields against the data: a world size against the dataset's samples, a lease against a sample
budget (a rewind is checked against the iteration by
:meth:`~datamill.serve.server.ServeState.check_rewind`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from datamill.core.errors import ConfigError
from datamill.serve.catalog import LEASE_SIZES, MAX_LEASE_SAMPLES
from datamill.serve.http.routes.models import IterationIn
from datamill.serve.server import ServeState

__all__ = ["MAX_LEASE_SAMPLES", "check_iteration"]


@functools.lru_cache(maxsize=256)
def _num_samples(path: str, stamp: int) -> int:
    from datamill.sources import open_source

    return int(sum(open_source(path).shard_sizes()))


def num_samples(ds: Mapping[str, Any]) -> int:
    """Samples of a registered dataset (cached until its folder or file changes)."""
    path = str(ds["path"])
    return _num_samples(path, os.stat(path).st_mtime_ns)


def check_iteration(state: ServeState, ds: Mapping[str, Any], body: IterationIn) -> None:
    """Refuse an iteration whose shape does not fit its dataset."""
    n = num_samples(ds)
    if body.world_size > max(1, n):
        raise ConfigError(
            f"world_size must be at most the dataset's {n:,} samples, got {body.world_size:,}",
            hint="use fewer ranks (each rank needs at least one sample)",
        )
    # sized by bytes, a lease is 16 batches or more (and at most what this bound allows)
    size = body.lease_size or (16 if body.lease_bytes is None else LEASE_SIZES[0])
    if body.batch_size * size > MAX_LEASE_SAMPLES:
        raise ConfigError(
            f"batch_size * lease_size must be at most {MAX_LEASE_SAMPLES:,} samples per lease, got "
            f"{body.batch_size:,} * {size:,}",
            hint="lower lease_size",
        )
