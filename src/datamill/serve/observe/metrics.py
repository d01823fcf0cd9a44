"""The server's telemetry: Prometheus metrics read at scrape time, lifecycle upkeep, event logs.

:class:`Telemetry` is fed by the server's state (a lease taken, acknowledged, expired; an iteration
created or ended) and journals its per-iteration counters (table ``counters``) at most once a
second; :class:`JournalCollector` builds every metric when ``GET /metrics`` is scraped. What
survives a restart and how labels are bounded: ``docs/running.md`` (*Metrics*).

Examples:
    >>> import tempfile
    >>> from datamill.serve.journal.store import Journal
    >>> t = Telemetry(Journal(tempfile.mkdtemp()))
    >>> t.add("it-1", "leases_issued", 2); t.flush_counters(); t.counter("it-1", "leases_issued")
    2.0
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from datamill.serve.journal.store import Journal
from datamill.serve.observe import ledger, lifecycle
from datamill.serve.observe.logs import event

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from datamill.serve.catalog import Catalog  # only for types: the catalog imports this module
    from datamill.serve.protocol.iteration import Iteration
    from datamill.serve.protocol.state import Lease, Settled

__all__ = [
    "COUNTERS",
    "MAX_ITERATION_SERIES",
    "JournalCollector",
    "RequestMetrics",
    "Telemetry",
    "registry_for",
]

COUNTERS = {
    "leases_issued": "Leases handed out.",
    "leases_reissued": (
        "Leases handing out batches that an earlier lease held (after an expiry or a takeover)."
    ),
    "leases_expired": (
        "Leases that timed out without their holder's heartbeat (their batches went back)."
    ),
    "leases_acknowledged": "Leases whose every batch was acknowledged.",
    "batches_redelivered": (
        "Batches handed out again after an earlier lease held them (its holder lost, killed or "
        "cut off past the lease's TTL and grace): at most one per client per fault was yielded."
    ),
    "bytes_sent": "Bytes of lease payloads (Arrow IPC) sent.",
}
"""The counters kept per iteration in the journal, by name (Prometheus adds ``datamill_`` and
``_total``)."""
MAX_ITERATION_SERIES = 50
"""Iterations not in memory that still get per-iteration series: the most recent ones."""
FLUSH_S = 1.0
"""Seconds between two writes of the counters and lifecycle to the journal."""
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Telemetry:
    """Counters (journaled), latency histograms, request counts and client activity of one
    server."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], float] = {
            (str(it), str(name)): float(v)
            for it, name, v in journal._exec("SELECT iteration, name, value FROM counters")
        }
        self._dirty: set[tuple[str, str]] = set()
        self._gone: set[tuple[str, str]] = set()
        self.client_memo: ledger.Memo = {}
        self.registry = CollectorRegistry(auto_describe=True)
        self.build_seconds = Histogram(
            "datamill_lease_build_seconds",
            "Seconds to build a lease's batches.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ack_latency = Histogram(
            "datamill_ack_latency_seconds",
            "Seconds from a lease's issue to the acknowledgement of its last batch.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "datamill_http_requests",
            "HTTP requests answered, by route template and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.started = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ counters
    def add(self, it_id: str, name: str, n: float = 1.0) -> None:
        """Add ``n`` to counter ``name`` of an iteration."""
        with self._lock:
            self._counts[(it_id, name)] = self._counts.get((it_id, name), 0.0) + n
            self._dirty.add((it_id, name))

    def counter(self, it_id: str, name: str) -> float:
        """The value of a counter."""
        with self._lock:
            return self._counts.get((it_id, name), 0.0)

    def counters(self) -> dict[tuple[str, str], float]:
        """Every counter ``(iteration, name) -> value``."""
        with self._lock:
            return dict(self._counts)

    def flush_counters(self) -> None:
        """Write the changed counters to the journal (one transaction)."""
        with self._lock:
            rows = [(it, name, self._counts[(it, name)]) for it, name in self._dirty]
            self._dirty.clear()
        if not rows:
            return
        with self.journal._lock, self.journal._db as db:  # one transaction
            db.execute("BEGIN IMMEDIATE")
            db.executemany(
                "INSERT INTO counters (iteration, name, value) VALUES (?, ?, ?) "
                "ON CONFLICT (iteration, name) DO UPDATE SET value = excluded.value",
                rows,
            )

    # ------------------------------------------------------------------ events from the server
    def created(self, it: Iteration) -> None:
        """A new iteration (journaled as ``running``)."""
        lifecycle.started(self.journal, it.id, total=it.total, base_done=it.base_done)
        event(
            "iteration created",
            iteration=it.id,
            dataset=it.config.get("dataset"),
            mode=it.mode,
            epoch=it.config.get("epoch"),
            batches=it.total,
        )

    def leased(self, it: Iteration, *, reissued: int, nbytes: int, seconds: float) -> None:
        """A lease was handed out (``reissued``: how many of its batches were leased before)."""
        self.add(it.id, "leases_issued")
        if reissued:
            self.add(it.id, "leases_reissued")
            self.add(it.id, "batches_redelivered", reissued)
        self.add(it.id, "bytes_sent", nbytes)
        self.build_seconds.observe(seconds)

    def settled(self, it: Iteration, s: Settled) -> None:
        """A round trip was applied or undone (:func:`~datamill.serve.protocol.iteration.finish`):
        count its finished leases (and their latency since their issue) and the leases that timed
        out meanwhile."""
        if s.latencies:
            self.add(it.id, "leases_acknowledged", len(s.latencies))
            for seconds in s.latencies:
                self.ack_latency.observe(seconds)
        if s.timed_out:
            self.expired(it, s.timed_out)

    def expired(self, it: Iteration, leases: Sequence[Lease]) -> None:
        """Leases timed out (logged one line each)."""
        self.add(it.id, "leases_expired", len(leases))
        for lease in leases:
            event(
                "lease expired",
                iteration=it.id,
                lease=lease.id,
                client=lease.client,
                queue=lease.queue,
                positions=f"{lease.start}-{lease.stop}",
            )

    def ended(self, it: Iteration, status: str) -> None:
        """An iteration finished or was cancelled."""
        ledger.record(self.journal, [it], self.client_memo)  # its clients' last acks, for the UI
        if lifecycle.ended(self.journal, it.id, status):
            event(f"iteration {status}", iteration=it.id)

    # ------------------------------------------------------------------ upkeep
    def tick(self, state: Catalog) -> None:
        """Expire leases, log clients gone, record activity, forget idle ended iterations, flush
        counters."""
        now, wall = state.clock(), time.time()
        with state._lock:
            live = list(state._iterations.values())
        activity = [a for it in live for a in self._upkeep(state, it, now, wall)]
        with state._lock:
            live_ids = set(state._iterations)
        self._gone = {g for g in self._gone if g[0] in live_ids}  # iterations still in memory
        lifecycle.seen(self.journal, activity)
        ledger.record(self.journal, live, self.client_memo)  # per-client stall for the UI
        self.client_memo = {k: v for k, v in self.client_memo.items() if k[0] in live_ids}
        self.flush_counters()

    def _upkeep(
        self, state: Catalog, it: Iteration, now: float, wall: float
    ) -> list[tuple[str, float, list[str]]]:
        """One live iteration's upkeep: expire its leases, log its clients gone, forget it when it
        ended and nothing is leased; its activity row (none without clients)."""
        with state.lock(it):
            it.expire(now)
            dead = it.take_timed_out()
            clients = {cid: info.last_seen for cid, info in it.clients.items()}
            idle_ended = (it.cancelled or it.finished_all()) and not it.leases
        if dead:
            self.expired(it, dead)
        for cid, seen in clients.items():
            if now - seen > it.lease_timeout and (it.id, cid) not in self._gone:
                self._gone.add((it.id, cid))
                event("client gone", iteration=it.id, client=cid, idle_s=round(now - seen, 1))
        if idle_ended:
            with state._lock:  # an ended iteration leaves memory (the journal keeps it)
                if state._iterations.get(it.id) is it:
                    del state._iterations[it.id]
        if not clients:
            return []
        return [(it.id, wall - (now - max(clients.values())), list(clients))]

    def start(self, state: Catalog, *, every: float = FLUSH_S) -> None:
        """Run :meth:`tick` every ``every`` seconds in a daemon thread until :meth:`stop`."""

        def loop() -> None:
            while not self._stop.wait(every):
                try:
                    self.tick(state)
                except Exception as exc:  # noqa: BLE001 - upkeep must never kill the server; logged
                    event("telemetry error", error=f"{type(exc).__name__}: {exc}")

        if self._thread is None:
            self._thread = threading.Thread(target=loop, name="datamill-telemetry", daemon=True)
            self._thread.start()

    def stop(self, state: Catalog) -> None:
        """Stop the upkeep thread and write everything one last time."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.tick(state)


class JournalCollector(Collector):
    """Every ``datamill_*`` metric, computed from the journal and the state when scraped."""

    def __init__(self, state: Catalog) -> None:
        self.state = state

    def _recent(self) -> list[dict[str, Any]]:
        """The journal's rows (:func:`~datamill.serve.observe.lifecycle.page`) of the iterations
        that get series: those in memory and the :data:`MAX_ITERATION_SERIES` most recent ones."""
        with self.state._lock:
            live = sorted(self.state._iterations)
        journal = self.state.journal
        rows, _ = lifecycle.page(journal, limit=MAX_ITERATION_SERIES, newest_first=True)
        have = {r["id"] for r in rows}
        return rows + [r for x in live if x not in have and (r := lifecycle.one(journal, x))]

    def _per_iteration(self, live: dict[str, Iteration]) -> list[Metric]:
        """The counters and the unit gauge of the iterations that get series (:meth:`_recent`)."""
        state = self.state
        names = {d["id"]: d["name"] for d in state.journal.datasets()}
        counts, labels = state.telemetry.counters(), ["iteration", "dataset"]
        fams = {
            name: CounterMetricFamily(f"datamill_{name}", help_, labels=labels)
            for name, help_ in COUNTERS.items()
        }
        units = CounterMetricFamily(
            "datamill_units_acknowledged",
            "Batches (units) acknowledged, from the journal.",
            labels=labels,
        )
        gauge = GaugeMetricFamily(
            "datamill_iteration_units",
            "Batches of an iteration by state (done includes a resume base).",
            labels=[*labels, "state"],
        )
        for r in self._recent():
            it_id, ds, total = r["id"], names.get(r["dataset"], str(r["dataset"])), r["total"]
            for name, fam in fams.items():
                fam.add_metric([it_id, ds], counts.get((it_id, name), 0.0))
            units.add_metric([it_id, ds], float(r["done"] - r["base_done"]))  # the journal's acks
            p = state.progress(live[it_id]) if it_id in live else None
            if p is None and total is not None:
                done = min(total, r["done"])
                p = {"done": done, "leased": 0, "pending": max(0, total - r["done"])}
            for s in ("done", "leased", "pending"):
                if p is not None:
                    gauge.add_metric([it_id, ds, s], p[s])
        return [*fams.values(), units, gauge]

    def collect(self) -> Iterator[Metric]:
        """The metrics (see the module docstring)."""
        state, tel = self.state, self.state.telemetry
        with state._lock:
            live = dict(state._iterations)
        yield from self._per_iteration(live)
        stall = GaugeMetricFamily(
            "datamill_client_stall_seconds",
            "Seconds a live client waited for data (as it reports in heartbeats).",
            labels=["iteration", "client", "rank"],
        )
        for it_id, it in live.items():
            for cid, c in state.progress(it)["clients"].items():
                if c["idle_s"] <= it.lease_timeout:
                    stall.add_metric([it_id, cid, str(c["rank"])], float(c["stall_s"]))
        yield stall
        statuses = GaugeMetricFamily(
            "datamill_iterations", "Iterations in the journal by status.", labels=["status"]
        )
        for s, n in lifecycle.counts(state.journal).items():
            statuses.add_metric([s], float(n))
        yield statuses
        yield GaugeMetricFamily(
            "datamill_leases_live",
            "Leases live now (in memory).",
            value=sum(len(it.leases) for it in live.values()),
        )
        draining = 1.0 if getattr(state, "draining", False) else 0.0
        yield GaugeMetricFamily(
            "datamill_draining", "1 while the server drains after SIGTERM.", value=draining
        )
        yield GaugeMetricFamily(
            "datamill_start_time_seconds",
            "When this server process started (Unix time).",
            value=tel.started,
        )


def registry_for(state: Catalog) -> CollectorRegistry:
    """The registry ``GET /metrics`` serves: the state's histograms and request counts plus the
    collector."""
    reg = state.telemetry.registry
    if not getattr(reg, "_datamill_collector", False):
        reg.register(JournalCollector(state))
        reg._datamill_collector = True  # type: ignore[attr-defined]  # registered once per registry
    return reg


class RequestMetrics:
    """ASGI middleware: a request id (``X-Request-Id``), requests counted by route template and
    status, and one log line for each 5xx answer (with the request id)."""

    def __init__(self, app: ASGIApp, *, telemetry: Telemetry) -> None:
        self.app, self.telemetry = app, telemetry
        # request ids: unique, not secret (a random prefix per server process and a counter)
        self._ids, self._prefix = itertools.count(1), secrets.token_hex(4)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = f"{self._prefix}{next(self._ids):08x}"
        scope["datamill.request_id"] = rid
        status = 500

        async def tracking_send(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = int(msg["status"])
                msg["headers"] = [*msg.get("headers", []), (b"x-request-id", rid.encode())]
            await send(msg)

        what: dict[str, Any] = {}
        try:
            await self.app(scope, receive, tracking_send)
            what["status"] = status
        except Exception as exc:
            status, what["error"] = 500, f"{type(exc).__name__}: {exc}"[:500]
            raise
        finally:
            template = str(getattr(scope.get("route"), "path", "unmatched"))
            self.telemetry.requests.labels(
                template, str(scope.get("method", "")), str(status)
            ).inc()
            if status >= 500:
                path = str(scope.get("path", ""))[:200]
                event(
                    "server error",
                    level=40,
                    request_id=rid,
                    method=scope.get("method"),
                    path=path,
                    **what,
                )
