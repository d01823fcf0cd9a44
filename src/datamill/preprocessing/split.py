"""Train/validation/test split: 0 train, 1 validation, 2 test (int8), random (seeded) or from a column.

Both kinds are decomposable into blocks: a row's split depends only on its own global row index
(random) or its own value (fixed), so any block computes its rows' split alone.

Random split: row ``i`` draws ``u_i`` in ``[0, 1)`` from a counter-based generator, a SplitMix64
hash of ``(key, i)`` with ``key`` derived from the seed through ``SeedSequence``; it is train when
``u_i < p_train``, validation when ``u_i < p_train + p_val``, else test. Split assignments changed
with this scheme (``datamill.preprocess@2``): the previous version drew one ``random(n)`` over the
whole table, so the same seed now gives a different (equally distributed) split.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.errors import DataFileError
from datamill.core.rng import stream_key
from datamill.preprocessing.config import SplitConfig

__all__ = ["SPLIT_NAMES", "fixed_split", "random_split", "uniform_at"]

SPLIT_NAMES = ("train", "validation", "test")
_ALIASES = {"0": 0, "train": 0, "training": 0, "1": 1, "validation": 1, "val": 1, "valid": 1, "dev": 1,
            "2": 2, "test": 2, "testing": 2}
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _key(seed: int) -> np.uint64:
    words = np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, stream_key("preprocess.split")]).generate_state(
        2, np.uint64)
    return np.uint64(words[0] ^ words[1])


def uniform_at(seed: int, lo: int, hi: int) -> NDArray[np.float64]:
    """Uniform numbers in ``[0, 1)`` for the global row indices ``lo .. hi - 1`` (a pure function of them).

    Examples:
        >>> bool((uniform_at(7, 0, 10)[4:6] == uniform_at(7, 4, 6)).all())
        True
    """
    with np.errstate(over="ignore"):
        z = _key(seed) + (np.arange(lo, hi, dtype=np.uint64) + np.uint64(1)) * _GOLDEN  # SplitMix64
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    out: NDArray[np.float64] = (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return out


def random_split(cfg: SplitConfig, *, seed: int, lo: int, hi: int) -> NDArray[np.int8]:
    """The random split of the global rows ``lo .. hi - 1``.

    Examples:
        >>> cfg = SplitConfig(probabilities=(0.5, 0.25, 0.25))
        >>> whole = random_split(cfg, seed=1, lo=0, hi=1000)
        >>> bool((np.concatenate([random_split(cfg, seed=1, lo=0, hi=300),
        ...                        random_split(cfg, seed=1, lo=300, hi=1000)]) == whole).all())
        True
    """
    p = np.cumsum(cfg.probabilities)
    return np.searchsorted(p[:2], uniform_at(seed, lo, hi), side="right").astype(np.int8)


def fixed_split(column: pa.ChunkedArray | pa.Array, cfg: SplitConfig, *, path: str | None = None,
                line_offset: int | None = None, row_offset: int = 0) -> NDArray[np.int8]:
    """The split of each row from its value: 0/1/2 or train/validation/test (also val/valid/dev/test).

    Raises:
        DataFileError: another value (file, line/row and column named).

    Examples:
        >>> fixed_split(pa.array(["train", " Test", "1"]), SplitConfig(type="fixed", column="s")).tolist()
        [0, 2, 1]
    """
    values = pc.utf8_lower(pc.utf8_trim_whitespace(pc.cast(column, pa.string())))
    keys = pa.array(list(_ALIASES), pa.string())
    idx = pc.index_in(values, value_set=keys)
    if idx.null_count:
        bad = int(np.flatnonzero(pc.is_null(idx).to_numpy(zero_copy_only=False))[0])
        row = row_offset + bad
        line, at = (line_offset + row, None) if line_offset is not None else (None, row)
        raise DataFileError(f"expected a split value (0/1/2 or train/validation/test), got {column[bad].as_py()!r}",
                            path=path, column=cfg.column, line=line, row=at)
    lut = np.array(list(_ALIASES.values()), dtype=np.int8)
    out: NDArray[np.int8] = lut[np.asarray(pc.fill_null(idx, 0).to_numpy(zero_copy_only=False))]
    return out
