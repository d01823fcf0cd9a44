"""The resume rules of :class:`~datamill.loader.service.BatchService`: the tiny JSON state of a
rank's position, the check that a state fits the service (dataset, seed, order settings, a
position inside the epoch), and where a rank resumes from one rank's state or every rank's states
(an *elastic* resume re-splits the rest of the epoch: :mod:`datamill.loader.elastic`). A mixin: the
service holds the settings and the plans.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from datamill.core.constants import LOADER_STATE_FORMAT
from datamill.core.errors import ResumeStateError
from datamill.loader.elastic import (
    ResumePoint,
    carried_state,
    norm_elastic,
    resume_point,
    same_world,
)
from datamill.loader.order import Elastic
from datamill.loader.servicebase import ServiceBase
from datamill.loader.state import (
    ORDER_FIELDS,
    check_resume_compat,
    config_fingerprint,
    validate_state,
)

__all__ = ["Resumes"]


class Resumes(ServiceBase):
    """The resume methods of :class:`~datamill.loader.service.BatchService`."""

    def resume_state(
        self,
        *,
        epoch: int,
        batches_seen: int,
        rank: int = 0,
        world_size: int = 1,
        elastic: Elastic | None = None,
        replication: int = 1,
    ) -> dict[str, Any]:
        """The tiny JSON resume state of rank ``rank`` after ``batches_seen`` batches of ``epoch``.

        With an ``elastic`` history (the rank resumed elastically in ``epoch``) the state records it
        and ``batches_seen`` counts batches of the re-split plan.

        Examples:
            >>> import pyarrow as pa
            >>> from datamill.core.source import TableSource
            >>> from datamill.loader.service import BatchService
            >>> svc = BatchService(TableSource(pa.table({"x": list(range(10))})), batch_size=4)
            >>> st = svc.resume_state(epoch=1, batches_seen=3)
            >>> st["samples_seen"], svc.check_state(st)
            (10, (1, 3))
        """
        cfg = self.config(rank=rank, world_size=world_size, replication=replication)
        hist = norm_elastic(elastic)
        rank_total = (
            len(self.plan(epoch, rank, world_size, elastic=hist, replication=replication).seq)
            if hist
            else self.rank_samples(rank, world_size, replication=replication)
        )
        state = {
            "format": LOADER_STATE_FORMAT,
            "epoch": int(epoch),
            "batches_seen": int(batches_seen),
            "samples_seen": min(rank_total, int(batches_seen) * self.batch_size),
            "seed": self.seed,
            "dataset_fingerprint": self.fingerprint(),
            "config_fingerprint": config_fingerprint(cfg),
            "config": cfg,
        }
        if hist:
            state["elastic"] = [[w, list(cs)] for w, cs in hist]
        return state

    def check_state(
        self,
        state: Mapping[str, Any],
        *,
        rank: int = 0,
        world_size: int = 1,
        allow_mismatch: Sequence[str] = (),
        replication: int = 1,
    ) -> tuple[int, int]:
        """``(epoch, batches_seen)`` of a resume state that fits this service and rank.

        Raises:
            ResumeStateError: a malformed state, or one listing every differing field.
        """
        st = validate_state(state)
        current = {
            "seed": self.seed,
            "dataset_fingerprint": self.fingerprint(),
            **self.config(rank=rank, world_size=world_size, replication=replication),
        }
        saved = {
            "seed": st["seed"],
            "dataset_fingerprint": st["dataset_fingerprint"],
            **dict(st["config"]),
        }
        extra = {}
        if bool(saved.get("warmup")) != bool(current.get("warmup")):
            extra["hint"] = (
                "a Loader over object storage now warms up by default (Batching(warmup=None)); "
                "a state saved before that change has no warmup: resume it with "
                "Loader.from_state(source, state), or pass Batching(warmup="
                f"{bool(saved.get('warmup'))})"
            )
        if "hint" not in extra and saved.get("window") != current.get("window"):
            extra["hint"] = (
                f"the state was saved with a shuffle window of {saved.get('window')} shards (the "
                "default window holds at most about 64 MiB of shard files since 2026-11-30, so "
                "an earlier state may differ): resume it with Loader.from_state(source, state), "
                f"or pass Batching(window={saved.get('window')})"
            )
        check_resume_compat(
            saved,
            current,
            fields=("dataset_fingerprint", "seed", *ORDER_FIELDS),
            allow_mismatch=allow_mismatch,
            **extra,
        )
        epoch, seen = int(st["epoch"]), int(st["batches_seen"])
        if seen and "batch_size" not in allow_mismatch:
            total = self.plan(epoch, rank, world_size, replication=replication).total_batches
            if seen > total:
                raise ResumeStateError(
                    f"resume state says {seen:,} batches were seen in epoch {epoch}, but that "
                    f"epoch has only {total:,} batches for rank {rank} of {world_size}",
                    hint="the state was edited or belongs to another run; resume from a state "
                    "saved by this loader",
                )
        return epoch, seen

    def resume_point(
        self,
        states: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        rank: int = 0,
        world_size: int = 1,
        replication: int = 1,
        allow_mismatch: Sequence[str] = (),
    ) -> ResumePoint:
        """Where rank ``rank`` of ``world_size`` resumes from one rank's state or every rank's
        states.

        The states may come from another world size, replication or batch size (an *elastic*
        resume): the samples they consumed are known exactly from the pure order, and the rest of
        the epoch is re-split over the new ranks (:func:`datamill.loader.elastic.resume_point`).
        A server resuming an iteration uses the same rule, then passes ``elastic=`` to :meth:`plan`
        and :meth:`build`.

        Raises:
            ResumeStateError: malformed states, states that disagree, or differing global settings.

        Examples:
            >>> import pyarrow as pa
            >>> from datamill.core.source import TableSource
            >>> from datamill.loader.options import Batching
            >>> from datamill.loader.service import BatchService
            >>> svc = BatchService(
            ...     TableSource(pa.table({"x": list(range(10))})),
            ...     batch_size=2,
            ...     batching=Batching(shuffle=False),
            ... )
            >>> states = [
            ...     svc.resume_state(epoch=0, batches_seen=1, rank=r, world_size=2)
            ...     for r in range(2)
            ... ]
            >>> point = svc.resume_point(states, rank=0, world_size=3)
            >>> point.elastic, svc.plan(0, 0, 3, elastic=point.elastic).seq.tolist()
            (((2, (2, 2)),), [2, 3])
        """
        return resume_point(
            self,
            states,
            rank=rank,
            world_size=world_size,
            replication=replication,
            allow_mismatch=allow_mismatch,
        )

    def resume(
        self,
        state: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        rank: int = 0,
        world_size: int = 1,
        allow_mismatch: Sequence[str] = (),
        replication: int = 1,
    ) -> tuple[ResumePoint, Mapping[str, Any] | None]:
        """Where rank ``rank`` resumes, and the saved state whose per-rank fields carry over.

        This rank's own state in the same world is checked with :meth:`check_state`; anything else
        goes through :meth:`resume_point`. The second value is ``None`` when the rest of the epoch
        is re-split (:func:`datamill.loader.elastic.carried_state`).
        """
        where = {"rank": rank, "world_size": world_size, "replication": replication}
        if same_world(state, batch_size=self.batch_size, allow_mismatch=allow_mismatch, **where):
            assert isinstance(state, Mapping)
            epoch, seen = self.check_state(state, allow_mismatch=allow_mismatch, **where)
            return ResumePoint(epoch, seen), state
        point = self.resume_point(state, allow_mismatch=allow_mismatch, **where)
        return point, carried_state(state, point)
