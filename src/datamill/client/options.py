"""The client's option groups, declared and validated once: :class:`Leases` (how the server
deals the iteration's batches) and :class:`Transport` (how they reach this process); with the
loader's own :class:`~datamill.loader.Batching` for what a batch holds (of which a served iteration
honours ``shuffle``, ``drop_last`` and the shuffle ``window``).

Both are what :class:`~datamill.client.RemoteLoader` and :meth:`Client.iteration
<datamill.client.Client.iteration>` take and keep; the lease defaults (how many batches a lease
holds when a loader creates the iteration, how much a direct client caches) are here too.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from datamill.core.errors import ConfigError
from datamill.core.wire import MAX_LEASE_SAMPLES, TRANSPORTS
from datamill.loader.options import Batching

__all__ = [
    "DIRECT_CACHE_LIMIT",
    "DIRECT_LEASE_SIZE",
    "LEASE_BYTES",
    "LEASE_SIZE",
    "MODES",
    "Leases",
    "Transport",
    "check_transport",
    "default_lease_size",
    "lease_args",
    "served_batching",
]

MODES = ("static", "dynamic")
"""``static``: each rank's batches, in order (DDP); ``dynamic``: any client takes the next lease."""
DIRECT_CACHE_LIMIT = 8 << 30
"""Bytes of ``s3://`` shards a direct-mode client keeps in its local cache at most (8 GiB)."""

LEASE_SIZE = 64
"""Batches per lease of a direct-mode iteration by default. A lease round trip (a journal commit on
the server) costs about what building 10-20k samples does; the next lease is built by the client
while this one is consumed, so a lease must carry more work than a round trip. Each lease's batches
are held in memory (``prefetch`` + 1 leases): lower it for large samples."""
DIRECT_LEASE_SIZE = LEASE_SIZE
"""The direct-mode default, :data:`LEASE_SIZE` (kept for code that imports it)."""
LEASE_BYTES = 8 << 20
"""Bytes per lease a server-built iteration is sized for by default (8 MiB): the server picks
16-256 batches from the dataset's stored bytes per sample (64 when it cannot tell). A server-built
lease's round trip (the journal commit, the lease's bytes handed from a build worker to the HTTP
process and sent) costs the server and the client per lease, whatever the lease holds: small rows
take 256 batches a lease, large ones (images) 16, so a client holds ``prefetch`` + 1 leases of
about 8 MiB either way."""


def check_transport(transport: str) -> str:
    """``transport`` if it is one of :data:`~datamill.core.wire.TRANSPORTS`, else a
    :class:`ConfigError`.

    Examples:
        >>> check_transport("direct")
        'direct'
    """
    if transport not in TRANSPORTS:
        raise ConfigError(
            f"unknown transport {transport!r}; expected one of {', '.join(TRANSPORTS)}"
        )
    return transport


def default_lease_size(transport: str) -> int | None:
    """Batches per lease when the loader creates the iteration and ``lease_size`` is not given:
    :data:`LEASE_SIZE` in direct mode; ``None`` in server-built mode (the server sizes leases to
    :data:`LEASE_BYTES`).

    Examples:
        >>> default_lease_size("built"), default_lease_size("direct")
        (None, 64)
    """
    return LEASE_SIZE if check_transport(transport) == "direct" else None


def lease_args(transport: str, lease_size: int | None) -> dict[str, int | None]:
    """The iteration's ``lease_size`` and ``lease_bytes`` when the loader creates it: the size
    given, else :func:`default_lease_size` (server-built: leases of :data:`LEASE_BYTES`).

    Examples:
        >>> lease_args("built", None)
        {'lease_size': None, 'lease_bytes': 8388608}
    """
    if lease_size is not None:
        return {"lease_size": lease_size, "lease_bytes": None}
    size = default_lease_size(transport)
    return {"lease_size": size, "lease_bytes": LEASE_BYTES if size is None else None}


def _need(what: str, got: Any, *, ok: bool) -> None:
    if not ok:
        raise ConfigError(f"{what}, got {got!r}")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Leases:
    """How the server deals an iteration's batches: set when this process creates the iteration
    (a process joining it by ``name`` or by the same settings gets the existing one).

    Args:
        mode: ``"static"`` (DDP: each of ``world_size`` ranks gets its own batches, in order,
            byte-identical to the in-process Loader's) or ``"dynamic"`` (elastic: any client takes
            the next lease). Defaults to ``"static"``.
        world_size: ranks of a static iteration. Defaults to ``1``.
        name: the iteration's name; processes using the same name (and epoch) join one iteration.
            Defaults to ``None`` (joined by identical settings).
        size: batches per lease (1 to 4096). Defaults to ``None``: in server-built mode leases of
            about ``nbytes``, in direct mode :data:`LEASE_SIZE`.
        nbytes: server-built leases of about this many bytes of the dataset's rows (16 to 256
            batches, from its stored bytes per sample). Defaults to ``None``
            (:data:`LEASE_BYTES` when ``size`` is not given either).
        timeout: seconds a lease lives without a heartbeat (1 to 86400). Defaults to ``None`` (the
            server's).

    Examples:
        >>> Leases(mode="dynamic", name="run-1").world_size
        1
        >>> Leases(size=0)
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: Leases.size must be an integer in [1, 4096], got 0
    """

    mode: str = "static"
    world_size: int = 1
    name: str | None = None
    size: int | None = None
    nbytes: int | None = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        _need(f"Leases.mode must be one of {', '.join(MODES)}", self.mode, ok=self.mode in MODES)
        w = self.world_size
        _need("Leases.world_size must be an integer >= 1", w, ok=_int(w) and 1 <= w <= 1 << 16)
        n = self.name
        _need("Leases.name must be a string", n, ok=n is None or isinstance(n, str) and n != "")
        s = self.size
        _need(
            "Leases.size must be an integer in [1, 4096]",
            s,
            ok=s is None or _int(s) and 1 <= s <= 4096,
        )
        b = self.nbytes
        _need(
            "Leases.nbytes must be an integer >= 1024", b, ok=b is None or _int(b) and b >= 1 << 10
        )
        t = self.timeout
        _need(
            "Leases.timeout must be seconds in [1, 86400]",
            t,
            ok=t is None or isinstance(t, (int, float)) and math.isfinite(t) and 1 <= t <= 86_400,
        )

    def body(self) -> dict[str, Any]:
        """The iteration request's fields of these leases, without the ``None`` ones.

        Examples:
            >>> Leases(name="a", size=8).body()
            {'mode': 'static', 'world_size': 1, 'name': 'a', 'lease_size': 8}
        """
        out = {
            "mode": self.mode,
            "world_size": self.world_size,
            "name": self.name,
            "lease_size": self.size,
            "lease_bytes": self.nbytes,
            "lease_timeout": self.timeout,
        }
        return {k: v for k, v in out.items() if v is not None}

    def sized_for(self, transport: str, *, ack_window: int = 1, batch_size: int = 1) -> Leases:
        """These leases with a size when neither ``size`` nor ``nbytes`` is given: what a loader
        of ``transport`` creates its iteration with (:func:`lease_args`). A static direct loader
        with a wide ``ack_window`` takes leases of half its window (at most 1,024 batches and
        :data:`~datamill.core.wire.MAX_LEASE_SAMPLES` samples), so the acknowledgements riding on
        each lease request keep its window open: one request per half window instead of a lease
        request and an ack request.

        Examples:
            >>> Leases().sized_for("direct").size, Leases().sized_for("built").nbytes
            (64, 8388608)
            >>> Leases().sized_for("direct", ack_window=256).size
            128
        """
        if self.size is not None or self.nbytes is not None:
            return self
        sizes = lease_args(transport, None)
        if transport == "direct" and self.mode == "static":
            cap = min(1024, ack_window // 2, MAX_LEASE_SAMPLES // max(1, batch_size))
            sizes["lease_size"] = max(LEASE_SIZE, cap)
        return dataclasses.replace(self, size=sizes["lease_size"], nbytes=sizes["lease_bytes"])


@dataclass(frozen=True)
class Transport:
    """How a served iteration's batches reach this process: settings that never change which
    batches the rank gets.

    Args:
        kind: ``"built"`` (the server builds each lease's batches and sends them) or ``"direct"``
            (leases carry only batch numbers and fences; this process builds the batches with the
            same :class:`~datamill.loader.BatchService` settings, from the location the server
            gives for a dataset registered with ``client_location``: the same batches, and the
            server's work per lease does not depend on the data). Defaults to ``"built"``.
        prefetch: leases fetched ahead (1 or 2 is plenty). Defaults to ``2``.
        ack_window: batches handed to the loop whose acknowledgements may be unanswered at once:
            the batches a client cut off from the server may have trained on that the server hands
            to another client (see ``docs/serving-delivery.md``). Defaults to ``1`` (the next batch
            waits for the previous one's acknowledgement, which is sent as the batch is handed out:
            free when a training step is longer than a round trip).
        reconnect_s: how long to keep retrying an unreachable server. Defaults to ``120.0``.
        verify: for an ``https://`` url, a PEM file of the CA certificates to trust. Defaults to
            ``None`` (the system's).
        cache_dir: direct mode over ``s3://``: the local shard cache folder. Defaults to ``None``
            (:func:`~datamill.core.objstore.default_cache_dir`).
        cache_limit: direct mode over ``s3://``: bytes the local shard cache keeps at most.
            Defaults to :data:`DIRECT_CACHE_LIMIT`.
        slot: this process's slot within the rank (a DataLoader worker). Defaults to ``0``.
        slots: slots sharing the rank (leases dealt round-robin). Defaults to ``1``.
        on_commit: called with the unit ids of each lease the server confirmed committed.
            Defaults to ``None``.

    Examples:
        >>> Transport("direct", cache_limit=1 << 30).prefetch
        2
        >>> Transport(ack_window=0)  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: need prefetch >= 1, ack_window >= 1 and
        0 <= slot < slots, got 2, 0, 0, 1
    """

    kind: str = "built"
    prefetch: int = 2
    ack_window: int = 1
    reconnect_s: float = 120.0
    verify: str | os.PathLike[str] | None = None
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int = DIRECT_CACHE_LIMIT
    slot: int = 0
    slots: int = 1
    on_commit: Callable[[list[int]], None] | None = None

    def __post_init__(self) -> None:
        check_transport(self.kind)
        p, w, s, n = self.prefetch, self.ack_window, self.slot, self.slots
        if not all(map(_int, (p, w, s, n))) or p < 1 or w < 1 or not 0 <= s < n:
            raise ConfigError(
                f"need prefetch >= 1, ack_window >= 1 and 0 <= slot < slots, got {p}, {w}, {s}, {n}"
            )
        r = self.reconnect_s
        _need(
            "Transport.reconnect_s must be seconds >= 0",
            r,
            ok=isinstance(r, (int, float)) and math.isfinite(r) and r >= 0,
        )
        c = self.cache_limit
        _need("Transport.cache_limit must be a positive number of bytes", c, ok=_int(c) and c >= 1)


_SERVED = ("shuffle", "drop_last", "window")
"""The :class:`~datamill.loader.Batching` settings a served iteration honours."""


def served_batching(batching: Batching | None) -> dict[str, Any]:
    """The iteration request's fields of ``batching`` (``shuffle``, ``drop_last``, ``window``);
    any other setting changed from its default is refused: the server does not apply it.

    Examples:
        >>> served_batching(Batching(window=4))["window"]
        4
        >>> served_batching(Batching(max_errors=3))  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: a served iteration applies only Batching's shuffle,
        drop_last, window; got max_errors=3
    """
    b = Batching() if batching is None else batching
    if not isinstance(b, Batching):
        raise ConfigError(
            f"batching must be a Batching, got {type(b).__name__}",
            hint="from datamill.loader import Batching",
        )
    default = Batching()
    extra = [
        f"{f.name}={getattr(b, f.name)!r}"
        for f in dataclasses.fields(b)
        if f.name not in _SERVED and getattr(b, f.name) != getattr(default, f.name)
    ]
    if extra:
        raise ConfigError(
            f"a served iteration applies only Batching's {', '.join(_SERVED)}; got "
            + ", ".join(extra)
        )
    out: dict[str, Any] = {"shuffle": b.shuffle, "drop_last": b.drop_last}
    if b.window is not None:
        out["window"] = b.window
    return out
