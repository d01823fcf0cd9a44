"""Train/validation/test split: 0 train, 1 validation, 2 test (int8), Ludwig's split types.

Every type is decomposable into blocks. A row's split depends on its own global row index or its
own value, plus (for three types) a small :class:`SplitState` fitted once over the whole dataset in
a cheap first pass (:func:`fit_split`: the row count, or one column):

* ``random`` (Ludwig's default, also used when the config has no ``split``): row ``i`` draws
  ``u_i`` in ``[0, 1)`` from a counter-based generator (a SplitMix64 hash of ``(key, i)``, ``key``
  from the seed through ``SeedSequence``). The sizes are **exact**, as Ludwig's: with ``n`` rows,
  ``ceil(p_train * n)`` train rows and ``int(p_val * n)`` validation rows (Ludwig's
  ``_split_divisions_with_min_rows``, including its rule that a nonempty validation or test split
  gets at least 3 rows). The first pass ranks the ``u_i``: the state holds the two cut values (the
  ``u`` of the first validation and of the first test row in ascending ``u`` order), so a block
  compares its rows' ``u_i`` with them. Memory of the first pass: 8 bytes a row.
* ``fixed``: from the value of ``column`` (default ``split``): 0/1/2 or train/validation/test.
* ``stratify``: ``random`` within each distinct value of ``column``, with Ludwig 0.17's sizes per
  value (:func:`stratify_sizes`: two rounds of scikit-learn's ``train_test_split`` rule, train
  against the rest, then validation against test); the state holds the cut values per value.
* ``hash``: Ludwig's own hash of the value of ``column`` (MD5 of its JSON, then CRC-32, see
  :mod:`datamill.preprocessing.ludwig_rows`), compared with the cumulative probabilities: the same
  rows as Ludwig, a row keeps its split when rows are added, and no state is needed. Sizes are
  proportional in expectation, not exact.
* ``datetime``: the rows sorted by the date in ``column`` (ties by row index): the first
  ``ceil(p_train * n)`` train, the next ``int(p_val * n)`` validation, the rest test (the state
  holds the two cut points as ``(time, row)``; missing or unparsable dates sort last).

The exact sizes are over the input rows; ``drop_row`` and sampling then remove rows from each split.
Ludwig shuffles the rows with pandas; datamill draws its own uniforms, so the *same* sizes hold
but not the same rows (``hash`` and the sample, :func:`sample_mask`, give Ludwig's rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.errors import DataFileError
from datamill.core.rng import stream_key
from datamill.preprocessing.config import SplitConfig

__all__ = [
    "MIN_SPLIT_ROWS",
    "SAMPLE_STREAM",
    "SPLIT_NAMES",
    "SplitState",
    "assign_split",
    "divisions",
    "fit_split",
    "fixed_split",
    "hash_uniform",
    "random_split",
    "sample_cut",
    "sample_mask",
    "stratify_sizes",
    "uniform_at",
]

SPLIT_NAMES = ("train", "validation", "test")
#: a nonempty validation or test split gets at least this many rows (Ludwig's
# MIN_DATASET_SPLIT_ROWS)
MIN_SPLIT_ROWS = 3
_ALIASES = {
    "0": 0,
    "train": 0,
    "training": 0,
    "1": 1,
    "validation": 1,
    "val": 1,
    "valid": 1,
    "dev": 1,
    "2": 2,
    "test": 2,
    "testing": 2,
}
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)
_LAST = np.iinfo(np.int64).max  # the time of a missing date (sorts last)


@dataclass(frozen=True)
class SplitState:
    """What a split fitted over the whole dataset (see the module doc); empty for fixed/hash."""

    num_rows: int = 0
    #: random: the ``u`` cut values (validation, test)
    cuts: tuple[float, float] | None = None
    #: stratify: value → its cut values
    strata: dict[str, tuple[float, float]] | None = None
    #: datetime: the first validation and the first test row as (time in ns, global row)
    time_cuts: tuple[tuple[int, int], tuple[int, int]] | None = None


def _key(seed: int, stream: str = "preprocess.split") -> np.uint64:
    words = np.random.SeedSequence(
        [int(seed) & 0xFFFFFFFFFFFFFFFF, stream_key(stream)]
    ).generate_state(2, np.uint64)
    return np.uint64(words[0] ^ words[1])


def _mix(z: NDArray[np.uint64]) -> NDArray[np.float64]:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    out: NDArray[np.float64] = (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return out


def uniform_at(
    seed: int, lo: int, hi: int, *, stream: str = "preprocess.split"
) -> NDArray[np.float64]:
    """Uniform numbers in ``[0, 1)`` for the global row indices ``lo .. hi - 1`` (a pure function of
    them).

    Examples:
        >>> bool((uniform_at(7, 0, 10)[4:6] == uniform_at(7, 4, 6)).all())
        True
    """
    with np.errstate(over="ignore"):
        z = (
            _key(seed, stream) + (np.arange(lo, hi, dtype=np.uint64) + np.uint64(1)) * _GOLDEN
        )  # SplitMix64
    return _mix(z)


def divisions(n: int, probabilities: tuple[float, float, float]) -> tuple[int, int]:
    """Ludwig's exact split sizes as division points ``(d1, d2)``: train ``[0, d1)``, validation
    ``[d1, d2)``.

    Examples:
        >>> divisions(1460, (0.7, 0.1, 0.2)), divisions(10, (0.7, 0.1, 0.2))
        ((1022, 1168), (4, 7))
    """
    d1 = math.ceil(probabilities[0] * n)
    d2 = d1 + int(probabilities[1] * n) if probabilities[2] > 0 else n
    d1, d2 = min(d1, n), min(d2, n)
    sizes = (d1, d2 - d1, n - d2)
    if 0 < sizes[2] < MIN_SPLIT_ROWS and sizes[0] > 0:
        shift = min(MIN_SPLIT_ROWS - sizes[2], sizes[0])
        d1, d2 = d1 - shift, d2 - shift
    if 0 < sizes[1] < MIN_SPLIT_ROWS and sizes[0] > 0:
        d1 -= min(MIN_SPLIT_ROWS - sizes[1], d1)
    return d1, d2


def _approximate_mode(
    class_counts: NDArray[np.int64], n_draws: int, rng: np.random.RandomState
) -> NDArray[np.int64]:
    """scikit-learn's ``_approximate_mode``: ``n_draws`` shared out in proportion, ties broken by
    ``rng``."""
    continuous = (
        class_counts / class_counts.sum() * n_draws
    )  # the same float operations, in the same order
    floored = np.floor(continuous)
    need_to_add = int(n_draws - floored.sum())
    if need_to_add > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[
            ::-1
        ]:  # per distinct remainder (a handful of classes)
            (inds,) = np.where(remainder == value)
            add_now = min(len(inds), need_to_add)
            inds = rng.choice(inds, size=add_now, replace=False)
            floored[inds] += 1
            need_to_add -= add_now
            if need_to_add == 0:
                break
    out: NDArray[np.int64] = floored.astype(np.int64)
    return out


def _stratified_round(
    counts: NDArray[np.int64], test_size: float, seed: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """One ``train_test_split(stratify=...)`` of Ludwig's ``_safe_stratify``: per class (kept,
    rest).

    A class of one row stays on the kept side (Ludwig moves it there before splitting); the rest is
    scikit-learn's: ``n_test = ceil(test_size * n)``, ``n_train = n - n_test``, classes shared out
    by ``_approximate_mode`` with ``RandomState(seed)``. Where scikit-learn would refuse (fewer rows
    than classes on one side, ``test_size`` 0 or 1), the same rule is applied without refusing.
    """
    kept = np.where(counts == 1, counts, 0).astype(np.int64)
    rest = np.zeros_like(counts)
    live = counts >= 2
    c = counts[live]
    n = int(c.sum())
    if n == 0:
        return kept, rest
    n_test = min(n, math.ceil(test_size * n))
    rng = np.random.RandomState(
        seed
    )  # scikit-learn's legacy generator, seeded: a pure function of the seed
    n_i = _approximate_mode(c, n - n_test, rng)
    t_i = _approximate_mode(c - n_i, n_test, rng)
    kept[live], rest[live] = n_i, t_i
    return kept, rest


def stratify_sizes(
    counts: NDArray[np.int64] | list[int], probabilities: tuple[float, float, float], seed: int
) -> NDArray[np.int64]:
    """Ludwig 0.17's stratified split sizes: ``(classes, 3)`` rows of (train, validation, test) per
    class.

    ``counts``: rows per class, the classes in scikit-learn's order (values sorted as strings).
    Ludwig's ``stratify_split_dataframe`` splits twice with scikit-learn's ``train_test_split``
    (test size rounded up): train against the rest (``test_size = 1 - p_train``), then validation
    against test (``test_size = p_test / (p_val + p_test)``), both with ``random_state=seed``.

    Examples:
        >>> stratify_sizes([59, 71, 48], (0.6, 0.2, 0.2), 42).sum(axis=0).tolist()
        [106, 36, 36]
    """
    c = np.asarray(counts, np.int64)
    p_train, p_val, p_test = probabilities
    out = np.zeros((len(c), 3), np.int64)
    if p_val + p_test <= 0:
        out[:, 0] = c
        return out
    train, rest = _stratified_round(c, 1.0 - p_train, seed)
    relative_test = p_test / (p_val + p_test)
    val, test = _stratified_round(rest, relative_test, seed)
    out[:, 0], out[:, 1], out[:, 2] = train, val, test
    return out


def _cut_values(
    u: NDArray[np.float64],
    probabilities: tuple[float, float, float],
    cut_at: tuple[int, int] | None = None,
) -> tuple[float, float]:
    d1, d2 = divisions(len(u), probabilities) if cut_at is None else cut_at
    s = np.sort(u)
    return (float(s[d1]) if d1 < len(s) else math.inf, float(s[d2]) if d2 < len(s) else math.inf)


@lru_cache(maxsize=8)
def _random_cuts(
    seed: int, n: int, probabilities: tuple[float, float, float]
) -> tuple[float, float]:
    return _cut_values(uniform_at(seed, 0, n), probabilities)


SAMPLE_STREAM = "preprocess.sample"


def sample_cut(seed: int, num_rows: int, size: int) -> float:
    """The cut keeping exactly ``size`` of ``num_rows`` rows: row ``i`` is kept when its rank in
    pandas' sampling permutation is below it (Ludwig's rows, see :func:`sample_mask`).

    Examples:
        >>> cut = sample_cut(3, 100, 30)
        >>> int(sample_mask(3, 0, 100, cut, num_rows=100).sum())
        30
    """
    del seed  # the rows depend on it through sample_mask; the cut is the count
    if size >= num_rows:
        return math.inf
    return float(size)


def sample_mask(seed: int, lo: int, hi: int, cut: float, *, num_rows: int) -> NDArray[np.bool_]:
    """Which of the global rows ``lo .. hi - 1`` (of ``num_rows``) the sample keeps: Ludwig's rows,
    those ``df.sample(frac, random_state=seed)`` keeps (see :func:`sample_cut`); every row when
    ``cut`` is infinite."""
    from datamill.preprocessing.ludwig_rows import sample_ranks

    if cut == math.inf:
        return np.ones(hi - lo, dtype=bool)

    out: NDArray[np.bool_] = sample_ranks(seed, num_rows)[lo:hi] < cut
    return out


def hash_uniform(values: pa.Array | pa.ChunkedArray) -> NDArray[np.float64]:
    """A stable uniform in ``[0, 1)`` per value (FNV-1a of its UTF-8 bytes, then SplitMix64; null =
    ``""``).

    Examples:
        >>> u = hash_uniform(pa.array(["a", "b", "a", None]))
        >>> bool(u[0] == u[2]), bool(u[0] != u[1]), bool(0 <= u.min() and u.max() < 1)
        (True, True, True)
    """
    strings = pc.fill_null(pc.cast(values, pa.string()), "")
    arr = strings.combine_chunks() if isinstance(strings, pa.ChunkedArray) else strings
    arr = pa.concat_arrays([arr]) if arr.offset else arr  # offsets start at 0
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=len(arr) + 1).astype(np.int64)
    data = (
        np.frombuffer(arr.buffers()[2], dtype=np.uint8)
        if arr.buffers()[2] is not None
        else np.zeros(0, np.uint8)
    )
    lengths = np.diff(offsets)
    h = np.full(len(arr), _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(int(lengths.max()) if len(lengths) else 0):  # one pass per byte position
            live = np.flatnonzero(lengths > j)
            h[live] = (h[live] ^ data[offsets[live] + j].astype(np.uint64)) * _FNV_PRIME
    return _mix(h)


def _datetimes(column: pa.Array | pa.ChunkedArray, fmt: str | None) -> NDArray[np.int64]:
    from datamill.preprocessing.dates import parse_datetimes

    t = parse_datetimes(column, fmt, errors="null")
    return np.asarray(
        pc.fill_null(pc.cast(t, pa.int64()), _LAST).to_numpy(zero_copy_only=False), np.int64
    )


def fit_split(
    cfg: SplitConfig,
    *,
    seed: int,
    num_rows: int,
    column: pa.Array | pa.ChunkedArray | None = None,
    keep: NDArray[np.bool_] | None = None,
) -> SplitState:
    """The split's first pass over the whole dataset (``column``: the whole split column, when it
    has one).

    ``keep``: the rows a sample keeps (``sample_ratio``/``sample_size``); the exact sizes are then
    those of the kept rows.

    Examples:
        >>> st = fit_split(SplitConfig(), seed=42, num_rows=1460)
        >>> np.bincount(assign_split(SplitConfig(), st, seed=42, lo=0, hi=1460)).tolist()
        [1022, 146, 292]
    """
    if cfg.type == "random":
        if keep is not None:
            return SplitState(
                num_rows, cuts=_cut_values(uniform_at(seed, 0, num_rows)[keep], cfg.probabilities)
            )
        return SplitState(num_rows, cuts=_random_cuts(seed, num_rows, cfg.probabilities))
    if cfg.type == "stratify":
        assert column is not None
        codes = (
            pc.dictionary_encode(pc.fill_null(pc.cast(column, pa.string()), "")).combine_chunks()
            if isinstance(column, pa.ChunkedArray)
            else pc.dictionary_encode(pc.fill_null(pc.cast(column, pa.string()), ""))
        )
        idx = np.asarray(codes.indices.to_numpy(zero_copy_only=False), np.int64)
        u = uniform_at(seed, 0, num_rows)
        kept = np.ones(num_rows, bool) if keep is None else keep
        values = [str(v) for v in codes.dictionary.to_pylist()]
        classes = sorted(
            range(len(values)), key=values.__getitem__
        )  # scikit-learn's class order (np.unique)
        counts = np.bincount(idx[kept], minlength=len(values))
        sizes = stratify_sizes(counts[classes], cfg.probabilities, seed)
        strata = {}
        for (tr, va, _), k in zip(sizes.tolist(), classes):
            strata[values[k]] = _cut_values(u[(idx == k) & kept], cfg.probabilities, (tr, tr + va))
        return SplitState(num_rows, strata=strata)
    if cfg.type == "datetime":
        assert column is not None
        t = _datetimes(column, cfg.datetime_format)
        order = np.lexsort((np.arange(num_rows), t))
        if keep is not None:
            order = order[keep[order]]
        d1, d2 = divisions(len(order), cfg.probabilities)

        def at(d: int) -> tuple[int, int]:
            return (int(t[order[d]]), int(order[d])) if d < len(order) else (_LAST, num_rows)

        return SplitState(num_rows, time_cuts=(at(d1), at(d2)))
    return SplitState(num_rows)


def assign_split(
    cfg: SplitConfig,
    state: SplitState,
    *,
    seed: int,
    lo: int,
    hi: int,
    column: pa.Array | pa.ChunkedArray | None = None,
    path: str | None = None,
    line_offset: int | None = None,
) -> NDArray[np.int8]:
    """The split of the global rows ``lo .. hi - 1`` (``column``: their split column values, when it
    has one).

    Raises:
        DataFileError: a ``fixed`` split value that is not 0/1/2 or a split name.
    """
    if cfg.type == "fixed":
        assert column is not None
        return fixed_split(column, cfg, path=path, line_offset=line_offset, row_offset=lo)
    if cfg.type == "hash":
        assert column is not None
        from datamill.preprocessing.ludwig_rows import hash_split

        # line_offset 2: read from CSV/TSV as strings, typed as pandas would type them
        return hash_split(column, cfg.probabilities, csv=line_offset == 2)
    if cfg.type == "datetime":
        assert column is not None and state.time_cuts is not None
        t, rows = _datetimes(column, cfg.datetime_format), np.arange(lo, hi)
        out = np.zeros(hi - lo, np.int8)
        for ct, cr in state.time_cuts:
            out += ((t > ct) | ((t == ct) & (rows >= cr))).astype(np.int8)
        return out
    u = uniform_at(seed, lo, hi)
    if cfg.type == "stratify":
        assert column is not None and state.strata is not None
        keys = list(state.strata)
        idx = pc.index_in(
            pc.fill_null(pc.cast(column, pa.string()), ""), value_set=pa.array(keys, pa.string())
        )
        cuts = np.array([state.strata[k] for k in keys] or [(math.inf, math.inf)], np.float64)
        at = np.asarray(pc.fill_null(idx, 0).to_numpy(zero_copy_only=False), np.int64)
        strat: NDArray[np.int8] = (u >= cuts[at, 0]).astype(np.int8) + (u >= cuts[at, 1]).astype(
            np.int8
        )
        return strat
    assert state.cuts is not None
    return ((u >= state.cuts[0]).astype(np.int8) + (u >= state.cuts[1]).astype(np.int8)).astype(
        np.int8
    )


def random_split(
    cfg: SplitConfig, *, seed: int, lo: int, hi: int, num_rows: int
) -> NDArray[np.int8]:
    """The random split (exact sizes over ``num_rows``) of the global rows ``lo .. hi - 1``.

    Examples:
        >>> cfg = SplitConfig(probabilities=(0.5, 0.25, 0.25))
        >>> whole = random_split(cfg, seed=1, lo=0, hi=1000, num_rows=1000)
        >>> bool(
        ...     (
        ...         np.concatenate(
        ...             [
        ...                 random_split(cfg, seed=1, lo=0, hi=300, num_rows=1000),
        ...                 random_split(cfg, seed=1, lo=300, hi=1000, num_rows=1000),
        ...             ]
        ...         )
        ...         == whole
        ...     ).all()
        ... )
        True
        >>> np.bincount(whole).tolist()
        [500, 250, 250]
    """
    state = fit_split(cfg, seed=seed, num_rows=num_rows)
    return assign_split(cfg, state, seed=seed, lo=lo, hi=hi)


def fixed_split(
    column: pa.ChunkedArray | pa.Array,
    cfg: SplitConfig,
    *,
    path: str | None = None,
    line_offset: int | None = None,
    row_offset: int = 0,
) -> NDArray[np.int8]:
    """The split of each row from its value: 0/1/2 or train/validation/test (also
    val/valid/dev/test).

    Raises:
        DataFileError: another value (file, line/row and column named).

    Examples:
        >>> fixed_split(
        ...     pa.array(["train", " Test", "1"]), SplitConfig(type="fixed", column="s")
        ... ).tolist()
        [0, 2, 1]
    """
    values = pc.utf8_lower(pc.utf8_trim_whitespace(pc.cast(column, pa.string())))
    keys = pa.array(list(_ALIASES), pa.string())
    idx = pc.index_in(values, value_set=keys)
    if idx.null_count:
        bad = int(np.flatnonzero(pc.is_null(idx).to_numpy(zero_copy_only=False))[0])
        row = row_offset + bad
        line, at = (line_offset + row, None) if line_offset is not None else (None, row)
        raise DataFileError(
            f"expected a split value (0/1/2 or train/validation/test), got {column[bad].as_py()!r}",
            path=path,
            column=cfg.split_column,
            line=line,
            row=at,
        )
    lut = np.array(list(_ALIASES.values()), dtype=np.int8)
    out: NDArray[np.int8] = lut[np.asarray(pc.fill_null(idx, 0).to_numpy(zero_copy_only=False))]
    return out
