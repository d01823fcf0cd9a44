"""Missing values: per-feature ``missing_value_strategy``, computed on the fit rows, stored in meta.

Strategies (Ludwig's): ``fill_with_const`` (``fill_value``), ``fill_with_mode``, ``fill_with_mean``
(numbers), ``fill_with_false`` (binary), ``bfill``, ``ffill`` (from the neighbouring rows of the same
dataset; leftover edge nulls fall back to the type's constant), ``drop_row``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MISSING_DEFAULTS", "STRATEGIES"]

STRATEGIES = ("fill_with_const", "fill_with_mode", "fill_with_mean", "fill_with_false", "bfill", "ffill", "drop_row")

#: Ludwig's default (strategy, fill_value) per type
MISSING_DEFAULTS: dict[str, tuple[str, Any]] = {
    "binary": ("fill_with_false", None),
    "number": ("fill_with_const", 0.0),
    "category": ("fill_with_const", "<UNK>"),
    "set": ("fill_with_const", "<UNK>"),
    "bag": ("fill_with_const", "<UNK>"),
    "sequence": ("fill_with_const", "<UNK>"),
    "text": ("fill_with_const", "<UNK>"),
    "timeseries": ("fill_with_const", ""),
    "image": ("bfill", None),
}
