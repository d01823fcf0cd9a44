"""The loader's resume state: tiny versioned JSON, checked field by field on load.

A state records *where* an iteration is (epoch, batches and samples consumed) and *what* it iterates
(dataset fingerprint, seed, the order-relevant config), never the samples themselves: resuming
recomputes the order and starts at ``batches_seen``. ``num_workers`` and ``prefetch`` are not part
of it, so a run may resume with a different number of workers and gets the same batches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from datamill.core.constants import LOADER_STATE_FORMAT
from datamill.core.errors import ResumeStateError
from datamill.core.fingerprint import fingerprint_obj

__all__ = ["ORDER_FIELDS", "STATE_FIELDS", "check_resume_compat", "config_fingerprint", "validate_state"]

ORDER_FIELDS = ("batch_size", "columns", "drop_last", "rank", "shuffle", "window", "world_size")
"""Config fields the batch sequence depends on (their values are saved in ``state["config"]``)."""

STATE_FIELDS = ("format", "epoch", "batches_seen", "samples_seen", "seed", "dataset_fingerprint",
                "config_fingerprint", "config")


def config_fingerprint(config: Mapping[str, Any]) -> str:
    """Fingerprint of the order-relevant config (sorted JSON, see :data:`ORDER_FIELDS`).

    Examples:
        >>> config_fingerprint({"batch_size": 2}) == config_fingerprint({"batch_size": 2})
        True
    """
    return fingerprint_obj({k: config.get(k) for k in ORDER_FIELDS})


def validate_state(state: Any) -> dict[str, Any]:
    """Check a state's shape and format version; returns it as a dict.

    Raises:
        ResumeStateError: not a dict, unknown format, missing fields, negative counters.

    Examples:
        >>> validate_state({"format": "other/9"})
        Traceback (most recent call last):
        ...
        datamill.core.errors.ResumeStateError: resume state has format 'other/9', expected 'datamill.loader/1'...
    """
    if not isinstance(state, Mapping):
        raise ResumeStateError(f"resume state must be a dict (from Loader.state_dict()), got {type(state).__name__}")
    if state.get("format") != LOADER_STATE_FORMAT:
        raise ResumeStateError(f"resume state has format {state.get('format')!r}, expected {LOADER_STATE_FORMAT!r}",
                               hint="the state was written by another program or an incompatible datamill version")
    missing = [f for f in STATE_FIELDS if f not in state]
    if missing:
        raise ResumeStateError(f"resume state lacks field(s) {', '.join(missing)}")
    for f in ("epoch", "batches_seen", "samples_seen", "seed"):
        if not isinstance(state[f], int) or state[f] < 0:
            raise ResumeStateError(f"resume state field {f!r} must be an int >= 0, got {state[f]!r}")
    return dict(state)


def check_resume_compat(
    saved: Mapping[str, Any], current: Mapping[str, Any], *, fields: Sequence[str],
    allow_mismatch: Iterable[str] = (),
) -> None:
    """Compare ``saved[f]`` with ``current[f]`` for every field; one error listing every mismatch.

    Args:
        saved: the saved values (a resume state, or its ``config``).
        current: the values of the loader resuming.
        fields: the fields to compare.
        allow_mismatch: fields whose difference is accepted. Defaults to ``()``.

    Raises:
        ResumeStateError: listing ``field: saved X, now Y`` for each differing field.

    Examples:
        >>> check_resume_compat({"a": 1, "b": 2}, {"a": 1, "b": 2}, fields=["a", "b"])
        >>> check_resume_compat({"a": 1, "b": 2}, {"a": 3, "b": 4}, fields=["a", "b"])
        Traceback (most recent call last):
        ...
        datamill.core.errors.ResumeStateError: resume state does not fit this loader: a: saved 1, now 3; b: saved 2, now 4...
    """
    allowed = set(allow_mismatch)
    diffs = [f"{f}: saved {saved.get(f)!r}, now {current.get(f)!r}"
             for f in fields if f not in allowed and saved.get(f) != current.get(f)]
    if diffs:
        raise ResumeStateError(
            "resume state does not fit this loader: " + "; ".join(diffs),
            hint="resume with the same dataset and order settings, or pass allow_mismatch=[...] to accept them")
