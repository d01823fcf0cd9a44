"""Weighted mixing of several sources with exact per-epoch proportions: :class:`Mix`.

``Mix([(src_a, 0.7), (src_b, 0.3)], epoch_size=N)`` is itself a
:class:`~datamill.core.source.Source` (its shards are the sources' shards one after the other, its
columns the union of theirs plus a ``source`` column naming each row's source, missing columns null)
that also carries its own epoch schedule. A :class:`~datamill.loader.service.BatchService` (so the
Loader, the torch adapter and a server) iterates :meth:`Mix.epoch_sequence` instead of a permutation
of the shards, so rank split, workers, resumption (plain and elastic) and replication work
unchanged.

The schedule is a pure function of ``(seed, epoch)`` and the sources' shard sizes:

1. **Quotas** (:func:`quotas`): source ``i`` gets ``n_i`` of the epoch's ``N`` samples, the
   largest-remainder rounding of ``N * w_i / sum(w)`` (exact rationals, ties to the earlier source),
   so ``sum(n_i) == N`` and ``|n_i - N p_i| < 1`` in every epoch, never a sampled count.
   ``stopping="first_exhausted"`` takes the largest ``N`` for which no quota exceeds its source's
   size; ``"all_exhausted"`` the smallest ``N`` for which every quota covers its source.
2. **Which samples**: ``n_i = q * size_i + r``: ``q`` whole passes over source ``i`` plus the first
   ``r`` samples of one more pass, each pass the shard-aware order
   (:func:`~datamill.loader.order.global_order`) of that source under its own key. Within an epoch
   no sample of a source repeats until every one of its samples has been used (each is used ``q``
   or ``q + 1`` times); reading stays local to a window of shards per source.
3. **Interleaving**: sample ``j`` of source ``i`` gets the key ``(j + u_i) / n_i`` (``u_i`` drawn
   per epoch) and the epoch is the stable sort by key: every stretch of the epoch holds each source
   in about its proportion, not just the whole epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.checks import check_int
from datamill.core.errors import ConfigError, SchemaError
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.rng import rng_for
from datamill.core.source import Source, check_read_args
from datamill.loader.mixspec import MixSpec, Stopping, quotas
from datamill.loader.order import global_order
from datamill.loader.schedule import Schedule

__all__ = ["Mix", "quotas"]


def _check_quotas(names: list[str], quotas: list[int], totals: list[int]) -> None:
    empty = [names[i] for i, q in enumerate(quotas) if q and not totals[i]]
    if empty:
        raise ConfigError(f"source(s) {empty} are empty but have a positive quota")


def _mixed_columns(sources: list[Source], source_column: str) -> list[str]:
    """The union of the sources' columns (first seen first), then ``source_column``."""
    cols: list[str] = []
    for s in sources:
        if source_column in s.columns:
            raise SchemaError(
                f"a mixed source already has the column {source_column!r}; pick another "
                "source_column",
                column=source_column,
            )
        cols += [c for c in s.columns if c not in cols]
    return [*cols, source_column]


class Mix:
    """Several sources mixed with exact per-epoch proportions; a Source with its own epoch schedule.

    Args:
        sources: ``[(source, weight), ...]`` (weights need not sum to 1; a weight may be 0).
        epoch_size: samples per epoch. Defaults to ``None`` (use ``stopping``).
        stopping: without ``epoch_size``: ``"first_exhausted"`` (the epoch ends when the first
            source has been used once, HF's default) or ``"all_exhausted"`` (when every source has
            been used at least once; smaller ones repeat). Defaults to ``"first_exhausted"``.
        names: a name per source, the values of the ``source`` column. Defaults to
            ``["source0", "source1", ...]``.
        source_column: the column naming each row's source. Defaults to ``"source"``.
        schedule: weights changing with the global step
            (:class:`~datamill.loader.schedule.Schedule`, naming the sources by ``names``); a Loader
            over the mix then yields language-model global steps (:mod:`datamill.loader.lm`).
            Defaults to ``None`` (``weights``, exact per epoch).

    Raises:
        ConfigError: no sources, a negative or all-zero weight, both or neither of ``epoch_size``
            and ``stopping`` usable, an empty source with a positive quota, duplicate names.
        SchemaError: a column whose types cannot be unified across sources, or a source already
            having the ``source_column``.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> a = TableSource(pa.table({"x": list(range(10))}), shard_size=4)
        >>> b = TableSource(pa.table({"x": [100, 101, 102], "y": ["p", "q", "r"]}))
        >>> mix = Mix([(a, 0.7), (b, 0.3)], epoch_size=10, names=["a", "b"])
        >>> mix.columns, mix.quotas()
        (['x', 'y', 'source'], [7, 3])
        >>> from datamill.loader import Loader
        >>> rows = [
        ...     r for batch in Loader(mix, 5, seed=1, collate="arrow") for r in batch.to_pylist()
        ... ]
        >>> (
        ...     sorted(r["source"] for r in rows).count("b"),
        ...     [r for r in rows if r["source"] == "a"][0]["y"],
        ... )
        (3, None)
    """

    def __init__(
        self,
        sources: Sequence[tuple[Source, float]],
        /,
        *,
        epoch_size: int | None = None,
        stopping: Stopping | None = None,
        names: Sequence[str] | None = None,
        source_column: str = "source",
        schedule: Schedule | None = None,
    ) -> None:
        items = list(sources)
        if not items or any(not isinstance(it, tuple) or len(it) != 2 for it in items):
            raise ConfigError("Mix needs a non-empty list of (source, weight) pairs")
        self.spec = MixSpec.declare(
            [w for _, w in items],
            epoch_size=epoch_size,
            stopping=stopping,
            names=names,
            source_column=source_column,
        )
        self.sources: list[Source] = [s for s, _ in items]
        self.weights: list[float] = list(self.spec.weights)
        self.names = list(self.spec.names)
        self.source_column = source_column
        if schedule is not None and not isinstance(schedule, Schedule):
            raise ConfigError(f"schedule must be a Schedule, got {type(schedule).__name__}")
        self.schedule = schedule.reorder(self.names) if schedule is not None else None
        self._sizes = [np.asarray(s.shard_sizes(), dtype=np.int64) for s in self.sources]
        self._totals = [int(s.sum()) for s in self._sizes]
        self.stopping: Stopping | None = self.spec.stopping
        if self.stopping is not None:
            epoch_size = self._stopping_size(self.stopping)
        self.epoch_size = check_int(epoch_size, name="epoch_size", low=0)
        self._quotas = quotas(self.weights, total=self.epoch_size)
        _check_quotas(self.names, self._quotas, self._totals)
        self._offsets = np.concatenate([[0], np.cumsum(self._totals)]).astype(np.int64)
        self._shard_base = np.concatenate([[0], np.cumsum([len(s) for s in self._sizes])]).astype(
            np.int64
        )
        self._columns = _mixed_columns(self.sources, source_column)
        self._schema: pa.Schema | None = None
        self._fingerprint: str | None = None

    def _stopping_size(self, stopping: Stopping) -> int:
        fr = [Fraction(w) for w in self.weights]
        total = sum(fr)
        live = [i for i, w in enumerate(fr) if w > 0]
        sizes = [Fraction(self._totals[i]) * total / fr[i] for i in live]
        if stopping == "first_exhausted":
            return int(min(sizes))
        return max(-(-s.numerator // s.denominator) for s in sizes)

    # ----------------------------------------------------------------- the schedule
    def quotas(self) -> list[int]:
        """Samples each source contributes per epoch (the same every epoch)."""
        return list(self._quotas)

    def epoch_length(self) -> int:
        """Samples per epoch."""
        return self.epoch_size

    def epoch_sequence(
        self, *, seed: int, epoch: int, shuffle: bool = True, window: int | None = None
    ) -> NDArray[np.int64]:
        """The epoch's samples as indices into the concatenated sources (pure in ``(seed, epoch)``).

        Examples:
            >>> from datamill.core.source import TableSource
            >>> a, b = (
            ...     TableSource(pa.table({"x": [0, 1, 2, 3]})),
            ...     TableSource(pa.table({"x": [4, 5]})),
            ... )
            >>> Mix([(a, 1), (b, 1)], epoch_size=6).epoch_sequence(
            ...     seed=0, epoch=0, shuffle=False
            ... ).tolist()
            [0, 4, 1, 5, 2, 4]
        """
        parts, keys = [], []
        offsets = (
            rng_for(seed, "mix.interleave", epoch).random(len(self.sources))
            if shuffle
            else np.full(len(self.sources), 0.5)
        )
        for i, quota in enumerate(self._quotas):
            if not quota:
                continue
            size = self._totals[i]
            passes, rest = divmod(quota, size)
            sub_seed = int(rng_for(seed, "mix.source", i).integers(2**62))
            chunks = [
                global_order(
                    self._sizes[i],
                    seed=sub_seed,
                    epoch=epoch * (passes + 1) + p,
                    shuffle=shuffle,
                    window=window,
                )[: size if p < passes else rest]
                for p in range(passes + 1)
            ]
            parts.append(np.concatenate(chunks) + self._offsets[i])
            keys.append((np.arange(quota, dtype=np.float64) + offsets[i]) / quota)
        if not parts:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate(parts)[np.argsort(np.concatenate(keys), kind="stable")].astype(
            np.int64
        )

    # ----------------------------------------------------------------- the Source protocol
    @property
    def columns(self) -> list[str]:
        """The union of the sources' columns (first seen first), then ``source_column``."""
        return list(self._columns)

    @property
    def num_shards(self) -> int:
        """Every source's shards."""
        return int(self._shard_base[-1])

    def shard_sizes(self) -> NDArray[np.int64]:
        """The sources' shard sizes, one source after the other."""
        return (
            np.concatenate(self._sizes).astype(np.int64)
            if self._sizes
            else np.zeros(0, dtype=np.int64)
        )

    def _source_schema(self, i: int) -> pa.Schema:
        schema = getattr(self.sources[i], "schema", None)
        if isinstance(schema, pa.Schema):
            return schema
        sizes = self._sizes[i]
        k = int(np.argmax(sizes > 0)) if (sizes > 0).any() else 0
        if not len(sizes):
            return pa.schema([])
        return self.sources[i].read_shard(k).slice(0, 0).schema

    def schema(self) -> pa.Schema:
        """The unified schema (read from one shard per source, once); every field nullable."""
        if self._schema is None:
            fields: dict[str, pa.DataType] = {}
            for i in range(len(self.sources)):
                for f in self._source_schema(i):
                    if f.name in fields and fields[f.name] != f.type:
                        try:
                            merged = pa.unify_schemas(
                                [
                                    pa.schema([pa.field(f.name, fields[f.name])]),
                                    pa.schema([pa.field(f.name, f.type)]),
                                ],
                                promote_options="permissive",
                            )
                        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                            raise SchemaError(
                                f"column {f.name!r} is {fields[f.name]} in one source and {f.type} "
                                f"in {self.names[i]!r}; they cannot be unified",
                                column=f.name,
                            ) from exc
                        fields[f.name] = merged.field(f.name).type
                    else:
                        fields.setdefault(f.name, f.type)
            fields[self.source_column] = pa.string()
            self._schema = pa.schema([pa.field(c, fields[c]) for c in self._columns])
        return self._schema

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        """Shard ``index`` (of source ``i``) with the union's columns: null where source ``i`` lacks
        one."""
        cols = check_read_args(self, index, columns)
        i = int(np.searchsorted(self._shard_base, int(index), side="right") - 1)
        src, local = self.sources[i], int(index) - int(self._shard_base[i])
        own = [c for c in cols if c in src.columns]
        table = src.read_shard(local, columns=own)
        n, schema = table.num_rows, self.schema()
        arrays: list[Any] = []
        for c in cols:
            typ = schema.field(c).type
            if c == self.source_column:
                arrays.append(pa.repeat(pa.scalar(self.names[i], pa.string()), n))
            elif c in own:
                col = table.column(c)
                arrays.append(col if col.type == typ else col.cast(typ))
            else:
                arrays.append(pa.nulls(n, typ))
        return pa.Table.from_arrays(arrays, schema=pa.schema([schema.field(c) for c in cols]))

    def fingerprint(self) -> str:
        """Hash of the sources' fingerprints, weights, names and epoch size."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint_obj(
                [
                    "datamill.loader.Mix@1",
                    [s.fingerprint() for s in self.sources],
                    [str(Fraction(w)) for w in self.weights],
                    self.names,
                    self.epoch_size,
                    self.source_column,
                ]
            )
        return self._fingerprint
