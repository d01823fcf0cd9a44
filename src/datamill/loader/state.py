"""The loader's resume state: tiny versioned JSON, checked field by field on load.

A state records *where* an iteration is (epoch, batches and samples consumed) and *what* it iterates
(dataset fingerprint, seed, the order-relevant config), never the samples themselves: resuming
recomputes the order and starts at ``batches_seen``. A state taken after an elastic resume
(:meth:`~datamill.loader.service.BatchService.resume_point`) also holds ``elastic``: the epoch's
history ``[[world_size, [samples consumed per rank]], ...]`` (see
:func:`~datamill.loader.order.remaining_positions`). ``num_workers`` and ``prefetch`` are not part
of it, so a run may resume with a different number of workers and gets the same batches.

The checks themselves are :mod:`datamill.core.state`'s (shared with the LM batches and the server);
this module only says what a loader state holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from datamill.core.constants import LOADER_STATE_FORMAT
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.state import StateSpec, check_resume_compat
from datamill.core.state import validate_state as validate_spec

__all__ = [
    "GLOBAL_FIELDS",
    "LOADER_STATE",
    "OPTIONAL_FIELDS",
    "ORDER_FIELDS",
    "STATE_FIELDS",
    "check_resume_compat",
    "config_fingerprint",
    "validate_state",
]

ORDER_FIELDS = (
    "batch_size",
    "bucket_by",
    "buckets",
    "columns",
    "drop_last",
    "rank",
    "replication",
    "shuffle",
    "warmup",
    "window",
    "world_size",
)
"""Config fields the batch sequence depends on (their values are saved in ``state["config"]``; the
:data:`OPTIONAL_FIELDS` only when they are not at their defaults)."""

OPTIONAL_FIELDS = ("bucket_by", "buckets", "replication", "warmup")
"""Fields a config leaves out at their defaults (states written before they existed still fit)."""

GLOBAL_FIELDS = (
    "dataset_fingerprint",
    "seed",
    "bucket_by",
    "buckets",
    "columns",
    "drop_last",
    "shuffle",
    "warmup",
    "window",
)
"""Fields the epoch's *global* order depends on: an elastic resume (another world size, rank or
batch size) needs only these to match."""

STATE_FIELDS = (
    "format",
    "epoch",
    "batches_seen",
    "samples_seen",
    "seed",
    "dataset_fingerprint",
    "config_fingerprint",
    "config",
)

LOADER_STATE = StateSpec(
    LOADER_STATE_FORMAT,
    fields=STATE_FIELDS,
    counters=("epoch", "batches_seen", "samples_seen", "seed"),
    producer="Loader.state_dict()",
    format_hint="the state was written by another program or an incompatible datamill version",
)
"""What a loader (or batch service) resume state looks like."""


def config_fingerprint(config: Mapping[str, Any]) -> str:
    """Fingerprint of the order-relevant config (sorted JSON, see :data:`ORDER_FIELDS`).

    Examples:
        >>> config_fingerprint({"batch_size": 2}) == config_fingerprint({"batch_size": 2})
        True
    """
    return fingerprint_obj(
        {k: config.get(k) for k in ORDER_FIELDS if k in config or k not in OPTIONAL_FIELDS}
    )


def validate_state(state: Any) -> dict[str, Any]:
    """Check a loader state's shape and format version; returns it as a dict.

    Raises:
        ResumeStateError: not a dict, unknown format, missing fields, negative counters.

    Examples:
        >>> validate_state({"format": "other/9"})  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.ResumeStateError: resume state has format 'other/9', expected
        'datamill.loader/1'...
    """
    return validate_spec(state, LOADER_STATE)
