"""Elastic resumption: resume rank ``r'`` of any world size ``W'`` from states saved with ``W``
ranks.

The global order of an epoch does not depend on the world size, and a rank's batch ``b`` is always
positions ``[b * B, (b + 1) * B)`` of its slice, so a set of resume states says *exactly* which
positions of the epoch were consumed: the first ``min(batches_seen * B, len(slice_r))`` of every old
rank's slice. What is left (:func:`~datamill.loader.order.remaining_positions`) is re-split over the
new ranks with the usual rule. One state is enough when the ranks stepped in lockstep (as under DDP,
where every rank has seen the same number of batches); otherwise pass every rank's state.

The epoch's history of such re-splits, ``((W, consumed per rank), ...)``, travels in the resume
state (``"elastic"``), so a resumed run may itself be stopped and resumed elastically again. The
next epoch starts plain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from datamill.core.errors import ConfigError, ResumeStateError
from datamill.loader.options import Batching
from datamill.loader.order import Elastic, remaining_positions, replica_group, split_sizes
from datamill.loader.state import GLOBAL_FIELDS, check_resume_compat, validate_state


class OrderSettings(Protocol):
    """What :func:`resume_point` reads of a service (a
    :class:`~datamill.loader.service.BatchService`)."""

    seed: int
    batch_size: int
    batching: Batching

    def fingerprint(self) -> str: ...

    def epoch_samples(self, epoch: int) -> int: ...

    def config(
        self, *, rank: int = 0, world_size: int = 1, replication: int = 1
    ) -> dict[str, Any]: ...


__all__ = ["ResumePoint", "carried_state", "norm_elastic", "resume_point", "same_world"]


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed rank starts: ``epoch``, ``batches_seen`` of its plan, the epoch's ``elastic``
    history.

    Examples:
        >>> ResumePoint(2, 0, ((2, (4, 4)),)).elastic
        ((2, (4, 4)),)
    """

    epoch: int
    batches_seen: int
    elastic: Elastic = ()


def norm_elastic(elastic: Any) -> Elastic:
    """An elastic history as nested tuples of ints (JSON lists accepted).

    Raises:
        ConfigError: not ``[[world_size, [count per rank]], ...]`` with counts ``>= 0``.

    Examples:
        >>> norm_elastic([[2, [3, 1]]])
        ((2, (3, 1)),)
    """
    if elastic is None:
        return ()
    try:
        out = tuple((int(w), tuple(int(c) for c in cs)) for w, cs in elastic)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"elastic must be [[world_size, [consumed per rank]], ...], got {elastic!r}"
        ) from exc
    if any(w < 1 or len(cs) != w or min(cs, default=0) < 0 for w, cs in out):
        raise ConfigError(
            f"elastic segments need world_size >= 1 and one count >= 0 per rank, got {elastic!r}"
        )
    return out


def _state_list(states: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(states, Mapping):
        return [validate_state(states)]
    out = [validate_state(s) for s in states]
    if not out:
        raise ResumeStateError("no resume state given")
    return out


def _same(states: list[dict[str, Any]], what: str, get: Any) -> Any:
    values = [get(s) for s in states]
    if any(v != values[0] for v in values):
        raise ResumeStateError(
            f"the resume states disagree on {what}: {sorted(set(map(repr, values)))}",
            hint="pass states saved at the same point of the same run",
        )
    return values[0]


def resume_point(
    service: OrderSettings,
    states: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    rank: int,
    world_size: int,
    replication: int = 1,
    allow_mismatch: Sequence[str] = (),
) -> ResumePoint:
    """Where rank ``rank`` of ``world_size`` (groups of ``replication``) resumes ``service`` from
    ``states``.

    Args:
        service: the resuming service (its global settings must match the states').
        states: one rank's state (ranks in lockstep) or the states of every rank of the saved run.
        rank: the resuming rank.
        world_size: the resuming run's ranks.
        replication: the resuming run's replication. Defaults to ``1``.
        allow_mismatch: fields whose difference is accepted; ``"batch_size"`` resumes with another
            batch size (the consumed samples are still exact). Defaults to ``()``.

    Returns:
        The epoch, the batches of the rank's (re-split) plan already seen, and the epoch's history.
        When the data world size and batch size are unchanged and every rank is at the same batch,
        nothing is re-split: the rank continues its own plan.

    Raises:
        ResumeStateError: malformed states, states that disagree with each other (epoch, history,
            world size, batch size), a rank missing from a list of states, or differing settings.
    """
    sts = _state_list(states)
    current = {
        "seed": service.seed,
        "dataset_fingerprint": service.fingerprint(),
        **service.config(rank=rank, world_size=world_size, replication=replication),
    }
    for st in sts:
        saved = {
            "seed": st["seed"],
            "dataset_fingerprint": st["dataset_fingerprint"],
            **dict(st["config"]),
        }
        check_resume_compat(
            saved, current, fields=(*GLOBAL_FIELDS, "batch_size"), allow_mismatch=allow_mismatch
        )
    epoch = _same(sts, "the epoch", lambda s: s["epoch"])
    try:
        history = _same(sts, "the elastic history", lambda s: norm_elastic(s.get("elastic")))
    except ConfigError as exc:
        raise ResumeStateError(f"malformed elastic history: {exc}") from exc
    old_world = _same(sts, "world_size", lambda s: int(s["config"]["world_size"]))
    old_repl = _same(sts, "replication", lambda s: int(s["config"].get("replication", 1)))
    old_bs = _same(sts, "batch_size", lambda s: int(s["config"]["batch_size"]))
    if old_world % old_repl:
        raise ResumeStateError(
            f"saved replication {old_repl} does not divide world_size {old_world}"
        )
    data_world = old_world // old_repl
    batches: dict[int, int] = {}
    for st in sts:
        saved_rank = int(st["config"]["rank"])
        if not 0 <= saved_rank < old_world:
            raise ResumeStateError(f"saved rank {saved_rank} is outside [0, {old_world})")
        d, _ = replica_group(saved_rank, world_size=old_world, replication=old_repl)
        if batches.setdefault(d, int(st["batches_seen"])) != int(st["batches_seen"]):
            raise ResumeStateError(
                f"replicas of data rank {d} are at different batches",
                hint="replicas step together; save every rank at the same point",
            )
    if len(sts) == 1:
        batches = dict.fromkeys(range(data_world), batches[next(iter(batches))])  # lockstep
    elif sorted(batches) != list(range(data_world)):
        missing = sorted(set(range(data_world)) - set(batches))
        raise ResumeStateError(
            f"states of {data_world} data ranks needed, missing rank(s) {missing}",
            hint="pass one state (ranks in lockstep) or the states of every rank",
        )
    _, new_data_world = replica_group(rank, world_size=world_size, replication=replication)
    steps = set(batches.values())
    if new_data_world == data_world and old_bs == service.batch_size and len(steps) == 1:
        return ResumePoint(int(epoch), steps.pop(), history)
    if service.batching.bucket_by is not None:
        raise ResumeStateError(
            "elastic resumption (another world size, batch size or uneven ranks) is not "
            "supported with bucket_by",
            hint="resume with the saved world size and batch size",
        )
    return ResumePoint(
        int(epoch), 0, _extended(service, epoch, history, batches, data_world, old_bs)
    )


def _extended(
    service: OrderSettings,
    epoch: int,
    history: Elastic,
    batches: dict[int, int],
    data_world: int,
    batch_size: int,
) -> Elastic:
    """The elastic history plus the segment the saved ranks consumed (when they consumed any)."""
    try:
        left = len(
            remaining_positions(
                service.epoch_samples(epoch), history=history, drop_last=service.batching.drop_last
            )
        )
    except ValueError as exc:
        raise ResumeStateError(f"the elastic history does not fit this dataset: {exc}") from exc
    parts = split_sizes(left, world_size=data_world, drop_last=service.batching.drop_last)
    consumed = tuple(min(batches[d] * batch_size, parts[d]) for d in range(data_world))
    return (*history, (data_world, consumed)) if any(consumed) else history


def same_world(
    state: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    rank: int,
    world_size: int,
    replication: int,
    batch_size: int,
    allow_mismatch: Sequence[str] = (),
) -> bool:
    """Whether ``state`` is one state of this rank in the same world: same rank, world size,
    replication and batch size (unless ``batch_size`` may differ), no elastic history.

    Examples:
        >>> cfg = {"rank": 0, "world_size": 2, "batch_size": 4}
        >>> same_world({"config": cfg}, rank=0, world_size=2, replication=1, batch_size=4)
        True
        >>> same_world({"config": cfg}, rank=0, world_size=3, replication=1, batch_size=4)
        False
    """
    cfg = state.get("config") if isinstance(state, Mapping) else None
    return (
        isinstance(state, Mapping)
        and isinstance(cfg, Mapping)
        and "elastic" not in state
        and cfg.get("rank") == rank
        and cfg.get("world_size") == world_size
        and cfg.get("replication", 1) == replication
        and (cfg.get("batch_size") == batch_size or "batch_size" not in allow_mismatch)
    )


def carried_state(
    states: Mapping[str, Any] | Sequence[Mapping[str, Any]], point: ResumePoint
) -> Mapping[str, Any] | None:
    """The saved state whose per-rank fields (``counts``, ``skip``) still apply at ``point``: the
    one state whose plan goes on unchanged (lockstep, same world size); ``None`` when the rest of
    the epoch is re-split, and its counts start again.

    Raises:
        ResumeStateError: a re-split of a state part-way through a position batch (``skip``: rows
            of the filter's output already emitted by refill, which name no positions).
    """
    saved = [states] if isinstance(states, Mapping) else list(states)
    if len(saved) == 1 and point.elastic == norm_elastic(saved[0].get("elastic")):
        return saved[0]
    if any(int(st.get("skip", 0)) for st in saved):
        raise ResumeStateError(
            "a refill state part-way through a batch cannot be re-split elastically",
            hint="resume with the saved world size and batch size",
        )
    return None
