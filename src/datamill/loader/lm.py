"""Language-model batches: packed, mixed by a schedule, balanced over ranks, resumable anywhere.

``Loader(source, batch_size, packing=Packing(...), balance="tokens", ...)`` (or a
:class:`~datamill.loader.mix.Mix` with a ``schedule=``) returns an :class:`LMLoader`. Its unit of
progress is the **global step**: ``world_size * batch_size`` units (packed sequences, or documents
without packing), whose content is a pure function of ``(seed, settings, state)`` where the state
is a handful of integers, the same on every rank:

1. **Quotas** (:meth:`~datamill.loader.schedule.Schedule.quotas`): how many units each source gives
   this step, from the schedule and the units each source gave so far (``taken``).
2. **Units**: each source's stream (:class:`~datamill.loader.lm_stream.SourceStream`) hands out its
   next units from its position ``(epoch, window, offset)``.
3. **Global order**: the units, source after source, permuted by ``(seed, step)``: the global
   batch, whatever the world size.
4. **Deal** (:func:`~datamill.loader.balance.deal`): each rank gets ``batch_size`` units, by cost
   (``balance=``) or contiguously; a rank gathers only its own units' tokens.

So a state saved with ``N`` ranks resumes with ``M`` (``batch_size * world_size`` kept): the global
batches from the next step on are the same units in the same global order; only the deal differs.
Each row carries ``global_index`` (its position in the global batch) and ``source``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from datamill.core.checks import WORLD_SIZE, check_int, check_rank
from datamill.core.errors import ConfigError, ResumeStateError
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.parallel import ordered_map
from datamill.core.ragged import ranges
from datamill.core.rng import rng_for
from datamill.core.source import Source
from datamill.core.state import StateSpec, check_resume_compat, validate_state
from datamill.loader.balance import Balance, cost_function, deal, unit_costs
from datamill.loader.collate import to_torch
from datamill.loader.lm_stream import Piece, Position, SourceStream
from datamill.loader.options import Batching, Workers
from datamill.loader.packing import Packing, collate_segments
from datamill.loader.schedule import Schedule, wants_lm

__all__ = ["LM_RECORD_FORMAT", "LM_STATE", "LM_STATE_FORMAT", "LMLoader", "StepPlan", "wants_lm"]

I64 = NDArray[np.int64]
LM_STATE_FORMAT = "datamill.lm/1"
LM_RECORD_FORMAT = "datamill.lm-run/1"
LM_STATE = StateSpec(
    LM_STATE_FORMAT,
    fields=("format", "step", "seed", "dataset_fingerprint", "config", "sources", "taken"),
    counters=("step", "seed"),
    producer="Loader(..., packing=/balance=).state_dict()",
    format_hint="resume a language-model loader (packing=, balance= or a Mix schedule) from a "
    "state it saved",
)
GLOBAL_FIELDS = (
    "dataset_fingerprint",
    "seed",
    "global_batch",
    "packing",
    "balance",
    "schedule",
    "filter",
    "shuffle",
    "columns",
    "names",
)
"""What the global batches depend on: a resume with another world size needs only these to
match."""


def _name(fn: Any) -> str | None:
    if fn is None:
        return None
    if isinstance(fn, str):
        return fn
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


@dataclass
class StepPlan:
    """One global step: its units' segments in global order, each unit's rank, the state after."""

    step: int
    unit_source: I64
    unit_ptr: I64
    seg_piece: I64
    seg_doc: I64
    seg_start: I64
    seg_len: I64
    pieces: list[Piece]
    ranks: I64
    after: dict[str, Any] = field(default_factory=dict)

    def segments(self, unit: int) -> list[tuple[int, int, int, int, int]]:
        """``(source, epoch, sample, start, length)`` of each document piece of global unit
        ``unit`` (``sample``: the row's index in its source)."""
        out = []
        for s in range(int(self.unit_ptr[unit]), int(self.unit_ptr[unit + 1])):
            win = self.pieces[int(self.seg_piece[s])].window
            sample = int(win.samples[int(self.seg_doc[s])])
            src = int(self.unit_source[unit])
            out.append((src, win.key[0], sample, int(self.seg_start[s]), int(self.seg_len[s])))
        return out


class LMLoader:
    """Global steps of packed, mixed, balanced language-model batches; see the module docstring.

    Made by :class:`~datamill.loader.Loader` when it gets ``packing=`` or ``balance=`` or a
    :class:`~datamill.loader.mix.Mix` with a schedule; takes the Loader's arguments.

    Iterating yields this rank's batch of each global step, forever (stop at your step budget):
    a dict of ``input_ids``, ``labels``, ``position_ids``, ``segment_ids`` (``(batch_size,
    width)``; width ``seq_len`` with packing, else the longest document of the batch),
    ``global_index`` and ``source`` (``(batch_size,)``). ``collate="torch"`` gives tensors.
    ``Batching(filter=)`` receives each source's rows (a window of documents, its own columns);
    ``Workers(threads=)`` gathers batches in threads while the next steps are planned (never
    changing them); ``Batching(shuffle=False)`` keeps each step's units in order; ``drop_last``
    and the other ``Batching`` fields do not apply.

    Examples:
        >>> import pyarrow as pa
        >>> from datamill.core.source import TableSource
        >>> from datamill.loader import Loader, Packing
        >>> docs = pa.table({"tokens": [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]] * 4})
        >>> ld = Loader(TableSource(docs), 2, packing=Packing(seq_len=5, window=8), seed=1)
        >>> batch = next(iter(ld))
        >>> batch["input_ids"].shape, ld.state_dict()["step"]
        ((2, 5), 1)
    """

    def __init__(
        self,
        source: Source,
        batch_size: int,
        *,
        packing: Packing | None = None,
        balance: Balance | None = None,
        seed: int = 0,
        epoch: int = 0,
        columns: Sequence[str] | str | None = None,
        collate: str | Callable[[dict[str, Any]], Any] = "numpy",
        rank: int = 0,
        world_size: int = 1,
        batching: Batching | None = None,
        workers: Workers | None = None,
    ) -> None:
        self.batch_size = check_int(batch_size, name="batch_size", low=1, high=None)
        self.world_size = int(WORLD_SIZE(world_size))
        self.rank = check_rank(rank, world_size=self.world_size)
        self.seed = check_int(seed, name="seed", low=0, high=None)
        self.global_batch = self.batch_size * self.world_size
        if packing is not None and not isinstance(packing, Packing):
            raise ConfigError(
                f"packing must be a Packing, got {type(packing).__name__}",
                hint="from datamill.loader import Packing",
            )
        b = batching if batching is not None else Batching()
        self.packing, self.shuffle = packing, bool(b.shuffle)
        self.balance = balance
        self._cost = cost_function(balance) if balance is not None else None
        self.workers = workers if workers is not None else Workers()
        self.filter = b.filter
        if collate not in ("numpy", "torch") and not callable(collate):
            raise ConfigError(f"collate must be 'numpy', 'torch' or a callable, got {collate!r}")
        self.collate = collate
        cols = [columns] if isinstance(columns, str) else list(columns or [])
        self.columns = cols
        self._init_sources(source, epoch=check_int(epoch, name="epoch", low=0, high=None))

    def _init_sources(self, source: Source, *, epoch: int) -> None:
        subs = getattr(source, "sources", None)
        self.source = source
        if subs is not None and hasattr(source, "names"):  # a Mix
            self.names = list(source.names)
            sched = getattr(source, "schedule", None)
            if sched is None:
                sched = Schedule([(0, dict(zip(self.names, source.weights)))])  # type: ignore[attr-defined]
            self.schedule: Schedule = sched.reorder(self.names)
            self._scheduled = getattr(source, "schedule", None) is not None
            items = list(subs)
        else:
            self.names, items = ["source0"], [source]
            self.schedule, self._scheduled = Schedule([(0, {"source0": 1.0})]), False
        column = self.packing.column if self.packing is not None else "tokens"
        self.streams = [
            SourceStream(
                s,
                index=i,
                seed=self.seed,
                column=column,
                packing=self.packing,
                shuffle=self.shuffle,
                filter=self.filter,
                columns=self.columns,
            )
            for i, s in enumerate(items)
        ]
        self.step = 0
        self.positions = [Position(epoch, 0, 0) for _ in self.streams]
        self.taken = [0] * len(self.streams)
        self._fingerprint: str | None = None
        self._start = self._state_core()
        self._yielded: dict[str, Any] | None = None

    # ----------------------------------------------------------------- planning
    def plan_step(
        self, step: int, positions: Sequence[Sequence[int]], taken: Sequence[int]
    ) -> StepPlan:
        """Global step ``step`` from the streams' ``positions`` and the units ``taken`` so far."""
        quotas = self.schedule.quotas(step, taken, global_batch=self.global_batch)
        pos = [Position(*map(int, p)) for p in positions]
        pieces, seg_unit, seg_piece, segs, unit_src = self._take(pos, quotas)
        perm = (
            rng_for(self.seed, "lm.step", step).permutation(self.global_batch)
            if self.shuffle
            else np.arange(self.global_batch, dtype=np.int64)
        )
        where = np.empty_like(perm)
        where[perm] = np.arange(len(perm))  # unit u of the take -> global index where[u]
        g_unit = where[seg_unit]
        order = np.lexsort((np.arange(len(g_unit)), g_unit))  # by global unit, pieces in order
        counts = np.bincount(g_unit, minlength=self.global_batch).astype(np.int64)
        plan = StepPlan(
            step=step,
            unit_source=unit_src[perm],
            unit_ptr=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            seg_piece=seg_piece[order],
            seg_doc=segs[0][order],
            seg_start=segs[1][order],
            seg_len=segs[2][order],
            pieces=pieces,
            ranks=np.zeros(0, np.int64),
        )
        plan.ranks = self._deal(plan)
        taken_after = [t + q for t, q in zip(taken, quotas)]
        plan.after = self._state_core(step + 1, pos, taken_after)
        return plan

    def _take(
        self, pos: list[Position], quotas: Sequence[int]
    ) -> tuple[list[Piece], I64, I64, tuple[I64, I64, I64], I64]:
        """Each source's next units (``pos`` moves on): pieces, per segment its unit and piece,
        the segments ``(doc, start, length)``, and each unit's source."""
        pieces: list[Piece] = []
        seg_unit: list[I64] = []
        seg_piece: list[I64] = []
        base = 0
        for i, (stream, q) in enumerate(zip(self.streams, quotas)):
            got, pos[i] = stream.take(pos[i], q)
            for p in got:
                counts = np.diff(p.units.unit_ptr)
                seg_unit.append(
                    np.repeat(np.arange(len(counts), dtype=np.int64), counts) + p.base + base
                )
                seg_piece.append(np.full(len(p.units.seg_len), len(pieces), dtype=np.int64))
                pieces.append(p)
            base += q
        unit_src = np.repeat(np.arange(len(quotas), dtype=np.int64), quotas)
        if not pieces:
            empty = np.zeros(0, dtype=np.int64)
            return pieces, empty, empty, (empty, empty, empty), unit_src
        segs = tuple(
            np.concatenate([getattr(p.units, f) for p in pieces]).astype(np.int64)
            for f in ("seg_doc", "seg_start", "seg_len")
        )
        return pieces, np.concatenate(seg_unit), np.concatenate(seg_piece), segs, unit_src  # type: ignore[return-value]

    def _deal(self, plan: StepPlan) -> I64:
        if self._cost is None or self.world_size == 1:
            return np.arange(self.global_batch, dtype=np.int64) // self.batch_size
        costs = unit_costs(plan.unit_ptr, plan.seg_len, self._cost)
        return deal(costs, world_size=self.world_size, rng=rng_for(self.seed, "lm.deal", plan.step))

    def build(self, plan: StepPlan) -> Any:
        """This rank's batch of a planned step, collated (one gather per window used)."""
        mine = np.flatnonzero(plan.ranks == self.rank)
        counts = plan.unit_ptr[mine + 1] - plan.unit_ptr[mine]
        seg = ranges(plan.unit_ptr[mine], counts)
        seg_row = np.repeat(np.arange(len(mine), dtype=np.int64), counts)
        used, buf = np.unique(plan.seg_piece[seg], return_inverse=True)
        seg_doc, seg_start, seg_len = plan.seg_doc[seg], plan.seg_start[seg], plan.seg_len[seg]
        src = np.empty(len(seg), dtype=np.int64)
        wins = [plan.pieces[int(k)].window for k in used]
        for j, win in enumerate(wins):
            at = buf == j
            src[at] = win.doc_start[seg_doc[at]] + seg_start[at]
        p = self.packing
        width = p.seq_len if p is not None else int(np.bincount(seg_row, seg_len).max(initial=0))
        out = collate_segments(
            seg_row,
            src,
            seg_len,
            buf.astype(np.int64),
            [w.values for w in wins],
            rows=len(mine),
            width=width,
            mask_boundaries=p.mask_boundaries if p is not None else True,
            pad_id=p.pad_id if p is not None else 0,
        )
        out["global_index"] = mine.astype(np.int64)
        out["source"] = plan.unit_source[mine]
        if self.collate == "torch":
            return to_torch(out)
        return out if self.collate == "numpy" else self.collate(out)  # type: ignore[operator]

    def _plans(self) -> Iterator[StepPlan]:
        while True:
            plan = self.plan_step(self.step, self.positions, self.taken)
            after = plan.after
            self.step, self.taken = after["step"], list(after["taken"])
            self.positions = [Position(*p) for p in after["sources"]]
            yield plan

    def __iter__(self) -> Iterator[Any]:
        yielded = self._yielded or self._state_core()
        self._restore_core(yielded)  # planning ahead is undone: continue after the last yielded
        threads = int(self.workers.threads)
        built = ordered_map(lambda p: (p.after, self.build(p)), self._plans(), threads=threads)
        for after, batch in built:
            self._yielded = after
            yield batch

    def __len__(self) -> int:
        raise TypeError("a language-model loader yields global steps without end; count steps")

    # ----------------------------------------------------------------- state
    def dataset_fingerprint(self) -> str:
        """The source's fingerprint (computed once)."""
        if self._fingerprint is None:
            self._fingerprint = self.source.fingerprint()
        return self._fingerprint

    @property
    def config(self) -> dict[str, Any]:
        """The settings the global batches depend on, and this rank's place."""
        return {
            "balance": _name(self.balance),
            "batch_size": self.batch_size,
            "columns": self.columns,
            "filter": _name(self.filter),
            "global_batch": self.global_batch,
            "names": self.names,
            "packing": self.packing.as_dict() if self.packing is not None else None,
            "rank": self.rank,
            "schedule": self.schedule.fingerprint() if self._scheduled else None,
            "shuffle": self.shuffle,
            "world_size": self.world_size,
        }

    def _state_core(
        self,
        step: int | None = None,
        positions: Sequence[Sequence[int]] | None = None,
        taken: Sequence[int] | None = None,
    ) -> dict[str, Any]:
        return {
            "step": int(self.step if step is None else step),
            "sources": [
                list(map(int, p)) for p in (self.positions if positions is None else positions)
            ],
            "taken": [int(t) for t in (self.taken if taken is None else taken)],
        }

    def _restore_core(self, core: Mapping[str, Any]) -> None:
        self.step = int(core["step"])
        self.positions = [Position(*map(int, p)) for p in core["sources"]]
        self.taken = [int(t) for t in core["taken"]]

    def state_dict(self) -> dict[str, Any]:
        """The tiny JSON resume state after the last yielded step (the same on every rank, but
        ``config.rank``)."""
        return self.state_at(self._yielded or self._state_core())

    def core(self) -> dict[str, Any]:
        """Where the next step starts: ``{"step", "sources", "taken"}`` (after the last yielded)."""
        return dict(self._yielded or self._state_core())

    def advance(self, core: Mapping[str, Any], steps: int, /) -> dict[str, Any]:
        """The core ``steps`` global steps after ``core`` (planned, no tokens gathered)."""
        for _ in range(steps):
            core = self.plan_step(int(core["step"]), core["sources"], core["taken"]).after
        return dict(core)

    def state_at(self, core: Mapping[str, Any], /) -> dict[str, Any]:
        """The resume state of this loader at ``core`` (see :meth:`core`)."""
        cfg = self.config
        return {
            "format": LM_STATE_FORMAT,
            **core,
            "seed": self.seed,
            "dataset_fingerprint": self.dataset_fingerprint(),
            "config_fingerprint": fingerprint_obj({k: cfg[k] for k in GLOBAL_FIELDS if k in cfg}),
            "config": cfg,
        }

    @classmethod
    def from_state(cls, source: Source, state: Any, /, **kwargs: Any) -> LMLoader:
        """A loader resuming ``state`` (one rank's, or every rank's), its settings defaulting to
        the saved ones; ``world_size=`` alone keeps the global batch (``batch_size`` follows).
        ``allow_mismatch=`` goes to :meth:`load_state_dict`, the other keywords to the loader.

        Raises:
            ConfigError: the state names a balance callable or a filter (pass ``balance=`` or
                ``batching=Batching(filter=...)``), or the new world size does not divide the
                global batch.

        Examples:
            >>> import pyarrow as pa
            >>> from datamill.core.source import TableSource
            >>> src = TableSource(pa.table({"tokens": [[1, 2, 3], [4, 5], [6, 7, 8]] * 4}))
            >>> a = LMLoader(src, 4, packing=Packing(seq_len=4, window=6), world_size=2)
            >>> _ = next(iter(a))
            >>> b = LMLoader.from_state(src, a.state_dict(), world_size=4)
            >>> b.batch_size, b.state_dict()["step"]
            (2, 1)
        """
        first = state if isinstance(state, Mapping) else next(iter(state), None)
        st = validate_state(first, LM_STATE)
        opts = _saved_options(st["config"], seed=int(st["seed"]), given=kwargs)
        allow = kwargs.pop("allow_mismatch", ())
        opts.update({k: v for k, v in kwargs.items() if k != "batching"})  # batching: above
        loader = cls(source, opts.pop("batch_size"), **opts)
        loader.load_state_dict(state, allow_mismatch=allow)
        return loader

    def load_state_dict(
        self,
        state: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        allow_mismatch: Sequence[str] = (),
    ) -> None:
        """Continue after the step ``state`` was saved at (one rank's state, or every rank's, of any
        world size with the same global batch)."""
        states = [state] if isinstance(state, Mapping) else list(state)
        if not states:
            raise ResumeStateError("no resume state given")
        checked = [validate_state(s, LM_STATE) for s in states]
        cores = [self._core_of(s) for s in checked]
        if any(c != cores[0] for c in cores):
            raise ResumeStateError(
                "the ranks' states are at different steps; pass states saved at the same step",
                hint="save every rank's state_dict() after the same global step",
            )
        st = checked[0]
        current = {
            "seed": self.seed,
            "dataset_fingerprint": self.dataset_fingerprint(),
            **self.config,
        }
        saved = {
            "seed": st["seed"],
            "dataset_fingerprint": st["dataset_fingerprint"],
            **st["config"],
        }
        check_resume_compat(
            saved,
            current,
            fields=GLOBAL_FIELDS,
            allow_mismatch=allow_mismatch,
            what="this language-model loader",
            hint="resume with the same data, seed, packing, schedule, filter and global batch "
            f"(batch_size * world_size = {saved.get('global_batch')})",
        )
        self._restore_core(cores[0])
        self._yielded = cores[0]

    def _core_of(self, st: Mapping[str, Any]) -> dict[str, Any]:
        srcs, taken = st["sources"], st["taken"]
        ok = (
            isinstance(srcs, list)
            and len(srcs) == len(self.streams)
            and all(isinstance(p, list) and len(p) == 3 for p in srcs)
            and isinstance(taken, list)
            and len(taken) == len(self.streams)
        )
        if not ok:
            raise ResumeStateError(
                f"resume state fields 'sources' and 'taken' must list {len(self.streams)} "
                f"positions [epoch, window, offset] and counts, got {srcs!r}, {taken!r}"
            )
        for v in [*(x for p in srcs for x in p), *taken]:
            check_int(
                v,
                name="a position or count of the resume state",
                low=0,
                high=None,
                error=ResumeStateError,
            )
        return {
            "step": int(st["step"]),
            "sources": [list(map(int, p)) for p in srcs],
            "taken": [int(t) for t in taken],
        }

    def run_record(self, *, previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A tiny JSON record of the run (settings, schedule, where it started and is now) for
        :func:`datamill.loader.lm_trace.trace_lm`; ``previous`` (an earlier record of the run)
        keeps its start."""
        state = self.state_dict()
        start = dict(previous["start"]) if previous is not None else dict(self._start)
        return {
            "format": LM_RECORD_FORMAT,
            "seed": self.seed,
            "dataset_fingerprint": state["dataset_fingerprint"],
            "config": state["config"],
            "schedule": self.schedule.as_dict(),
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "start": start,
            "until": {k: state[k] for k in ("step", "sources", "taken")},
        }

    def stats(self) -> dict[str, Any]:
        """Where the loader is: step, each source's position and units taken."""
        return dict(self._yielded or self._state_core())


def _saved_options(
    cfg: Mapping[str, Any], *, seed: int, given: Mapping[str, Any]
) -> dict[str, Any]:
    """The LMLoader arguments a saved ``config`` names (checked against what the caller gives)."""
    world = int(given.get("world_size", cfg["world_size"]))
    if "batch_size" not in given and int(cfg["global_batch"]) % max(world, 1):
        raise ConfigError(
            f"world_size={world} does not divide the saved global batch {cfg['global_batch']}",
            hint="resume with a world size dividing batch_size * world_size of the saved run",
        )
    balance = cfg["balance"]
    if balance not in (None, "tokens", "tokens_squared") and "balance" not in given:
        raise ConfigError(
            f"the state was saved with the balance callable {balance!r}",
            hint="pass balance=<the same callable> to from_state",
        )
    if cfg["filter"] is not None and "batching" not in given:
        raise ConfigError(
            f"the state was saved with the filter {cfg['filter']!r}",
            hint="pass batching=Batching(filter=<the same function>) to from_state",
        )
    packing = cfg["packing"]
    return {
        "batch_size": int(cfg["global_batch"]) // max(world, 1),
        "seed": seed,
        # the saved order: a given Batching keeps its filter/transform, the shuffle is the run's
        "batching": dataclasses.replace(
            given.get("batching") or Batching(), shuffle=bool(cfg["shuffle"])
        ),
        "columns": list(cfg["columns"]) or None,
        "rank": int(cfg["rank"]) if int(cfg["rank"]) < world else 0,
        "world_size": world,
        "packing": Packing(**packing) if packing is not None else None,
        "balance": balance if balance in (None, "tokens", "tokens_squared") else None,
    }
