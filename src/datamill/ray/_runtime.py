"""Connecting to Ray, configuring Ray Data, running tasks in order, and turning Ray failures into
datamill errors.

Ray is imported lazily (the ``ray`` extra); :func:`connect` joins a running cluster (``address``)
or starts a local instance once per process, and leaves an instance it did not start alone.
:func:`ordered_results` submits tasks in a bounded window and yields their results in task
order; :func:`unwrap` turns a task failure into the ``DatamillError`` the task raised (attributes
intact) or one located :class:`~datamill.core.errors.DatamillError` for a crash (a killed worker,
a lost node) after Ray's retries.
"""

from __future__ import annotations

import os
import socket
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any, TypeVar

from datamill.core.errors import DatamillError
from datamill.core.optional import require
from datamill.core.progress import is_quiet

__all__ = ["MAX_RETRIES", "Spread", "connect", "ordered_results", "ray_module", "unwrap"]

T = TypeVar("T")

#: how often Ray re-runs a task whose worker process or node died (then the run fails)
MAX_RETRIES = 3


class Spread:
    """Scheduling that deals tasks ``i`` to the alive CPU nodes in turn (soft node affinity).

    Ray's ``"SPREAD"`` is a hint that a busy node may ignore, so a small job can land on one node;
    dealing block ``i`` to node ``i mod n`` spreads the blocks evenly over the cluster (a node that
    dies falls back to any other, ``soft=True``).
    """

    def __init__(self) -> None:
        ray = ray_module()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = sorted(
            n["NodeID"]
            for n in ray.nodes()
            if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0
        )
        self._strategies = [NodeAffinitySchedulingStrategy(node_id=n, soft=True) for n in nodes]

    def __call__(self, i: int) -> Any:
        """The scheduling strategy of task ``i`` (``"SPREAD"`` when no node is known)."""
        return self._strategies[i % len(self._strategies)] if self._strategies else "SPREAD"


def ray_module() -> ModuleType:
    """``import ray`` (MissingExtraError naming the ``ray`` extra when it is not installed)."""
    return require("ray", extra="ray")


CONNECT_TIMEOUT_S = 10.0
"""How long :func:`connect` waits for a cluster's TCP port to answer before giving up."""


def _probe(address: str) -> None:
    """Fail within :data:`CONNECT_TIMEOUT_S` when ``HOST:PORT`` (or ``ray://HOST:PORT``) does not
    answer."""
    hostport = address.removeprefix("ray://").rsplit("/", 1)[0] if address != "auto" else ""
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        if address in ("auto", "local") or not hostport:
            return
        raise DatamillError(
            "a Ray address must be auto, HOST:PORT or ray://HOST:PORT",
            path=address,
            hint="pass the address `ray start --head` printed, e.g. --address 10.0.0.5:6379",
        )
    try:
        with socket.create_connection(
            (host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S
        ) as sock:
            speaks = _speaks_grpc(sock)
    except (OSError, ValueError, OverflowError) as exc:
        raise DatamillError(
            f"cannot connect to Ray: nothing answers at {host}:{port} ({exc})",
            path=address,
            hint="start the cluster (`ray start --head`) and pass its address with "
            "--address HOST:PORT, or leave --address out for a local instance",
        ) from exc
    if not speaks:  # Ray would retry a port of another program for minutes
        raise DatamillError(
            f"cannot connect to Ray: {host}:{port} answers, but not as a Ray cluster "
            "(no gRPC answer)",
            path=address,
            hint="pass the address `ray start --head` printed (the GCS port, 6379 by default), "
            "not another service's port",
        )


def _speaks_grpc(sock: socket.socket) -> bool:
    """Whether the peer answers an HTTP/2 connection preface with a SETTINGS frame, as Ray's GCS
    and Ray Client servers (gRPC) do; an HTTP/1 server, a database or a silent port does not."""
    sock.settimeout(CONNECT_TIMEOUT_S)
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    empty_settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # length 0, type 4, flags 0, stream 0
    sock.sendall(preface + empty_settings)
    head = b""
    while len(head) < 9:
        try:
            chunk = sock.recv(9 - len(head))
        except TimeoutError:  # a port that takes the connection and says nothing
            return False
        if not chunk:
            return False
        head += chunk
    return head[3] == 0x04


def connect(address: str | None = None) -> ModuleType:
    """The ``ray`` module, connected: to ``address`` (``"auto"``, ``HOST:PORT``, ``ray://...``) or a
    local instance.

    A running connection (``ray.init`` called by the user or an earlier run) is reused as it is.
    Without ``address`` a new local instance is started (a cluster already running on the machine
    is joined only when asked, e.g. ``address="auto"``). A local instance gets ``num_cpus`` = the
    cores, no dashboard, and the environment's ``RAY_AUTH_MODE`` (``disabled`` unless set). Ray Data
    keeps block order and shows its progress bars unless datamill is quiet (``--quiet``).

    Raises:
        MissingExtraError: ray is not installed. ConfigError-like DatamillError: the cluster is
            unreachable.
    """
    ray = ray_module()
    if address is not None and ray.is_initialized():
        _probe(
            address
        )  # an address that answers nothing is an error even when this process already has Ray
    if not ray.is_initialized():
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        try:
            if (
                address is None
            ):  # "local": never join a cluster found on the machine (maybe someone else's)
                ray.init(address="local", include_dashboard=False, log_to_driver=False)
            else:
                _probe(address)  # Ray itself retries an unreachable address for minutes
                ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise DatamillError(
                f"cannot connect to Ray ({exc})",
                path=address,
                hint="start the cluster (`ray start --head`) and pass its address with "
                "--address HOST:PORT, or leave --address out for a local instance",
            ) from exc
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = not is_quiet()
    ctx.print_on_execution_start = False
    return ray


def unwrap(exc: BaseException, *, what: str) -> BaseException:
    """The error to raise for a failed Ray call: the task's own DatamillError, or one DatamillError
    line."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while (
        cur is not None and id(cur) not in seen
    ):  # through Ray's wrappers (RayTaskError, UserCodeException)
        seen.add(id(cur))
        if isinstance(cur, DatamillError) and not type(cur).__name__.startswith("RayTaskError"):
            return cur
        inner = getattr(cur, "cause", None)
        cur = inner if isinstance(inner, BaseException) else (cur.__cause__ or cur.__context__)
    cause = getattr(exc, "cause", None)
    first = " ".join(str(cause if cause is not None else exc).split())[:300]
    return DatamillError(
        f"{what} failed on Ray: {type(cause or exc).__name__}: {first}",
        hint="nothing was committed; check the workers' logs, then run again",
    )


def ordered_results(
    submit: Callable[[T], Any], items: Iterable[T], *, window: int
) -> Iterator[Any]:
    """``ray.get(submit(item))`` for every item, in order, with at most ``window`` tasks in
    flight."""
    ray = ray_module()
    pending: deque[Any] = deque()
    it = iter(items)
    for item in it:
        pending.append(submit(item))
        if len(pending) >= window:
            break
    while pending:
        ref = pending.popleft()
        nxt = next(it, _END)
        if nxt is not _END:
            pending.append(submit(nxt))
        yield ray.get(ref)


_END: Any = object()
