"""Direct mode on the client: the batch service a :class:`~datamill.client.RemoteLoader` builds
with, from the location the server gives for the dataset, and the epoch's builds.

A direct lease carries only its runs (``X-Datamill-Runs``); this process builds the batches with
the same :class:`~datamill.loader.BatchService` settings the server would use
(:func:`~datamill.loader.runs.service_for`), one continuous build per plan rank
(:class:`~datamill.loader.runs.RunStream`), so they are the server-built batches.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

from datamill.client.http import Client
from datamill.core.wire import parse_runs
from datamill.loader.collate import resolve_collate
from datamill.loader.runs import RunStream, as_table, service_for, service_key

__all__ = ["DirectBuilds"]

_RACY_NS = 2_000_000_000
"""A local copy with a file changed less than this long (ns) before its check is checked by content
again at the next epoch: a second change within the clock's tick may leave its ctime as it was."""

Stamp = tuple[tuple[int, int, int, int], ...]


def _stamp(location: str, identity: Mapping[str, Any] | None) -> Stamp | None:
    """``(inode, size, mtime, ctime)`` of every file a local copy's identity names, taken before
    its content is checked: an epoch whose stamp is the same reads no file again (a file rewritten,
    replaced or touched since has another ctime or inode). ``None`` (check the content): a remote
    or unchecked copy, a file missing, or one changed within :data:`_RACY_NS`."""
    from datamill.core.objstore import is_remote

    if identity is None or is_remote(location) or location.startswith("file:"):
        return None
    now, out = time.time_ns(), []
    for rel in identity.get("files", {}):
        try:
            st = os.stat(f"{location}/{rel}" if rel else location)  # noqa: PTH116 - a str stat
        except OSError:
            return None
        if now - st.st_ctime_ns < _RACY_NS:
            return None
        out.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


class DirectBuilds:
    """A direct client's batch service (opened once per dataset and order) and its epoch's builds.

    Args:
        cache_dir: ``s3://`` locations: the local shard cache folder (``None``: the default).
        cache_limit: ``s3://`` locations: bytes the local shard cache keeps at most.
        collate: ``"numpy"`` or ``"torch"``: the batches are collated as they are built, a block
            of them at once (:func:`~datamill.loader.collate_lease.block_collate`: the arrays the
            collate of each batch gives, each column converted once per block); else (``None``)
            they are tables, as the server builds them. Defaults to ``None``.
    """

    def __init__(
        self,
        *,
        cache_dir: str | os.PathLike[str] | None,
        cache_limit: int,
        collate: str | None = None,
    ) -> None:
        self.cache_dir, self.cache_limit = cache_dir, int(cache_limit)
        # the built-in collate the builds apply a block at a time (None: tables)
        self.block = resolve_collate(collate) if collate in ("numpy", "torch") else None
        self._service: tuple[str, Any] | None = None  # (config key, BatchService)
        # (location, the content identity the server recorded) of the open service
        self._checked: tuple[str, dict[str, Any] | None] = ("", None)
        self.stream: RunStream | None = None  # this epoch's builds
        # (dataset id, location, identity, source, stamp): the copy opened while the first join was
        # in flight (:meth:`preopen`), taken by :meth:`open` when the join names that dataset
        self._pre: tuple[str, str, dict[str, Any] | None, Any, Stamp | None] | None = None
        self._stamp: Stamp | None = None  # the open copy's files when it was last checked

    def open(self, client: Client, cfg: Mapping[str, Any], *, name: str) -> Any:
        """The batch service of the iteration ``cfg`` of dataset ``name`` (the dataset's location
        and content identity asked of ``client`` when the dataset or the order changed). The copy
        at the location is checked against the identity before any batch is built from it: when
        the service opens, and again at each epoch for a local location (an ``s3://`` copy's
        objects are checked by the shard cache, against the ETags seen when the source opened).

        Raises:
            DataFileError: the copy is not the data the server registered (naming the dataset, the
                file, what was recorded and what was found).
        """
        key = service_key(cfg, cfg["plan_world"])
        if self._service is not None and self._service[0] == key:
            self.recheck(cfg, name=name, key=key)  # a new epoch: checked again
            return self._service[1]
        pre, self._pre = self._pre, None
        if pre is not None and pre[0] == str(cfg["dataset"]):  # opened during the join
            _, location, identity, source, stamp = pre
        else:
            info = client.location_info(str(cfg["dataset"]))
            location, identity, source, stamp = self._opened(info, name=name)
        self._checked, self._stamp = (location, identity), stamp
        if self._service is not None:
            self._service[1].close()
        # one epoch's order and plans kept, as the in-process Loader keeps (plan_epochs=1): a direct
        # client builds one epoch at a time, and the next epoch's plan then reuses the memory of
        # the last one's instead of fresh pages (epoch 1's plan took 145-180 ms instead of 65-85)
        svc = service_for(source, cfg, ranks=1, collate=self.block or "arrow").replace(
            plan_epochs=1
        )
        self._service = (key, svc)
        return self._service[1]

    def _opened(
        self, info: Mapping[str, Any], *, name: str
    ) -> tuple[str, dict[str, Any] | None, Any, Stamp | None]:
        """``(location, identity, its opened Source, the copy's stamp)`` of a dataset's location
        ``info``, the copy there checked against the identity first."""
        from datamill.core.identity import check_identity
        from datamill.core.objstore import is_remote
        from datamill.sources import open_source

        location, identity = str(info["location"]), info.get("identity")
        stamp = _stamp(location, identity)
        if identity is not None:
            check_identity(location, identity, dataset=name)
        if is_remote(location):
            source = open_source(location, cache_dir=self.cache_dir, cache_limit=self.cache_limit)
        else:
            source = open_source(location)
        return location, identity, source, stamp

    def preopen(self, info: Mapping[str, Any], *, name: str) -> None:
        """A loader's first epoch: the copy at the dataset's location ``info``
        (:meth:`Client.location_info <datamill.client.Client.location_info>`) checked and opened
        now, in this thread, while the join is in flight; :meth:`open` takes it when the join's
        iteration is of that dataset. A failure is left to :meth:`open`, which raises it where it
        did before."""
        try:
            self._pre = (str(info["dataset"]), *self._opened(info, name=name))
        except Exception:  # noqa: BLE001 - open() asks, checks and opens again, and raises there
            self._pre = None

    def recheck(self, cfg: Mapping[str, Any], *, name: str, key: str | None = None) -> bool:
        """A new epoch: the open copy checked again against its identity (a local location),
        when the service open is the one of ``cfg``; whether it is (``False``: :meth:`open` opens
        the service of ``cfg`` and checks its copy then). :meth:`open` calls it. The files are read
        again only when one's inode, size, mtime or ctime moved since the last check, or it had
        changed within 2 s of it (a stat each: 300 footer reads took 8-9 ms an epoch).

        ``key``: the service key of ``cfg`` when the caller has it.

        Raises:
            DataFileError: the copy is not the data the server registered.
        """
        from datamill.core.identity import check_identity
        from datamill.core.objstore import is_remote

        key = key or service_key(cfg, cfg["plan_world"])
        if self._service is None or self._service[0] != key:
            return False
        location, identity = self._checked
        if identity is not None and not is_remote(location):
            stamp = _stamp(location, identity)  # before the content: a change meanwhile moves it
            if stamp is None or stamp != self._stamp:  # a file changed since: its content checked
                check_identity(location, identity, dataset=name)
            self._stamp = stamp
        return True

    def start_epoch(self, cfg: Mapping[str, Any], *, follow: bool) -> None:
        """Builds of the epoch of ``cfg`` start (``follow``: a static rank's leases continue one
        build)."""
        assert self._service is not None
        self.stream = RunStream(self._service[1], cfg, follow=follow)

    def prime(self, cfg: Mapping[str, Any], *, rank: int, world: int, batch: int) -> None:
        """A static rank's first batch of the epoch built now, while its first lease request is in
        flight (its plan rank is ``rank`` when the plan has the iteration's ``world`` ranks;
        otherwise nothing is built ahead)."""
        if self.stream is not None and int(cfg["plan_world"]) == world:
            self.stream.prime(rank, batch)

    def end_epoch(self) -> None:
        """Stop the epoch's builds (their shards are released)."""
        if self.stream is not None:
            self.stream.close()
            self.stream = None

    def batches(self, runs: str) -> Iterator[Any]:
        """A direct lease's batches (its ``X-Datamill-Runs`` value), built here as the loop asks for
        them: collated (a numpy or torch ``collate``), or as the server builds them (one contiguous
        record batch each, of the lease's first batch's schema)."""
        assert self.stream is not None
        if self.block is not None:
            yield from self.stream.batches(parse_runs(runs))
            return
        schema = None
        for table in self.stream.batches(parse_runs(runs)):
            schema = table.schema if schema is None else schema
            yield as_table(table, schema)

    def is_open(self) -> bool:
        """Whether a batch service is open (a previous epoch opened it)."""
        return self._service is not None

    def plan_ahead(self, epoch: int, rank: int, world: int) -> None:
        """Plan rank ``rank``'s epoch ``epoch`` now, in this thread (the batch service keeps one
        epoch's plans: the epoch before's are dropped), while the loader sends the epoch's join from
        a helper thread. A plan is a few large arrays: made in a helper thread, they came from that
        thread's own allocator arena, fresh pages each epoch, and the plan took 2-3 times the CPU
        it takes in the loop's thread."""
        assert self._service is not None
        try:
            self._service[1].plan(epoch, rank, world)
        except Exception:  # noqa: BLE001 - the epoch's build plans again, and raises there
            return
