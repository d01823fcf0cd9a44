"""Class balancing of the training rows: Ludwig's ``oversample_minority`` /
``undersample_majority``.

As Ludwig's ``balance_data``: the target is the first output feature's column; its most frequent
value among the training rows is the majority class, its least frequent the minority class (ties:
the smallest value); only training rows change, validation and test rows stay as they are.

* ``oversample_minority: r``: the minority class gets ``round(r * majority)`` rows. Ludwig draws
  them with replacement; datamill repeats every minority row ``t // m`` times and gives one more
  copy to the ``t % m`` rows with the smallest seeded uniforms (the same count, each row used as
  evenly as possible). Copies sit next to their row, in file order.
* ``undersample_majority: r``: the majority class keeps ``int(minority / r)`` rows, those with the
  smallest seeded uniforms (Ludwig: ``df.sample`` without replacement).

Block-decomposable like the split: :func:`fit_balance` is a first pass over the target column and
the rows' split (the counts and two cut values), then :func:`balance_copies` gives any block's rows
their number of copies from their own global index and value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.preprocessing.split import uniform_at

__all__ = ["BALANCE_STREAM", "Balance", "balance_copies", "fit_balance"]

BALANCE_STREAM = "preprocess.balance"


@dataclass(frozen=True)
class Balance:
    """What balancing fitted: the two classes, the minority's base copies and the cut values."""

    column: str
    minority: str
    majority: str
    base_copies: int = 1
    #: minority training rows whose uniform is below this get one more copy
    extra_cut: float = -math.inf
    #: majority training rows whose uniform is below this are kept
    majority_cut: float = math.inf


def _strings(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    col = pc.cast(column, pa.string())
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return pc.utf8_trim_whitespace(col)


def fit_balance(
    column: pa.Array | pa.ChunkedArray,
    train: NDArray[np.bool_],
    *,
    name: str,
    seed: int,
    oversample_minority: float | None,
    undersample_majority: float | None,
) -> Balance | None:
    """The first pass: class counts among the training rows (``train``: per input row) →
    :class:`Balance`.

    None when the training rows hold fewer than two classes.

    Examples:
        >>> col = pa.array(["a"] * 8 + ["b"] * 2)
        >>> b = fit_balance(col, np.ones(10, bool), name="y", seed=0, oversample_minority=1.0,
        ...                 undersample_majority=None)
        >>> (
        ...     (b.minority, b.majority),
        ...     int(balance_copies(b, col, np.zeros(10, np.int8), seed=0, lo=0).sum()),
        ... )
        (('b', 'a'), 16)
    """
    values = _strings(column)
    valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), bool) & train
    vc = pc.value_counts(values.filter(pa.array(valid)))
    counts = dict(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist()))
    if len(counts) < 2:
        return None
    majority = min(counts, key=lambda v: (-counts[v], v))
    minority = min(counts, key=lambda v: (counts[v], v))
    n_maj, n_min = counts[majority], counts[minority]
    u = uniform_at(seed, 0, len(values), stream=BALANCE_STREAM)
    if oversample_minority:
        target = round(n_maj * oversample_minority)
        base, extra = divmod(target, n_min)
        mine = np.sort(
            u[
                valid
                & np.asarray(
                    pc.equal(values, minority).fill_null(False).to_numpy(zero_copy_only=False), bool
                )
            ]
        )
        return Balance(name, minority, majority, base, float(mine[extra]) if extra else -math.inf)
    if undersample_majority:
        keep = int(n_min / undersample_majority)
        theirs = np.sort(
            u[
                valid
                & np.asarray(
                    pc.equal(values, majority).fill_null(False).to_numpy(zero_copy_only=False), bool
                )
            ]
        )
        return Balance(
            name,
            minority,
            majority,
            majority_cut=float(theirs[keep]) if keep < len(theirs) else math.inf,
        )
    return None


def balance_copies(
    balance: Balance,
    column: pa.Array | pa.ChunkedArray,
    split: NDArray[np.int8] | None,
    *,
    seed: int,
    lo: int,
) -> NDArray[np.int64]:
    """How many times each row of a block (global rows ``lo ..``) appears after balancing (0:
    dropped)."""
    values = _strings(column)
    n = len(values)
    train = np.ones(n, bool) if split is None else split == 0
    u = uniform_at(seed, lo, lo + n, stream=BALANCE_STREAM)
    is_min = np.asarray(
        pc.equal(values, balance.minority).fill_null(False).to_numpy(zero_copy_only=False), bool
    )
    is_maj = np.asarray(
        pc.equal(values, balance.majority).fill_null(False).to_numpy(zero_copy_only=False), bool
    )
    copies = np.ones(n, np.int64)
    minority = train & is_min
    copies[minority] = balance.base_copies + (u[minority] < balance.extra_cut)
    majority = train & is_maj
    copies[majority] = (u[majority] < balance.majority_cut).astype(np.int64)
    return copies
