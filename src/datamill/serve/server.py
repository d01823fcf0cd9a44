"""The server's logic without HTTP: datasets under roots, iterations, leases as Arrow IPC, the
journal.

:class:`ServeState` is what :func:`datamill.serve.http.app.create_app` exposes over HTTP; it can be
used
(and is tested) directly. Batch contents are rebuilt on demand through the batch service (one per
dataset and order config, with one shard cache shared by every rank); the journal holds only configs
and acknowledged unit runs.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.checks import check_int
from datamill.core.errors import ConfigError, DatamillError, ResumeStateError
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.state import check_resume_compat
from datamill.loader import BatchService
from datamill.loader.runs import as_batches, service_for
from datamill.serve.data.direct import ClientLocations, unit_runs
from datamill.serve.http.auth import KeyStore
from datamill.serve.journal.leases import (
    GroupCommit,
    UnavailableError,
    Write,
    journaled_leases,
    leases_write,
    rewind_write,
)
from datamill.serve.journal.store import Journal
from datamill.serve.observe.metrics import Telemetry
from datamill.serve.protocol.iteration import AckResult, Iteration, Lease, runs
from datamill.serve.protocol.round_trip import AckItem, Planned, Take, finish, plan
from datamill.serve.protocol.state import session_digest

__all__ = [
    "ARROW_STREAM",
    "CancelledError",
    "ConflictError",
    "LeasePayload",
    "NotFoundError",
    "ServeState",
    "UnavailableError",
]

ARROW_STREAM = "application/vnd.apache.arrow.stream"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MODES = ("dynamic", "static")
_POLL_S = 0.002  # how often a round trip waiting for another's acks in flight plans again
SESSION_CLOSED_S = 1.5
"""Seconds a session's leases live after its every connection was closed by its peer (at most the
lease timeout): a live client's next heartbeat (every second at most) reclaims them meanwhile."""
_CREATOR_ONLY = ("base_done", "lease_size", "lease_timeout", "plan_world")
_ORDER = ("dataset", "batch_size", "seed", "epoch", "shuffle", "columns", "drop_last", "window")
"""An iteration's config fields its order depends on (a resumed iteration keeps them)."""


class NotFoundError(DatamillError, LookupError):
    """An unknown dataset, iteration or key (HTTP 404)."""


class CancelledError(DatamillError, RuntimeError):
    """The iteration was cancelled: it hands out no more leases (HTTP 410)."""


class ConflictError(DatamillError, ValueError):
    """A name already used with another config (HTTP 409)."""


@dataclass
class LeasePayload:
    """A lease and its batches as one Arrow IPC stream (one record batch per batch)."""

    lease: Lease
    units: list[int]
    body: bytes
    epoch: int
    runs: list[tuple[int, int, int]] | None = (
        None  # (plan rank, first, stop batch): what a direct client builds
    )


def check_name(value: str, *, what: str) -> str:
    """A dataset/iteration name or id: letters, digits, ``_.-``; never a path.

    Examples:
        >>> check_name("../etc", what="dataset")
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: invalid dataset '../etc'...
    """
    if not isinstance(value, str) or not _NAME_RE.match(value) or ".." in value:
        raise ConfigError(
            f"invalid {what} {value!r}: use 1-64 letters, digits, '_', '.', '-' (never a path)"
        )
    return value


def to_ipc(tables: Sequence[pa.Table]) -> bytes:
    """Tables as one Arrow IPC stream, exactly one record batch per table."""
    sink = io.BytesIO()
    batches = as_batches(tables)
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for b in batches:
            writer.write_batch(b)
    return sink.getvalue()


LEASE_SIZES = (16, 256)
"""The smallest and largest lease :func:`auto_lease_size` picks, in batches."""
MAX_LEASE_SAMPLES = 1 << 22
"""Samples one lease may hold at most (``batch_size * lease_size``): a request's work is bounded."""


def row_bytes(source: Any) -> float | None:
    """A dataset's stored bytes per sample (its shards' files over its samples: one listing per
    shardset, no file read); ``None`` when its Source does not say."""
    nbytes = getattr(source, "shard_nbytes", None)
    if nbytes is None:
        return None
    rows = int(sum(source.shard_sizes()))
    total = int(sum(nbytes()))
    return total / rows if rows and total else None


def auto_lease_size(lease_bytes: int, batch_size: int, row: float | None) -> int:
    """Batches per lease for about ``lease_bytes`` of rows of ``row`` bytes each, within
    :data:`LEASE_SIZES` and :data:`MAX_LEASE_SAMPLES` (64 when the row size is unknown).

    Examples:
        >>> auto_lease_size(8 << 20, 256, 90.0), auto_lease_size(8 << 20, 256, 3000.0)
        (256, 16)
        >>> auto_lease_size(8 << 20, 256, 500.0), auto_lease_size(8 << 20, 256, None)
        (65, 64)
    """
    low, high = LEASE_SIZES
    high = max(low, min(high, MAX_LEASE_SAMPLES // max(1, batch_size)))
    if row is None:
        return min(64, high)
    return max(low, min(high, int(lease_bytes // max(1.0, batch_size * row))))


class ServeState:
    """Datasets, iterations and keys of one server (see the module docstring).

    Args:
        state_dir: folder of the journal (created).
        roots: folders datasets may be registered from (resolved; symlinks out of them refused).
        auth: require API keys. Defaults to ``True``.
        lease_timeout: default seconds a lease lives without a heartbeat. Defaults to ``60.0``.
        cache_shards: released shards each batch service keeps for later leases. Defaults to
            ``None`` (two shuffle windows per rank: a lease built after another reuses its shards
            instead of rereading them).
        build_workers: worker processes building server-built leases (each with its own shard
            cache), so builds run past this process's GIL; ``0`` builds in the request's thread.
            Defaults to ``0``.
        clock: the monotonic clock the driver reads for each event (the state machine reads none).
            Defaults to :func:`time.monotonic`.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        roots: Sequence[str | os.PathLike[str]] = (),
        auth: bool = True,
        lease_timeout: float = 60.0,
        cache_shards: int | None = None,
        build_workers: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.journal = Journal(state_dir, lock="server")  # the folder locked for this server
        self.clock = clock
        # the lock serialising each iteration's transitions (the state machine takes none)
        self._locks: weakref.WeakKeyDictionary[Iteration, threading.RLock] = (
            weakref.WeakKeyDictionary()
        )
        self._closed: set[str] = set()  # sessions whose connections their clients all closed
        self.writes = GroupCommit(self.journal)  # lease and ack writes, group-committed
        self._datasets: list[dict[str, Any]] | None = None  # the journal's rows, read once
        self._located: dict[str, str] = {}  # dataset id -> client location (direct mode)
        self._row_bytes: dict[str, float | None] = {}  # dataset id -> stored bytes per sample
        self.keys = KeyStore(self.journal)
        self.auth, self.lease_timeout = auth, float(lease_timeout)
        self.cache_shards = None if cache_shards is None else int(cache_shards)
        self.roots = [Path(os.path.realpath(r)) for r in roots]
        self.boot = secrets.token_hex(4)
        self._lock = threading.RLock()
        self._services: dict[str, BatchService] = {}
        self._iterations: dict[str, Iteration] = {}
        self.telemetry = Telemetry(
            self.journal
        )  # counters, lifecycle rows, event logs (datamill.serve.observe.metrics)
        self._rewinds = 0  # rewinds of this server run (each has its own id in the journal)
        self.draining = False  # after SIGTERM: no new leases; acks and heartbeats still answered
        self.drain_timeout = 0.0  # > 0 (serve() sets it): leases sized so that a drain ends
        self.locations = ClientLocations(
            self.journal
        )  # direct mode: where clients read each dataset
        self.pool: Any = None
        if build_workers:
            from datamill.serve.data.workers import BuildPool

            self.pool = BuildPool(int(build_workers), cache_shards=self.cache_shards)

    def close(self) -> None:
        """Write the telemetry one last time, close the services and the journal."""
        self.telemetry.stop(self)
        self.writes.close()
        if self.pool is not None:
            self.pool.close()
        for svc in self._services.values():
            svc.close()
        self.keys.close()
        self.journal.close()

    # ------------------------------------------------------------------ datasets
    def resolve(self, path: str) -> Path:
        """A path inside one of the roots (relative paths are taken from the first root)."""
        if not self.roots:
            raise ConfigError(
                "this server has no dataset root", hint="start it with `datamill serve ROOT`"
            )
        raw = Path(path)
        real = Path(os.path.realpath(raw if raw.is_absolute() else self.roots[0] / raw))
        if not any(real == root or root in real.parents for root in self.roots):
            raise ConfigError(
                f"{path!r} is outside the server's dataset roots",
                hint="register datasets that live under a root given to `datamill serve`",
            )
        if not real.exists():
            raise NotFoundError("no such dataset path under the roots", path=path)
        return real

    def register(
        self, path: str, *, name: str, client_location: str | None = None
    ) -> dict[str, Any]:
        """Register the dataset at ``path`` (under a root) as ``name``; idempotent for the same
        path.

        A Delta, Iceberg or Lance table folder is registered as the file of its current version
        (:func:`~datamill.tables.registry.pin_table_folder`), so every process reads that version.

        ``client_location`` (a path every client node sees, or ``s3://...``) allows direct mode:
        clients are told it and build their batches themselves. Registering again may add or change
        it.
        """
        from datamill.core.storage import scheme_of
        from datamill.serve.data.direct import check_location
        from datamill.sources import open_source
        from datamill.tables.registry import pin_table_folder

        check_name(name, what="dataset name")
        if client_location is not None:
            check_location(client_location)
        real = self.resolve(path)
        pinned = pin_table_folder(real)  # a table folder: the version it has now
        if pinned is not None:
            if client_location is not None and not scheme_of(client_location).remote:
                # the same table seen from the clients: the same version file inside it
                client_location = str(Path(client_location) / pinned.relative_to(real))
            real = pinned
        for ds in self._rows():
            if ds["name"] == name:
                if ds["path"] != str(real):
                    raise ConflictError(
                        f"dataset name {name!r} is already registered for another path"
                    )
                if client_location is not None:
                    self._locate(ds["id"], real, client_location)
                return self._public(ds)
            if ds["path"] == str(real):  # one path, one dataset (its id comes from the path)
                raise ConflictError(
                    f"this path is already registered as dataset {ds['name']!r}; use that name "
                    f"(a dataset has one name)"
                )
        source = open_source(real)  # fails now (DataFileError) if it is not a datamill output
        ds_id = "ds-" + fingerprint_obj(str(real))[:12]
        self.journal.add_dataset(ds_id, name, str(real))
        self._datasets = None
        if client_location is not None:
            self._locate(ds_id, real, client_location)
        return self._public(
            {
                "id": ds_id,
                "name": name,
                "path": str(real),
                "num_samples": int(sum(source.shard_sizes())),
                "columns": list(source.columns),
            }
        )

    def _public(self, ds: Mapping[str, Any]) -> dict[str, Any]:
        real = Path(ds["path"])
        rel = next(
            (str(real.relative_to(r)) for r in self.roots if real == r or r in real.parents),
            real.name,
        )
        return {k: v for k, v in {**ds, "path": rel}.items() if k != "created"}

    def _rows(self) -> list[dict[str, Any]]:
        """The journal's dataset rows (read once: only :meth:`register` adds one)."""
        rows = self._datasets
        if rows is None:
            rows = self._datasets = self.journal.datasets()
        return rows

    def datasets(self) -> list[dict[str, Any]]:
        """Registered datasets (``id``, ``name``, path relative to its root)."""
        return [self._public(ds) for ds in self._rows()]

    def dataset(self, ref: str) -> dict[str, Any]:
        """A dataset by id or name."""
        check_name(ref, what="dataset")
        for ds in self._rows():
            if ref in (ds["id"], ds["name"]):
                return dict(ds)
        raise NotFoundError(f"no dataset {ref!r}; registered: {[d['name'] for d in self._rows()]}")

    def open_source(self, path: str) -> Any:
        """The Source of a registered dataset's path (a benchmark may plan synthetic shard sizes
        instead)."""
        from datamill.sources import open_source

        return open_source(path)

    def service(self, cfg: Mapping[str, Any]) -> BatchService:
        """The batch service of a dataset and order config (created once)."""
        key = fingerprint_obj({k: cfg[k] for k in _ORDER if k != "epoch"})  # every epoch's
        with self._lock:
            svc = self._services.get(key)
            if svc is None:
                ds = self.dataset(cfg["dataset"])
                svc = service_for(self.open_source(ds["path"]), cfg, cache_shards=self.cache_shards)
                self._services[key] = svc
            return svc

    # ------------------------------------------------------------------ iterations
    def _config(self, req: Mapping[str, Any]) -> dict[str, Any]:
        known = {*_ORDER, "mode", "world_size", "name", "lease_size", "lease_bytes"}
        known |= {"lease_timeout", "resume_from", "loader_states"}
        unknown = sorted(set(req) - known)
        if unknown:
            raise ConfigError(
                f"unknown iteration field(s) {unknown}; expected some of {sorted(known)}"
            )
        cols = req.get("columns")
        cfg: dict[str, Any] = {
            "dataset": self.dataset(str(req["dataset"]))["id"],
            "batch_size": int(req["batch_size"]),
            "seed": int(req.get("seed", 0)),
            "epoch": int(req.get("epoch", 0)),
            "shuffle": bool(req.get("shuffle", True)),
            "columns": [cols] if isinstance(cols, str) else cols,
            "drop_last": bool(req.get("drop_last", False)),
            "window": req.get("window"),
            "mode": req.get("mode", "static"),
            "world_size": int(req.get("world_size", 1)),
            "lease_size": self._lease_size(req),
            "lease_timeout": float(req.get("lease_timeout") or self.lease_timeout),
        }
        for f, low in (
            ("batch_size", 1),
            ("seed", 0),
            ("epoch", 0),
            ("world_size", 1),
            ("lease_size", 1),
        ):
            if cfg[f] < low:
                raise ConfigError(f"{f} must be >= {low}, got {cfg[f]}")
        if cfg["mode"] not in MODES:
            raise ConfigError(f"unknown mode {cfg['mode']!r}; expected one of {', '.join(MODES)}")
        return cfg

    def _lease_size(self, req: Mapping[str, Any]) -> int:
        """Batches per lease: ``lease_size`` when given; else, with ``lease_bytes``, about that
        many bytes of the dataset's rows per lease (:func:`auto_lease_size`); else 16."""
        if req.get("lease_size") is not None:
            return int(req["lease_size"])
        if req.get("lease_bytes") is None:
            return 16
        target = check_int(req["lease_bytes"], name="lease_bytes", low=1)
        ds = self.dataset(str(req["dataset"]))
        row = self._row_bytes.get(ds["id"])
        if ds["id"] not in self._row_bytes:
            row = self._row_bytes[ds["id"]] = row_bytes(self.open_source(ds["path"]))
        return auto_lease_size(target, int(req["batch_size"]), row)

    def _resume_base(self, cfg: dict[str, Any], req: Mapping[str, Any]) -> tuple[int, list[int]]:
        """``(plan world size, units already done)`` of a resumed iteration."""
        if req.get("resume_from"):
            return self._iteration_base(cfg, str(req["resume_from"]))
        if req.get("loader_states"):
            return self._states_base(cfg, req["loader_states"])
        return (cfg["world_size"] if cfg["mode"] == "static" else 1), []

    def _iteration_base(self, cfg: Mapping[str, Any], ref: str) -> tuple[int, list[int]]:
        """Resume from iteration ``ref``: the same order, its done units."""
        old = self.iteration(ref)
        check_resume_compat(
            old.config,
            cfg,
            fields=_ORDER,
            what=f"a resume of iteration {old.id}",
            hint="resume with the saved iteration's dataset and order settings",
        )
        return int(old.config["plan_world"]), old.done_units()

    def _states_base(
        self, cfg: Mapping[str, Any], states: Sequence[Mapping[str, Any]]
    ) -> tuple[int, list[int]]:
        """Resume from every rank's loader state (checked by the loader's own rule)."""
        from datamill.loader.state import validate_state

        sts = [validate_state(s) for s in states]
        world = len(sts)
        ranks = sorted(int(s["config"]["rank"]) for s in sts)
        if ranks != list(range(world)):
            raise ResumeStateError(
                f"loader states of ranks {ranks}, expected one of each rank 0..{world - 1}",
                hint="pass the states of every rank of the saved run",
            )
        svc = self.service(cfg)
        seen: dict[int, int] = {}
        for s in sts:
            r = int(s["config"]["rank"])
            epoch, seen[r] = svc.check_state(s, rank=r, world_size=world)
            check_resume_compat(
                {"epoch": epoch},
                cfg,
                fields=["epoch"],
                what=f"this iteration (rank {r}'s loader state)",
                hint="create the iteration for the epoch the states were saved in",
            )
        done: list[int] = []
        base = 0
        for r in range(world):
            n = svc.num_batches(cfg["epoch"], r, world)
            done.extend(range(base, base + min(seen[r], n)))
            base += n
        return world, done

    def create_iteration(self, req: Mapping[str, Any]) -> dict[str, Any]:
        """Create an iteration, or join the existing one of the same name (or config) and epoch.

        A joiner needs neither the resume spec nor the creator's ``lease_size``/``lease_timeout``;
        any other difference from the existing iteration's settings is a :class:`ConflictError`.
        """
        cfg = self._config(req)
        joined = {k: v for k, v in cfg.items() if k not in _CREATOR_ONLY}
        with self._lock:
            name = req.get("name")
            spec = {
                "resume_from": req.get("resume_from"),
                "loader_states": fingerprint_obj(req.get("loader_states")),
            }
            key = (
                check_name(str(name), what="iteration name")
                if name
                else fingerprint_obj([joined, spec])
            )
            it_id = "it-" + fingerprint_obj([key, cfg["epoch"]])[:16]
            for row in self.journal.iterations():
                if row["id"] == it_id:
                    saved = {k: v for k, v in row["config"].items() if k not in _CREATOR_ONLY}
                    diffs = [k for k in joined if saved.get(k) != joined[k]]
                    if diffs:
                        raise ConflictError(
                            f"iteration {name or it_id!r} of epoch {cfg['epoch']} exists with "
                            f"another config (differs in {diffs})",
                            hint="use another name, or the same settings to join it",
                        )
                    return self.describe(self.iteration(it_id))
            plan_world, base_done = self._resume_base(cfg, req)
            cfg["plan_world"], cfg["base_done"] = plan_world, runs(base_done)
            it = self._build(it_id, cfg)
            self.journal.add_iteration(it_id, key, cfg["epoch"], cfg)
            self.telemetry.created(it)
            self._iterations[it_id] = it
            return self.describe(it)

    def _build(self, it_id: str, cfg: Mapping[str, Any]) -> Iteration:
        svc = self.service(cfg)
        world = int(cfg["plan_world"])
        rank_batches = [svc.num_batches(cfg["epoch"], r, world) for r in range(world)]
        base = [u for a, b in cfg["base_done"] for u in range(a, b)]
        it = Iteration(
            it_id,
            rank_batches,
            mode=cfg["mode"],
            world_size=cfg["world_size"],
            base_done=base,
            lease_size=cfg["lease_size"],
            lease_timeout=cfg["lease_timeout"],
            boot=self.boot,
        )
        it.config = dict(cfg)
        with self._lock:
            self._locks[it] = threading.RLock()
        return it

    def lock(self, it: Iteration) -> threading.RLock:
        """The lock serialising the transitions (and readings) of iteration ``it``."""
        return self._locks[it]

    def progress(self, it: Iteration) -> dict[str, Any]:
        """An iteration's counts now (its leases past their deadline expired first)."""
        with self.lock(it):
            now = self.clock()
            it.expire(now)
            out, dead = it.progress(now=now), it.take_timed_out()
        if dead:
            self.telemetry.expired(it, dead)
        return out

    def session_closed(self, secret: str) -> None:
        """Every connection of a client session was closed by the client (its process exited or
        was killed): its leases of every live iteration end :data:`SESSION_CLOSED_S` from now
        unless the session connects again meanwhile, so a crashed client's batches go to the
        others at once instead of after a lease timeout."""
        sess = session_digest(secret)
        with self._lock:
            live = list(self._iterations.values())
            self._closed.add(sess)
        for it in live:
            with self.lock(it):
                within = min(SESSION_CLOSED_S, it.lease_timeout)
                it.session_closed(sess, now=self.clock(), within=within)

    def session_opened(self, secret: str) -> None:
        """A client session opened a connection (after :meth:`session_closed`: it is alive)."""
        sess = session_digest(secret)
        if sess not in self._closed:
            return
        with self._lock:
            self._closed.discard(sess)
            live = list(self._iterations.values())
        for it in live:
            with self.lock(it):
                it.session_opened(sess)

    def live_iteration(self, ref: str) -> Iteration | None:
        """The iteration of id ``ref`` when it is in memory (no journal read), else ``None``."""
        return self._iterations.get(ref)

    def iteration(self, ref: str) -> Iteration:
        """An iteration by id or name (rebuilt from the journal after a restart: pending = all -
        done)."""
        check_name(ref, what="iteration")
        with self._lock:
            it = self._iterations.get(ref)
            if it is not None:
                return it
            rows = [r for r in self.journal.iterations() if ref in (r["id"], r["key"])]
            if not rows:
                raise NotFoundError(f"no iteration {ref!r}")
            row = rows[-1]
            if row["id"] in self._iterations:
                return self._iterations[row["id"]]
            it = self._build(row["id"], row["config"])
            it.mark_done(u for a, b in self.journal.done_runs(row["id"]) for u in range(a, b))
            done = self.journal.done(row["id"])
            if self.journal.is_cancelled(row["id"]):
                it.cancel()
            else:  # the grace period: leases in flight wait one lease timeout for their holders
                now = self.clock()
                for lease in journaled_leases(self.journal, row["id"]):
                    it.restore(lease, now=now)
            it.acked.update(lease for _, _, lease in done if lease not in it.leases)
            self._iterations[row["id"]] = it
            return it

    def describe(self, it: Iteration) -> dict[str, Any]:
        """An iteration's id, config and per-queue batch counts."""
        cfg = it.config
        return {
            "id": it.id,
            "config": {k: v for k, v in cfg.items() if k != "base_done"},
            "total": it.total,
            "queues": [len(q) for q in it.queues],
            "base_done": it.base_done,
        }

    def ack(
        self,
        it: Iteration,
        lease_id: str,
        fence: str,
        *,
        session: str | None = None,
        client: str | None = None,
    ) -> AckResult:
        """Acknowledge a whole lease (see :meth:`ack_batches`)."""
        statuses, units = self.ack_batches(
            it, [(lease_id, fence, None, None)], session=session, client=client
        )
        return AckResult(statuses[lease_id], units.get(lease_id, []))

    def ack_batches(
        self,
        it: Iteration,
        items: Sequence[AckItem],
        *,
        session: str | None = None,
        client: str | None = None,
    ) -> tuple[dict[str, str], dict[str, list[tuple[int, int]]]]:
        """Acknowledge batches ``(lease, fence, start, stop)`` (queue positions; ``None``: the
        whole lease) of one session (its secret; ``client`` when ``None``): ``(status per lease,
        unit runs done)``.

        The units are journaled in **one transaction** (group-committed, see
        :mod:`datamill.serve.protocol.round_trip`) before memory changes, so ``"already"`` is only
        ever
        answered for journaled acks.

        Raises:
            UnavailableError: the journal could not be written (nothing changed; retry later).
        """
        return asyncio.run(self.ack_batches_async(it, items, session=session, client=client))

    async def ack_batches_async(
        self,
        it: Iteration,
        items: Sequence[AckItem],
        *,
        session: str | None = None,
        client: str | None = None,
    ) -> tuple[dict[str, str], dict[str, list[tuple[int, int]]]]:
        """:meth:`ack_batches` in an event loop (it waits for the journal without a thread): the
        one code path of an acknowledgement (:meth:`ack_batches` runs it in a loop of its own)."""
        secret = session if session is not None else client if client is not None else ""
        p = await self._transition(it, items, session_digest(secret))
        return p.statuses, p.units

    async def _transition(
        self,
        it: Iteration,
        items: Sequence[AckItem],
        session: str,
        take: Take | None = None,
    ) -> Planned:
        """The one code path of every round trip (:mod:`datamill.serve.protocol.round_trip`): under
        the iteration's lock, read the clock, run the state machine's transition and queue its
        records as one journal write; wait for the write without the lock; apply (or undo) it."""
        lock = self.lock(it)
        while True:
            with lock:
                p = plan(it, items, session=session, take=take, now=self.clock())
                w = None
                if p is not None and p.records is not None:
                    r = p.records
                    w = self.writes.submit(leases_write(it.id, add=r.add, drop=r.drop, done=r.done))
            if p is not None:
                break
            await asyncio.sleep(_POLL_S)  # another request's acks of these are in flight
        # shielded: a request cancelled meanwhile (a client gone) still leaves memory as the journal
        await asyncio.shield(self._settle(it, p, w))
        return p

    async def _settle(self, it: Iteration, p: Planned, w: Write | None) -> None:
        """Steps 2 and 3 of a round trip: wait for its write, apply it (or undo it and raise)."""
        error = None
        if w is not None:
            try:
                await self.writes.wait_async(w)
            except Exception as exc:  # noqa: BLE001 - undone, then raised
                error = exc
        with self.lock(it):
            settled = finish(it, p, ok=error is None, now=self.clock())
        self.telemetry.settled(it, settled)
        if error is not None:
            raise error
        if settled.ended:
            self._evict(it)

    def heartbeat(
        self,
        it: Iteration,
        client: str,
        *,
        leases: Sequence[tuple[str, str]] = (),
        session: str | None = None,
        stall_s: float | None = None,
        batches: int | None = None,
    ) -> dict[str, list[str]]:
        """Extend (or reclaim after a restart) a client's leases: ``{"lost": [...], "refused":
        [...]}``."""
        with self.lock(it):
            return it.heartbeat(
                client,
                leases=leases,
                session=session,
                stall_s=stall_s,
                batches=batches,
                now=self.clock(),
            )

    def _evict(self, it: Iteration) -> None:
        """Forget a finished iteration (the journal keeps it; a later request rebuilds it)."""
        with self._lock:
            if self._iterations.get(it.id) is it:
                del self._iterations[it.id]
        self.telemetry.ended(it, "finished")

    def cancel(self, it: Iteration) -> dict[str, Any]:
        """Cancel an iteration for good (journaled first): no more leases, live ones revoked."""
        self.journal.cancel(it.id)
        with self.lock(it):
            it.cancel()
        self.telemetry.ended(it, "cancelled")
        return self.progress(it)

    def next_lease(self, it: Iteration, client: str, **trip: Any) -> LeasePayload | None:
        """The client's next lease with its batches, or ``None`` (see :meth:`Iteration.finished`):
        :meth:`round_trip` without acknowledgements (``trip``: its keyword arguments)."""
        return self.round_trip(it, client, (), **trip)[1]

    def round_trip(
        self, it: Iteration, client: str, acks: Sequence[AckItem], **trip: Any
    ) -> tuple[dict[str, str], LeasePayload | None]:
        """:meth:`round_trip_async` in a loop of its own (``transport="built"`` by default): for a
        thread (a server-built lease's build holds the GIL for milliseconds)."""
        trip.setdefault("transport", "built")
        return asyncio.run(self.round_trip_async(it, client, acks, **trip))

    async def round_trip_async(
        self,
        it: Iteration,
        client: str,
        acks: Sequence[AckItem],
        *,
        rank: int = 0,
        slot: int = 0,
        slots: int = 1,
        session: str | None = None,
        owner: str = "",
        transport: str = "direct",
    ) -> tuple[dict[str, str], LeasePayload | None]:
        """Acknowledge ``acks`` and take the client's next lease, journaled in **one** write (see
        :mod:`datamill.serve.protocol.round_trip`): ``(status per acknowledged lease, the lease or
        None)``. The one code path of a round trip.

        ``transport="direct"``: the lease carries only its runs (the client builds the batches);
        refused (:class:`ConfigError`) when the dataset has no client location. A take refused
        (cancelled, draining, a bad rank or slot) still acknowledges, then raises.
        """
        trip = {"rank": rank, "slot": slot, "slots": slots, "session": session, "owner": owner}
        p = await self._decide(it, client, acks, trip, transport)
        statuses = p.statuses
        while p.lease is not None:
            payload = self._payload(it, p, client, transport)
            if payload is not None:
                return statuses, payload
            # it expired while being built (a loaded machine), back in the queue: take again
            p = await self._decide(it, client, (), trip, transport)
        return statuses, None

    async def _decide(
        self,
        it: Iteration,
        client: str,
        acks: Sequence[AckItem],
        trip: dict[str, Any],
        transport: str,
    ) -> Planned:
        """Acknowledge ``acks`` and take a lease (:meth:`_transition`); a refused take still
        acknowledges, then raises."""
        refusal, take, secret = self._trip(it, client, transport, trip)
        p = await self._transition(it, acks, secret, take)
        if refusal is not None:
            raise refusal
        return p

    def _trip(
        self, it: Iteration, client: str, transport: str, trip: dict[str, Any]
    ) -> tuple[DatamillError | None, Take | None, str]:
        """``(why no lease may be taken, the take, the session's hash)`` of a round trip."""
        refusal = self._refusal(
            it, transport, rank=trip["rank"], slot=trip["slot"], slots=trip["slots"]
        )
        secret = client if trip["session"] is None else trip["session"]
        take = Take(
            client,
            rank=trip["rank"],
            slot=trip["slot"],
            slots=trip["slots"],
            session=secret,
            owner=trip["owner"],
            drain_s=self.drain_timeout or None,  # leases a drain can see acknowledged
        )
        return refusal, None if refusal is not None else take, session_digest(secret)

    def _refusal(
        self, it: Iteration, transport: str, *, rank: int, slot: int, slots: int
    ) -> DatamillError | None:
        """Why no lease may be taken now (raised after the request's acks), or ``None``."""
        if transport == "direct":
            try:
                self.client_location(str(it.config["dataset"]))
            except DatamillError as exc:
                return exc
        elif transport != "built":
            return ConfigError(f"unknown transport {transport!r}; expected one of built, direct")
        if it.cancelled:
            return CancelledError(
                f"iteration {it.id} was cancelled by an admin",
                hint="start a new iteration (another name or config)",
            )
        if self.draining:
            return UnavailableError(
                "the server is shutting down (draining): no new leases",
                hint="retry: the server that replaces this one hands out the rest",
            )
        if it.mode == "static" and not 0 <= rank < it.world_size:
            return ConfigError(f"rank must be in [0, {it.world_size}), got {rank}")
        if not 0 <= slot < max(1, slots):
            return ConfigError(f"slot must be in [0, slots={slots}), got {slot}")
        return None

    def _payload(
        self, it: Iteration, p: Planned, client: str, transport: str
    ) -> LeasePayload | None:
        """The journaled lease ``p.lease`` with its runs, and its batches unless it is direct;
        ``None`` when it expired while its batches were built."""
        lease = p.lease
        assert lease is not None
        units = it.units_of(lease)
        runs = unit_runs(units, it.unit_location)
        if transport == "direct":
            self.telemetry.leased(it, reissued=p.reissued, nbytes=0, seconds=0.0)
            return LeasePayload(lease, units, b"", int(it.config["epoch"]), runs)
        # built in the request's thread: building the next lease ahead in a pool (tried) made the
        # builds of several clients compete for the GIL: 190k instead of 420k samples/s with 4
        # clients
        t0 = time.perf_counter()
        if self.pool is not None:  # in a build worker: this thread only waits (without the GIL)
            ds = self.dataset(str(it.config["dataset"]))
            body = self.pool.build(
                lease.queue if it.mode == "static" else client, ds["path"], it.config, runs
            )
        else:
            body = self._body(it, units)
        with self.lock(it):  # the lease's clock starts when its holder gets it, not before a build
            live = it.delivered(lease, now=self.clock())
        if not live:
            return None
        self.telemetry.leased(
            it, reissued=p.reissued, nbytes=len(body), seconds=time.perf_counter() - t0
        )
        return LeasePayload(lease, units, body, int(it.config["epoch"]), runs)

    def _locate(self, ds_id: str, real: Path, client_location: str) -> None:
        """Record a dataset's client location and the content identity of the data at ``real``,
        which direct clients check their copy against."""
        from datamill.core.identity import content_identity

        self.locations.set_identity(ds_id, content_identity(real))
        self.locations.set(ds_id, client_location)
        self._located.pop(ds_id, None)

    def client_identity(self, ref: str) -> dict[str, Any]:
        """The content identity of dataset ``ref`` recorded with its client location (recorded now
        for a dataset registered by an earlier release)."""
        from datamill.core.identity import content_identity

        ds = self.dataset(ref)
        self.client_location(ds["id"])  # ConfigError (400) without a client location
        found = self.locations.identity(ds["id"])
        if found is None:
            found = content_identity(ds["path"])
            self.locations.set_identity(ds["id"], found)
        return found

    def client_location(self, ref: str) -> str:
        """Where clients read dataset ``ref`` in direct mode (:class:`ConfigError` when it has
        none)."""
        ds = self.dataset(ref)
        loc = self._located.get(ds["id"])
        if loc is None:
            loc = self._located[ds["id"]] = self.locations.require(ds["id"], ds["name"])
        return loc

    def _body(self, it: Iteration, units: Sequence[int]) -> bytes:
        """The Arrow IPC stream of some units' batches (one build per run of one plan rank's
        batches)."""
        cfg = it.config
        svc = self.service(cfg)
        tables: list[pa.Table] = []
        i = 0
        while i < len(units):
            r, b = it.unit_location(units[i])
            j = i + 1
            while (
                j < len(units)
                and units[j] == units[j - 1] + 1
                and it.unit_location(units[j])[0] == r
            ):
                j += 1
            tables.extend(
                res.output
                for res in svc.build_samples(
                    cfg["epoch"], r, list(range(b, b + j - i)), world_size=cfg["plan_world"]
                )
            )
            i = j
        return to_ipc(tables)

    def rollback(self, it: Iteration, *, session: str, consumed: int) -> dict[str, Any]:
        """A dynamic-mode client restored a checkpoint of session ``session`` (its secret) that had
        consumed ``consumed`` batches: the units that session acknowledged after its first
        ``consumed`` are pending again (appended as a rewind record), so they are served again.

        Raises:
            ResumeStateError: not a dynamic iteration, or the journal has no lease of that session
                (another server's journal, or one gc'd): the state cannot be honoured.
        """
        if it.mode != "dynamic":
            raise ResumeStateError(
                f"a session rollback is for dynamic iterations; {it.id} is {it.mode}",
                hint="resume a static rank with {rank, consumed}",
            )
        sess = session_digest(session)
        acked = self.journal.session_acks(it.id, sess)
        if acked is None:
            if consumed == 0:
                return {**self.progress(it), "rolled_back": 0}
            raise ResumeStateError(
                f"iteration {it.id} has no record of the saved session (it consumed {consumed} "
                "batches): this server cannot replay what it consumed after the checkpoint",
                hint="resume from a state saved against this server's journal, or start the epoch "
                "again",
            )
        after = np.asarray(acked[consumed:], dtype=np.int64)
        with self.lock(it):
            it.rollback(sess, after.tolist())
            w = self._rewind_write(it, after, np.zeros(0, np.int64))
        self.writes.wait(w)
        return {**self.progress(it), "rolled_back": len(after)}

    def rewind(self, it: Iteration, body: Mapping[str, Any]) -> dict[str, Any]:
        """Set the done set from a client checkpoint (``{rank, consumed}`` or ``{done: [[a, b],
        ...]}``).

        Its journal write is queued under the iteration's lock, after the writes of the acks already
        planned (an ack in flight lands before the rewind, in the journal as in memory), and it is
        appended (:func:`~datamill.serve.journal.leases.rewind_write`): the done set is changed by
        records computed from the journal's own, never rewritten from a memory snapshot (which
        misses other ranks' acks in flight: issue #37's rewind race).
        """
        if body.get("done") is None:
            rank, consumed = int(body["rank"]), int(body["consumed"])
            if (
                it.mode != "static"
                or not 0 <= rank < len(it.queues)
                or not 0 <= consumed <= len(it.queues[rank])
            ):
                raise ConfigError(
                    f"rewind of rank {rank} to {consumed} batches does not fit this "
                    f"{it.mode} iteration ({[len(q) for q in it.queues]} batches per rank)"
                )
        with self.lock(it):
            if body.get("done") is not None:
                drop, keep = it.rewind(
                    done=[u for a, b in body["done"] for u in range(int(a), int(b))]
                )
            else:
                drop, keep = it.rewind(rank=int(body["rank"]), consumed=int(body["consumed"]))
            w = self._rewind_write(it, drop, keep)
        self.writes.wait(w)
        return self.progress(it)

    def _rewind_write(
        self, it: Iteration, drop: NDArray[np.int64], keep: NDArray[np.int64]
    ) -> Write:
        """Queue a rewind's record (call under the iteration's lock, right after its change)."""
        self._rewinds += 1
        lease = f"rewind.{self.boot}.{self._rewinds}"
        return self.writes.submit(
            rewind_write(it.id, total=it.total, drop=drop, keep=keep, lease=lease)
        )
