"""Train/validation/test split: 0 train, 1 validation, 2 test (int8), random (seeded) or from a column."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.errors import DataFileError
from datamill.core.rng import rng_for
from datamill.preprocess.config import SplitConfig

__all__ = ["SPLIT_NAMES", "compute_split"]

SPLIT_NAMES = ("train", "validation", "test")
_ALIASES = {"0": 0, "train": 0, "training": 0, "1": 1, "validation": 1, "val": 1, "valid": 1, "dev": 1,
            "2": 2, "test": 2, "testing": 2}


def compute_split(n: int, cfg: SplitConfig, *, seed: int, column: pa.ChunkedArray | pa.Array | None,
                  path: str | None = None, line_offset: int | None = None) -> NDArray[np.int8]:
    """The split id of each of ``n`` rows.

    Random: row ``i`` is train when ``u_i < p_train``, validation when ``u_i < p_train + p_val``,
    else test, with ``u`` drawn from ``rng_for(seed, "preprocess.split")`` (same seed → same split).
    Fixed: the column holds 0/1/2 or train/validation/test (also val/valid/dev/test).
    """
    if cfg.type == "random":
        u = rng_for(seed, "preprocess.split").random(n)
        p = np.cumsum(cfg.probabilities)
        return np.searchsorted(p[:2], u, side="right").astype(np.int8)
    if column is None:  # pragma: no cover - checked when reading
        raise DataFileError("split type 'fixed' needs preprocessing.split.column", path=path)
    values = pc.utf8_lower(pc.utf8_trim_whitespace(pc.cast(column, pa.string())))
    keys = pa.array(list(_ALIASES), pa.string())
    idx = pc.index_in(values, value_set=keys)
    if idx.null_count:
        bad = int(np.flatnonzero(pc.is_null(idx).to_numpy(zero_copy_only=False))[0])
        line, row = (line_offset + bad, None) if line_offset is not None else (None, bad)
        raise DataFileError(f"expected a split value (0/1/2 or train/validation/test), got {column[bad].as_py()!r}",
                            path=path, column=cfg.column, line=line, row=row)
    lut = np.array(list(_ALIASES.values()), dtype=np.int8)
    out: NDArray[np.int8] = lut[np.asarray(pc.fill_null(idx, 0).to_numpy(zero_copy_only=False))]
    return out
