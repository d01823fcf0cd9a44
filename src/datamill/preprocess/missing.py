"""Missing values: per-feature ``missing_value_strategy``, computed on the fit rows, stored in meta.

Strategies (Ludwig's): ``fill_with_const`` (``fill_value``), ``fill_with_mode``, ``fill_with_mean``
(numbers), ``fill_with_false`` (binary), ``bfill``, ``ffill`` (from the neighbouring rows of the same
dataset; leftover edge nulls fall back to the type's constant), ``drop_row``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datamill.core.errors import ConfigError

__all__ = ["MISSING_DEFAULTS", "STRATEGIES", "apply_fill", "compute_fill"]

STRATEGIES = ("fill_with_const", "fill_with_mode", "fill_with_mean", "fill_with_false", "bfill", "ffill", "drop_row")

#: Ludwig's default (strategy, fill_value) per type
MISSING_DEFAULTS: dict[str, tuple[str, Any]] = {
    "binary": ("fill_with_false", None),
    "number": ("fill_with_const", 0.0),
    "category": ("fill_with_const", "<UNK>"),
    "set": ("fill_with_const", "<UNK>"),
    "bag": ("fill_with_const", "<UNK>"),
    "sequence": ("fill_with_const", "<UNK>"),
    "text": ("fill_with_const", ""),  # "<UNK>" would be tokenised into "<", "unk", ">"
    "timeseries": ("fill_with_const", ""),
    "image": ("bfill", None),
}


def _is_number(type_name: str) -> bool:
    return type_name == "number"


def compute_fill(column: pa.Array, strategy: str, fill_value: Any, type_name: str, false_string: str) -> Any:
    """The fill value to store in the metadata, computed on the fit rows (``None`` for bfill/ffill/drop_row)."""
    if strategy == "fill_with_const":
        value = fill_value if fill_value is not None else MISSING_DEFAULTS.get(type_name, (None, None))[1]
        if value is None:
            raise ConfigError(f"missing_value_strategy fill_with_const of a {type_name} feature needs fill_value")
        return float(value) if _is_number(type_name) else str(value)
    if strategy == "fill_with_false":
        if type_name != "binary":
            raise ConfigError(f"fill_with_false only applies to binary features, not {type_name}")
        return false_string
    if strategy == "fill_with_mean":
        if not _is_number(type_name):
            raise ConfigError(f"fill_with_mean only applies to number features, not {type_name}")
        mean = pc.mean(column).as_py()
        return float(mean) if mean is not None else 0.0
    if strategy == "fill_with_mode":
        valid = column.drop_null()
        if len(valid) == 0:
            return 0.0 if _is_number(type_name) else MISSING_DEFAULTS.get(type_name, (None, ""))[1]
        vc = pc.value_counts(valid)
        counts = vc.field("counts").to_numpy()
        values = vc.field("values")
        best = np.flatnonzero(counts == counts.max())
        tied = values.take(pa.array(best))  # ties: the smallest value, deterministic
        return pc.min(tied).as_py()
    return None


def apply_fill(column: pa.Array | pa.ChunkedArray, strategy: str, fill: Any, type_name: str) -> pa.Array:
    """Fill the nulls of ``column`` (already cast to the handler's type)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.null_count == 0:
        return column
    if strategy in ("bfill", "ffill"):
        column = pc.fill_null_backward(column) if strategy == "bfill" else pc.fill_null_forward(column)
        if column.null_count == 0:
            return column
        fill = MISSING_DEFAULTS.get(type_name, (None, ""))[1]
        fill = 0.0 if _is_number(type_name) else ("" if fill is None else fill)
    if fill is None:
        return column
    return pc.fill_null(column, pa.scalar(fill, column.type))
