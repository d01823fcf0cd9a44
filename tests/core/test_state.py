"""core.state: one shape check and one table-driven compatibility check for every resume state."""

from __future__ import annotations

import pytest

from datamill.core.errors import ResumeStateError
from datamill.core.state import StateSpec, check_resume_compat, validate_state

SPEC = StateSpec(
    "demo/2",
    fields=("format", "epoch", "seen", "seed"),
    counters=("epoch", "seen"),
    producer="Demo.state_dict()",
    format_hint="write it with the same demo version",
)


def test_validate_state_checks_format_fields_and_counters() -> None:
    good = {"format": "demo/2", "epoch": 1, "seen": 0, "seed": "any"}
    assert validate_state(good, SPEC) == good and validate_state(good, SPEC) is not good
    with pytest.raises(
        ResumeStateError, match=r"must be a dict \(from Demo.state_dict\(\)\), got list"
    ):
        validate_state([], SPEC)
    with pytest.raises(ResumeStateError, match="format 'list', expected 'demo/2'"):
        validate_state(
            [], StateSpec("demo/2", fields=())
        )  # without a producer: the LM batches' wording
    with pytest.raises(ResumeStateError, match="format 'demo/1', expected 'demo/2'") as info:
        validate_state({**good, "format": "demo/1"}, SPEC)
    assert info.value.hint == "write it with the same demo version"
    with pytest.raises(ResumeStateError, match="lacks field.s. seen, seed"):
        validate_state({"format": "demo/2", "epoch": 0}, SPEC)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ResumeStateError, match="'seen' must be an int >= 0"):
            validate_state({**good, "seen": bad}, SPEC)


def test_check_resume_compat_lists_every_mismatch_once() -> None:
    saved = {"a": 1, "b": [1, 2], "c": "x", "d": None}
    check_resume_compat(saved, dict(saved), fields=list(saved))
    with pytest.raises(ResumeStateError) as info:
        check_resume_compat(saved, {"a": 2, "b": [1, 2], "c": "y"}, fields=["a", "b", "c", "d"])
    assert str(info.value).startswith(
        "resume state does not fit this loader: a: saved 1, now 2; c: saved 'x', now 'y'"
    )
    assert "allow_mismatch" in str(info.value)
    check_resume_compat(
        saved,
        {"a": 2, "b": [1, 2], "c": "y", "d": None},
        fields=["a", "b", "c", "d"],
        allow_mismatch=["a", "c"],
    )
    with pytest.raises(ResumeStateError, match="does not fit these batches: b: saved") as info2:
        check_resume_compat(
            saved, {**saved, "b": [2]}, fields=["b"], what="these batches", hint="same corpus"
        )
    assert info2.value.hint == "same corpus"
