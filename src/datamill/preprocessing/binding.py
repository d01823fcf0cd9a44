"""Binding a :class:`~datamill.preprocessing.plans.Plan` to its input: the first passes before the
blocks.

:func:`bind` needs the row count and at most a few whole columns (:func:`pre_columns`): it drops
the absent optional output columns (applying metadata to inference data), fixes the sample
(``sample_ratio``/``sample_size``), the split's cut values and the class balancing. Everything the
blocks then do (:func:`~datamill.preprocessing.pipeline.prepare`) is a pure function of the bound
plan, a row's global index and its values, so a distributed engine binds once and ships the plan.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.fingerprint import chain, fingerprint_obj
from datamill.core.io import split_member
from datamill.preprocessing.balance import Balance, fit_balance
from datamill.preprocessing.config import SplitConfig
from datamill.preprocessing.formats import read_any
from datamill.preprocessing.plans import Plan
from datamill.preprocessing.reading import as_table
from datamill.preprocessing.split import (
    SplitState,
    assign_split,
    fit_split,
    sample_cut,
    sample_mask,
)

__all__ = ["bind", "pre_columns", "with_image_files"]


def bind(p: Plan, num_rows: int, columns: dict[str, pa.ChunkedArray | pa.Array]) -> Plan:
    """``p`` bound to its input: the split's first pass and the absent optional columns dropped.

    ``columns``: the whole input's columns that :func:`plan` marked as needed before the blocks
    (the split column of a stratify/datetime split; an absent optional output column is left out,
    then its feature is skipped). A distributed engine calls this once with the row count and
    those columns, then ships the bound plan to its blocks.

    Examples:
        >>> from datamill.preprocessing.pipeline import plan
        >>> p = bind(
        ...     plan({"input_features": [{"name": "x", "type": "number"}]}, pa.table({})), 10, {}
        ... )
        >>> p.split_state.num_rows, p.split_state.cuts is not None
        (10, True)
    """
    missing = [c for c in p.optional if c not in columns]
    if missing:
        features = tuple(f for f in p.features if f.column not in missing)
        p = replace(
            p, features=features, wanted={c: t for c, t in p.wanted.items() if c not in missing}
        )
    glob = p.config.preprocessing
    keep = None
    if p.applied is None and (glob.sample_size is not None or glob.sample_ratio < 1):
        p, keep = _sample(p, num_rows)
    if p.split is not None:
        p = replace(p, split_state=_fit_split(p, p.split, num_rows, columns, keep))
    if p.applied is None and (glob.oversample_minority or glob.undersample_majority):
        p = replace(p, balance=_fit_balance(p, num_rows, columns, keep))
    return p


def _sample(p: Plan, num_rows: int) -> tuple[Plan, NDArray[np.bool_] | None]:
    """``p`` with its sample drawn (``sample_size`` or ``sample_ratio`` of the ``num_rows``), and
    the rows the sample keeps (None: every row)."""
    glob = p.config.preprocessing
    size = glob.sample_size if glob.sample_size is not None else round(glob.sample_ratio * num_rows)
    cut = sample_cut(p.seed, num_rows, size)
    p = replace(p, sample_cut=cut, sample_rows=num_rows)
    return p, sample_mask(p.seed, 0, num_rows, cut, num_rows=num_rows) if cut != np.inf else None


def _fit_split(
    p: Plan,
    split: SplitConfig,
    num_rows: int,
    columns: dict[str, pa.ChunkedArray | pa.Array],
    keep: NDArray[np.bool_] | None,
) -> SplitState:
    """The split's first pass over the whole input (``keep``: the sampled rows, None: all)."""
    col = split.split_column
    column = (
        columns.get(col) if col is not None and split.type in ("stratify", "datetime") else None
    )
    split_keep = keep
    if (
        split.type == "stratify"
        and column is not None
        and any(f.column == col and f.missing_value_strategy == "drop_row" for f in p.features)
    ):
        # Ludwig splits after drop_row: a row without a stratify value is not counted in the
        # sizes
        present = ~np.asarray(pc.is_null(column).to_numpy(zero_copy_only=False), bool)
        split_keep = present if keep is None else keep & present
    return fit_split(split, seed=p.seed, num_rows=num_rows, column=column, keep=split_keep)


def _fit_balance(
    p: Plan,
    num_rows: int,
    columns: dict[str, pa.ChunkedArray | pa.Array],
    keep: NDArray[np.bool_] | None,
) -> Balance | None:
    target = next(f.column for f in p.features if f.role == "output")
    train = np.ones(num_rows, bool) if keep is None else keep.copy()
    if p.split is not None and p.split_state is not None:
        col = p.split.split_column
        train &= (
            assign_split(
                p.split,
                p.split_state,
                seed=p.seed,
                lo=0,
                hi=num_rows,
                column=columns[col] if col is not None else None,
            )
            == 0
        )
    glob = p.config.preprocessing
    return fit_balance(
        columns[target],
        train,
        name=target,
        seed=p.seed,
        oversample_minority=glob.oversample_minority,
        undersample_majority=glob.undersample_majority,
    )


def pre_columns(p: Plan) -> list[str]:
    """The columns :func:`bind` needs from the whole input (optional outputs present, split's first
    pass)."""
    cols = list(p.optional)
    glob = p.config.preprocessing
    balancing = p.applied is None and bool(glob.oversample_minority or glob.undersample_majority)
    if (
        p.split is not None
        and p.split.split_column is not None
        and (balancing or p.split.type in ("stratify", "datetime"))
    ):
        cols.append(p.split.split_column)
    if balancing:
        cols.append(next(f.column for f in p.features if f.role == "output"))
    return list(dict.fromkeys(cols))


def with_image_files(p: Plan, dataset: Any) -> Plan:
    """Chain the size and mtime of every image (and audio) file a feature reads into the plan's
    fingerprint (so replacing or deleting an image invalidates a cached output; every engine records
    the same)."""
    columns = sorted({f.column for f in p.features if f.type in ("image", "audio")})
    if not columns:
        return p
    base: Path | None = None
    if isinstance(dataset, (str, os.PathLike)):
        table = read_any(dataset, fmt=p.config.preprocessing.format, columns=columns)
        base = split_member(dataset)[0].parent
    else:
        table = as_table(dataset)
    stats: list[Any] = []
    for column in columns:
        for value in table.column(column).to_pylist() if column in table.column_names else []:
            if not isinstance(value, str) or not value:
                stats.append(None)
                continue
            path = Path(value) if Path(value).is_absolute() or base is None else base / value
            try:
                st = path.stat()
                stats.append([value, st.st_size, st.st_mtime_ns])
            except OSError:
                stats.append([value, None])
    return replace(
        p,
        fingerprint=chain(
            p.fingerprint, "datamill.preprocess.image_files@1", fingerprint_obj(stats)
        ),
    )
