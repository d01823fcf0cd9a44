"""The server's logic without HTTP: datasets under roots, iterations, leases as Arrow IPC, the
journal.

:class:`ServeState` is what :func:`datamill.serve.app.create_app` exposes over HTTP; it can be used
(and is tested) directly. Batch contents are rebuilt on demand through the batch service (one per
dataset and order config, with one shard cache shared by every rank); the journal holds only configs
and acknowledged unit runs.
"""

from __future__ import annotations

import io
import os
import re
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from datamill.core.errors import ConfigError, DatamillError, ResumeStateError
from datamill.core.fingerprint import fingerprint_obj
from datamill.loader import BatchService
from datamill.serve.auth import KeyStore
from datamill.serve.direct import ClientLocations, as_batches, service_for, unit_runs
from datamill.serve.iteration import AckResult, Iteration, Lease, digest, runs
from datamill.serve.journal import Journal
from datamill.serve.lease_journal import (
    UnavailableError,
    ensure_tables,
    journaled_leases,
    write_leases,
)
from datamill.serve.metrics import Telemetry

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
_CREATOR_ONLY = ("base_done", "lease_size", "lease_timeout", "plan_world")


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
    ) -> None:
        self.journal = Journal(state_dir)
        ensure_tables(self.journal)
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
        )  # counters, lifecycle rows, event logs (datamill.serve.metrics)
        self.draining = False  # after SIGTERM: no new leases; acks and heartbeats still answered
        self.locations = ClientLocations(
            self.journal
        )  # direct mode: where clients read each dataset
        self.pool: Any = None
        if build_workers:
            from datamill.serve.workers import BuildPool

            self.pool = BuildPool(int(build_workers), cache_shards=self.cache_shards)

    def close(self) -> None:
        """Write the telemetry one last time, close the services and the journal."""
        self.telemetry.stop(self)
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

        ``client_location`` (a path every client node sees, or ``s3://...``) allows direct mode:
        clients are told it and build their batches themselves. Registering again may add or change
        it.
        """
        from datamill.serve.direct import check_location
        from datamill.sources import open_source

        check_name(name, what="dataset name")
        if client_location is not None:
            check_location(client_location)
        real = self.resolve(path)
        for ds in self.journal.datasets():
            if ds["name"] == name:
                if ds["path"] != str(real):
                    raise ConflictError(
                        f"dataset name {name!r} is already registered for another path"
                    )
                if client_location is not None:
                    self.locations.set(ds["id"], client_location)
                return self._public(ds)
        source = open_source(real)  # fails now (DataFileError) if it is not a datamill output
        ds_id = "ds-" + fingerprint_obj(str(real))[:12]
        self.journal.add_dataset(ds_id, name, str(real))
        if client_location is not None:
            self.locations.set(ds_id, client_location)
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

    def datasets(self) -> list[dict[str, Any]]:
        """Registered datasets (``id``, ``name``, path relative to its root)."""
        return [self._public(ds) for ds in self.journal.datasets()]

    def dataset(self, ref: str) -> dict[str, Any]:
        """A dataset by id or name."""
        check_name(ref, what="dataset")
        for ds in self.journal.datasets():
            if ref in (ds["id"], ds["name"]):
                return ds
        raise NotFoundError(
            f"no dataset {ref!r}; registered: {[d['name'] for d in self.journal.datasets()]}"
        )

    def open_source(self, path: str) -> Any:
        """The Source of a registered dataset's path (a benchmark may plan synthetic shard sizes
        instead)."""
        from datamill.sources import open_source

        return open_source(path)

    def service(self, cfg: Mapping[str, Any]) -> BatchService:
        """The batch service of a dataset and order config (created once)."""
        key = fingerprint_obj(
            {
                k: cfg[k]
                for k in (
                    "dataset",
                    "batch_size",
                    "seed",
                    "shuffle",
                    "columns",
                    "drop_last",
                    "window",
                )
            }
        )
        with self._lock:
            svc = self._services.get(key)
            if svc is None:
                ds = self.dataset(cfg["dataset"])
                svc = service_for(self.open_source(ds["path"]), cfg, cache_shards=self.cache_shards)
                self._services[key] = svc
            return svc

    # ------------------------------------------------------------------ iterations
    def _config(self, req: Mapping[str, Any]) -> dict[str, Any]:
        known = {
            "dataset",
            "batch_size",
            "seed",
            "epoch",
            "shuffle",
            "columns",
            "drop_last",
            "window",
            "mode",
            "world_size",
            "name",
            "lease_size",
            "lease_timeout",
            "resume_from",
            "loader_states",
        }
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
            "lease_size": int(req.get("lease_size", 16)),
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

    def _resume_base(self, cfg: dict[str, Any], req: Mapping[str, Any]) -> tuple[int, list[int]]:
        """``(plan world size, units already done)`` of a resumed iteration."""
        order = (
            "dataset",
            "batch_size",
            "seed",
            "epoch",
            "shuffle",
            "columns",
            "drop_last",
            "window",
        )
        if req.get("resume_from"):
            old = self.iteration(str(req["resume_from"]))
            diffs = [
                f"{f}: saved {old.config[f]!r}, now {cfg[f]!r}"
                for f in order
                if old.config[f] != cfg[f]
            ]
            if diffs:
                raise ResumeStateError(
                    "cannot resume iteration with another order: " + "; ".join(diffs)
                )
            return int(old.config["plan_world"]), old.done_units()
        states = req.get("loader_states")
        if states:
            from datamill.loader.state import validate_state

            sts = [validate_state(s) for s in states]
            world = len(sts)
            svc = self.service(cfg)
            ranks = sorted(int(s["config"]["rank"]) for s in sts)
            problems = (
                [] if ranks == list(range(world)) else [f"ranks {ranks}, expected 0..{world - 1}"]
            )
            for s in sts:
                c = s["config"]
                for f, want in (
                    ("world_size", world),
                    ("batch_size", cfg["batch_size"]),
                    ("shuffle", cfg["shuffle"]),
                    ("drop_last", cfg["drop_last"]),
                ):
                    if c.get(f) != want:
                        problems.append(
                            f"rank {c.get('rank')}: {f} saved {c.get(f)!r}, now {want!r}"
                        )
                if s["seed"] != cfg["seed"] or s["epoch"] != cfg["epoch"]:
                    problems.append(
                        f"rank {c.get('rank')}: seed/epoch saved {s['seed']}/{s['epoch']}, "
                        f"now {cfg['seed']}/{cfg['epoch']}"
                    )
                if s["dataset_fingerprint"] != svc.fingerprint():
                    problems.append(f"rank {c.get('rank')}: the dataset changed")
            if problems:
                raise ResumeStateError(
                    "loader states do not fit this iteration: " + "; ".join(problems)
                )
            done: list[int] = []
            base = 0
            for r in range(world):
                n = svc.num_batches(cfg["epoch"], r, world)
                seen = next(int(s["batches_seen"]) for s in sts if int(s["config"]["rank"]) == r)
                done.extend(range(base, base + min(seen, n)))
                base += n
            return world, done
        return (cfg["world_size"] if cfg["mode"] == "static" else 1), []

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
        it.on_expired = lambda leases: self.telemetry.expired(it, leases)
        return it

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
            done = self.journal.done(row["id"])
            it.mark_done(u for a, b, _ in done for u in range(a, b))
            if self.journal.is_cancelled(row["id"]):
                it.cancel()
            else:  # the grace period: leases in flight wait one lease timeout for their holders
                for lease in journaled_leases(self.journal, row["id"]):
                    it.restore(lease)
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
        items: Sequence[tuple[str, str, int | None, int | None]],
        *,
        session: str | None = None,
        client: str | None = None,
    ) -> tuple[dict[str, str], dict[str, list[tuple[int, int]]]]:
        """Acknowledge batches ``(lease, fence, start, stop)`` (queue positions; ``None``: the whole
        lease) of one session (its secret; ``client`` when ``None``): ``(status per lease, unit runs
        done)``.

        The units are journaled in **one transaction** before memory changes, so ``"already"`` is
        only ever answered for journaled acks.

        Raises:
            UnavailableError: the journal could not be written (nothing changed; retry later).
        """
        secret = session if session is not None else client if client is not None else ""
        with it.lock:
            statuses, marks = it.plan_acks(items, session=digest(secret))
            if marks:
                units = it.units_of_marks(marks)
                finished = it.finishing(marks)
                write_leases(self.journal, it.id, done=units, drop=finished)
                now = time.monotonic()
                self.telemetry.acked(
                    it, [now - it.leases[x].issued for x in finished if x in it.leases]
                )
                it.apply_acks(marks)
            else:
                units = {}
        if it.finished_all():
            self._evict(it)
        return statuses, units

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
        return it.heartbeat(
            client, leases=leases, session=session, stall_s=stall_s, batches=batches
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
        it.cancel()
        self.telemetry.ended(it, "cancelled")
        return it.progress()

    def next_lease(
        self,
        it: Iteration,
        client: str,
        *,
        rank: int = 0,
        slot: int = 0,
        slots: int = 1,
        session: str | None = None,
        owner: str = "",
        transport: str = "built",
    ) -> LeasePayload | None:
        """The client's next lease with its batches, or ``None`` (see :meth:`Iteration.finished`).

        ``transport="direct"``: the lease carries only its runs (the client builds the batches);
        refused (:class:`ConfigError`) when the dataset has no client location.
        """
        if transport == "direct":
            self.client_location(str(it.config["dataset"]))
        elif transport != "built":
            raise ConfigError(f"unknown transport {transport!r}; expected one of built, direct")
        if it.cancelled:
            raise CancelledError(
                f"iteration {it.id} was cancelled by an admin",
                hint="start a new iteration (another name or config)",
            )
        if self.draining:
            raise UnavailableError(
                "the server is shutting down (draining): no new leases",
                hint="retry: the server that replaces this one hands out the rest",
            )
        if it.mode == "static" and not 0 <= rank < it.world_size:
            raise ConfigError(f"rank must be in [0, {it.world_size}), got {rank}")
        if not 0 <= slot < max(1, slots):
            raise ConfigError(f"slot must be in [0, slots={slots}), got {slot}")
        with it.lock:
            reissued = it.reissued
            lease = it.take(client, rank=rank, slot=slot, slots=slots, session=session, owner=owner)
            reissued = it.reissued > reissued
            dropped = it.take_dropped()
            if lease is not None or dropped:
                try:  # journaled before the reply: after a restart its holder can reclaim it
                    write_leases(
                        self.journal, it.id, add=[lease] if lease is not None else [], drop=dropped
                    )
                except UnavailableError:
                    it.dropped.extend(dropped)
                    if lease is not None:
                        it.leases.pop(lease.id, None)
                        it.state[lease.queue][lease.start : lease.stop] = 0  # PENDING again
                    raise
        if lease is None:
            return None
        units = it.units_of(lease)
        runs = unit_runs(units, it.unit_location)
        if transport == "direct":
            self.telemetry.leased(it, reissued=reissued, nbytes=0, seconds=0.0)
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
        with it.lock:  # the lease's clock starts when its holder gets it, not before a (slow) build
            live = it.leases.get(lease.id) is lease
            if live:
                lease.deadline = max(lease.deadline, time.monotonic() + it.lease_timeout)
        if (
            not live
        ):  # it expired while being built (a loaded machine) and went back to the queue: take again
            return self.next_lease(
                it,
                client,
                rank=rank,
                slot=slot,
                slots=slots,
                session=session,
                owner=owner,
                transport=transport,
            )
        self.telemetry.leased(
            it, reissued=reissued, nbytes=len(body), seconds=time.perf_counter() - t0
        )
        return LeasePayload(lease, units, body, int(it.config["epoch"]), runs)

    def client_location(self, ref: str) -> str:
        """Where clients read dataset ``ref`` in direct mode (:class:`ConfigError` when it has
        none)."""
        ds = self.dataset(ref)
        return self.locations.require(ds["id"], ds["name"])

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

    def rewind(self, it: Iteration, body: Mapping[str, Any]) -> dict[str, Any]:
        """Set the done set from a client checkpoint (``{rank, consumed}`` or ``{done: [[a, b],
        ...]}``)."""
        if body.get("done") is not None:
            units = [u for a, b in body["done"] for u in range(int(a), int(b)) if 0 <= u < it.total]
            it.rewind(done=units)
        else:
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
            it.rewind(rank=rank, consumed=consumed)
        base = {u for a, b in it.config["base_done"] for u in range(a, b)}
        self.journal.set_done(
            it.id, runs(u for u in it.done_units() if u not in base), lease=f"rewind.{self.boot}"
        )
        return it.progress()
