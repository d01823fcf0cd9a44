"""Versioned resume states: one shape check and one table-driven compatibility check for everyone.

A resume state is a tiny JSON-able dict that names its format (``"<producer>/<version>"``), records
*where* an iteration is (counters such as ``epoch`` and ``batches_seen``) and *what* it iterates
(fingerprints, seed, the order-relevant settings). Resuming recomputes the order; it never replays
samples. Every stateful iterator (the loader, the LM batches, a server's iterations) describes its
state with a :class:`StateSpec` and checks it with :func:`validate_state`, then compares the saved
values with its own with :func:`check_resume_compat`, which raises ONE
:class:`~datamill.core.errors.ResumeStateError` listing every mismatch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from datamill.core.checks import check_int
from datamill.core.errors import ResumeStateError

__all__ = ["StateSpec", "check_resume_compat", "validate_state"]


@dataclass(frozen=True)
class StateSpec:
    """What a valid state of one producer looks like.

    Args:
        format: the exact ``"<producer>/<version>"`` string a state must carry.
        fields: every field a state must have.
        counters: fields that must be ints ``>= 0``. Defaults to ``()``.
        producer: what writes such states, named in the error for a non-dict. Defaults to ``None``.
        format_hint: the fix printed when the format differs. Defaults to ``None``.

    Examples:
        >>> spec = StateSpec("demo/1", fields=("format", "epoch"), counters=("epoch",))
        >>> validate_state({"format": "demo/1", "epoch": 2}, spec)
        {'format': 'demo/1', 'epoch': 2}
    """

    format: str
    fields: Sequence[str]
    counters: Sequence[str] = ()
    producer: str | None = None
    format_hint: str | None = None


def validate_state(state: Any, spec: StateSpec, /) -> dict[str, Any]:
    """Check a state's shape and format version against ``spec``; returns it as a new dict.

    Args:
        state: the saved state (a dict, e.g. read back from JSON).
        spec: what the state must look like.

    Returns:
        A copy of ``state``.

    Raises:
        ResumeStateError: not a dict, another format or version, missing fields, or a counter that
            is not an int ``>= 0``.

    Examples:
        >>> spec = StateSpec("demo/1", fields=("format", "epoch"), counters=("epoch",))
        >>> validate_state({"format": "demo/2", "epoch": 0}, spec)  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.ResumeStateError: resume state has format 'demo/2', expected
        'demo/1'...
        >>> validate_state({"format": "demo/1", "epoch": -1}, spec)
        ... # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.ResumeStateError: resume state field 'epoch' must be an int >= 0, got
        -1
    """
    if not isinstance(state, Mapping):
        if spec.producer is not None:
            raise ResumeStateError(
                f"resume state must be a dict (from {spec.producer}), got {type(state).__name__}"
            )
        raise ResumeStateError(
            f"resume state has format {type(state).__name__!r}, expected {spec.format!r}"
        )
    got = state.get("format")
    if got != spec.format:
        raise ResumeStateError(
            f"resume state has format {got!r}, expected {spec.format!r}", hint=spec.format_hint
        )
    missing = [f for f in spec.fields if f not in state]
    if missing:
        raise ResumeStateError(f"resume state lacks field(s) {', '.join(missing)}")
    for f in spec.counters:
        value = state[f]
        check_int(value, name=f"resume state field {f!r}", low=0, high=None, error=ResumeStateError)
    return dict(state)


def check_resume_compat(
    saved: Mapping[str, Any],
    current: Mapping[str, Any],
    *,
    fields: Sequence[str],
    allow_mismatch: Iterable[str] = (),
    what: str = "this loader",
    hint: str = "resume with the same dataset and order settings, or pass allow_mismatch=[...] to "
    "accept them",
) -> None:
    """Compare ``saved[f]`` with ``current[f]`` for every field; one error listing every mismatch.

    Args:
        saved: the saved values (a resume state, or its ``config``).
        current: the values of the iterator resuming.
        fields: the fields to compare, in the order they are reported.
        allow_mismatch: fields whose difference is accepted. Defaults to ``()``.
        what: what the state must fit, for the message. Defaults to ``"this loader"``.
        hint: the fix printed under the message. Defaults to resuming with the same settings or
            passing ``allow_mismatch``.

    Raises:
        ResumeStateError: listing ``field: saved X, now Y`` for each differing field.

    Examples:
        >>> check_resume_compat({"a": 1, "b": 2}, {"a": 1, "b": 2}, fields=["a", "b"])
        >>> check_resume_compat({"a": 1, "b": 2}, {"a": 3, "b": 4}, fields=["a", "b"])
        ... # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.ResumeStateError: resume state does not fit this loader: a: saved 1,
        now 3; b: saved 2, now 4...
        >>> check_resume_compat({"a": 1}, {"a": 3}, fields=["a"], allow_mismatch=["a"])
    """
    for side, value in (("saved", saved), ("current", current)):
        if not isinstance(value, Mapping):
            raise ResumeStateError(
                f"the {side} resume state must be a mapping (a JSON object), got "
                f"{type(value).__name__}"
            )
    allowed = set(allow_mismatch)
    diffs = [
        f"{f}: saved {saved.get(f)!r}, now {current.get(f)!r}"
        for f in fields
        if f not in allowed and saved.get(f) != current.get(f)
    ]
    if diffs:
        raise ResumeStateError(f"resume state does not fit {what}: " + "; ".join(diffs), hint=hint)
