"""A short table of a preprocessing result: key, shape, dtype, vocab size (used by the CLI and
demo)."""

from __future__ import annotations

from typing import Any

from datamill.preprocessing.features.base import CSR
from datamill.preprocessing.meta import Metadata

__all__ = ["format_table", "tensor_rows"]


def tensor_rows(data: dict[str, Any], meta: Metadata) -> list[tuple[str, str, str, str]]:
    """(key, shape, dtype, vocab size) per output tensor."""
    rows = []
    for key in sorted(data):
        value = data[key]
        if isinstance(value, CSR):
            shape, dtype = (
                f"csr({len(value)} x {value.vocab_size}, nnz {len(value.indices)})",
                "int32",
            )
        else:
            shape, dtype = "x".join(str(d) for d in value.shape), str(value.dtype)
        try:
            vocab = str(len(meta.vocab(key)))
        except (KeyError, Exception):  # noqa: BLE001 - no vocabulary for this key
            vocab = "-"
        rows.append((key, shape, dtype, vocab))
    return rows


def format_table(rows: list[tuple[str, str, str, str]]) -> str:
    """Aligned text table with a header."""
    table = [("tensor", "shape", "dtype", "vocab"), *rows]
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table)
