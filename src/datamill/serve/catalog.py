"""The server's datasets and iterations without HTTP (:class:`Catalog`): registration under the
roots, iteration configs (resume bases, lease sizes), lookup and rebuild from the journal, open and
close; :class:`datamill.serve.server.ServeState` adds the protocol's round trip."""

from __future__ import annotations

import os
import re
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from datamill.core.checks import check_int
from datamill.core.errors import ConfigError, DatamillError, NotFoundError, ResumeStateError
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.ragged import runs
from datamill.core.state import check_resume_compat
from datamill.core.wire import ID_PATTERN, MAX_LEASE_SAMPLES
from datamill.loader import BatchService
from datamill.loader.runs import SERVICE_FIELDS, iteration_window, service_for, service_key
from datamill.serve.data.direct import ClientLocations
from datamill.serve.http.auth import KeyStore
from datamill.serve.journal.leases import (
    GroupCommit,
    journaled_leases,
)
from datamill.serve.journal.store import Journal
from datamill.serve.observe.metrics import Telemetry
from datamill.serve.protocol.iteration import Iteration

__all__ = [
    "LEASE_SIZES",
    "MAX_LEASE_SAMPLES",
    "MODES",
    "Catalog",
    "ConflictError",
    "NotFoundError",
    "auto_lease_size",
    "check_name",
    "row_bytes",
]

_NAME_RE = re.compile(ID_PATTERN)
MODES = ("dynamic", "static")
_CREATOR_ONLY = ("base_done", "lease_size", "lease_timeout", "plan_world")
_ORDER = (*SERVICE_FIELDS, "epoch")
"""An iteration's config fields its order depends on (a resumed iteration keeps them)."""


class ConflictError(DatamillError, ValueError):
    """A name already used with another config (HTTP 409)."""


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


LEASE_SIZES = (16, 256)
"""The smallest and largest lease :func:`auto_lease_size` picks, in batches."""


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


class Catalog:
    """Datasets and iterations of one server: registration, configs, lookup, open and close (the
    arguments are :class:`~datamill.serve.server.ServeState`'s)."""

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
        self._locks = weakref.WeakKeyDictionary[Iteration, threading.RLock]()
        self._closed: set[str] = set()  # sessions whose connections their clients all closed
        self.writes = GroupCommit(self.journal)  # lease and ack writes, group-committed
        self._datasets: list[dict[str, Any]] | None = None  # the journal's rows, read once
        self._located: dict[str, str] = {}  # dataset id -> client location (direct mode)
        self._row_bytes: dict[str, float | None] = {}  # dataset id -> stored bytes per sample
        self._sources: dict[str, tuple[int, Any]] = {}  # path -> (mtime, its opened Source)
        self.keys = KeyStore(self.journal)
        self.auth, self.lease_timeout = auth, float(lease_timeout)
        self.cache_shards = None if cache_shards is None else int(cache_shards)
        self.roots = [Path(os.path.realpath(r)) for r in roots]
        self.boot = secrets.token_hex(4)
        self._lock = threading.RLock()
        self._services: dict[str, BatchService] = {}
        self._iterations: dict[str, Iteration] = {}
        # counters, lifecycle rows, event logs (datamill.serve.observe.metrics)
        self.telemetry = Telemetry(self.journal)
        self._rewinds = 0  # rewinds of this server run (each has its own id in the journal)
        self.draining = False  # after SIGTERM: no new leases; acks and heartbeats still answered
        self.drain_timeout = 0.0  # > 0 (serve() sets it): leases sized so that a drain ends
        self.locations = ClientLocations(self.journal)  # direct mode: where clients read data
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

    def relative(self, path: str) -> str:
        """A dataset's path as the UI and the API show it: relative to its root."""
        real = Path(path)
        return next(
            (str(real.relative_to(r)) for r in self.roots if real == r or r in real.parents),
            real.name,
        )

    def _public(self, ds: Mapping[str, Any]) -> dict[str, Any]:
        return {
            k: v for k, v in {**ds, "path": self.relative(ds["path"])}.items() if k != "created"
        }

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

    def source(self, ref: str) -> Any:
        """The opened Source of dataset ``ref`` (kept; opened again when its folder or file
        changed): the web UI's and the iterations' checks read it."""
        path = self.dataset(ref)["path"]
        try:
            stamp = Path(path).stat().st_mtime_ns
        except OSError:
            stamp = -1
        with self._lock:
            hit = self._sources.get(path)
        if hit is None or hit[0] != stamp:
            hit = (stamp, self.open_source(path))
            with self._lock:
                self._sources[path] = hit
        return hit[1]

    def service(self, cfg: Mapping[str, Any]) -> BatchService:
        """The batch service of a dataset and order config (created once)."""
        key = service_key(cfg)  # every epoch's
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
        for f in ("batch_size", "seed", "epoch", "world_size", "lease_size"):
            low = 0 if f in ("seed", "epoch") else 1
            if cfg[f] < low:
                raise ConfigError(f"{f} must be >= {low}, got {cfg[f]}")
        if cfg["mode"] not in MODES:
            raise ConfigError(f"unknown mode {cfg['mode']!r}; expected one of {', '.join(MODES)}")
        n, world = int(sum(self.source(cfg["dataset"]).shard_sizes())), cfg["world_size"]
        if world > max(1, n):
            raise ConfigError(
                f"world_size must be at most the dataset's {n:,} samples, got {world:,}",
                hint="use fewer ranks (each rank needs at least one sample)",
            )
        if cfg["batch_size"] * cfg["lease_size"] > MAX_LEASE_SAMPLES:  # a request's work bounded
            raise ConfigError(
                f"batch_size * lease_size must be at most {MAX_LEASE_SAMPLES:,} samples per lease, "
                f"got {cfg['batch_size']:,} * {cfg['lease_size']:,}",
                hint="lower lease_size",
            )
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
        """``(plan world size, units already done)`` of a resumed iteration: from iteration
        ``resume_from`` (the same order, its done units) or every rank's ``loader_states``."""
        if req.get("resume_from"):
            old = self.iteration(str(req["resume_from"]))
            check_resume_compat(
                old.config,
                cfg,
                fields=_ORDER,
                what=f"a resume of iteration {old.id}",
                hint="resume with the saved iteration's dataset and order settings",
            )
            return int(old.config["plan_world"]), old.done_units()
        if req.get("loader_states"):
            return self._states_base(cfg, req["loader_states"])
        return (cfg["world_size"] if cfg["mode"] == "static" else 1), []

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

        A joiner needs neither the resume spec nor the creator's ``lease_size``/``lease_timeout``
        nor a ``window`` (it takes the iteration's); any other difference from its settings is a
        :class:`ConflictError`. A shape that does not fit the dataset (more ranks than samples, a
        lease of more than :data:`MAX_LEASE_SAMPLES`) is a :class:`ConfigError`. A new iteration's
        window is fixed at creation (:func:`~datamill.loader.runs.iteration_window`)."""
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
                    saved = {**row["config"], **({"window": None} if cfg["window"] is None else {})}
                    diffs = [k for k in joined if saved.get(k) != joined[k]]
                    if diffs:
                        raise ConflictError(
                            f"iteration {name or it_id!r} of epoch {cfg['epoch']} exists with "
                            f"another config (differs in {diffs})",
                            hint="use another name, or the same settings to join it",
                        )
                    return self.describe(self.iteration(it_id))
            if cfg["window"] is None:  # fixed now, for every build worker and direct client
                old = self.iteration(str(req["resume_from"])) if req.get("resume_from") else None
                src, states = self.source(cfg["dataset"]), req.get("loader_states")
                cfg["window"] = old.config.get("window") if old else iteration_window(src, states)
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
            it.mark_done(self.journal.done_units(row["id"]))
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
