"""Named fault points for the fault-injection tests (``tests/faults``).

A writer calls :func:`fault_point` at the moments where an interruption matters (mid-write, before
the switch, between renames). When the environment variable ``DATAMILL_FAULT`` names that point
(``DATAMILL_FAULT=preprocess.before_switch``, optionally ``name@N`` for its N-th call, 1-based),
the process kills itself with ``SIGKILL``, exactly as ``kill -9`` would
(``DATAMILL_FAULT_SIGNAL=TERM`` sends ``SIGTERM`` instead). Unset, a point costs one dictionary
lookup.
"""

from __future__ import annotations

import os
import signal

__all__ = ["FAULT_ENV", "FAULT_SIGNAL_ENV", "fault_point"]

FAULT_ENV = "DATAMILL_FAULT"
"""The environment variable naming the fault point to die at."""

FAULT_SIGNAL_ENV = "DATAMILL_FAULT_SIGNAL"
"""``KILL`` (the default) or ``TERM``: the signal sent at the fault point."""

_calls: dict[str, int] = {}


def fault_point(name: str) -> None:
    """Die with SIGKILL here when ``DATAMILL_FAULT`` names this point (a no-op otherwise).

    Examples:
        >>> fault_point("doctest.never")  # DATAMILL_FAULT is unset: nothing happens
    """
    wanted = os.environ.get(FAULT_ENV)
    if not wanted:
        return
    target, _, nth = wanted.partition("@")
    if target != name:
        return
    _calls[name] = _calls.get(name, 0) + 1
    if _calls[name] >= (int(nth) if nth else 1):
        sig = (
            signal.SIGTERM
            if os.environ.get(FAULT_SIGNAL_ENV, "KILL").upper() == "TERM"
            else signal.SIGKILL
        )
        os.kill(os.getpid(), sig)
