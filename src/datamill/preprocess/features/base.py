"""The feature-handler interface every preprocessing type implements.

A handler works on whole columns (pyarrow arrays without nulls: missing values are filled by the
common code before ``fit``/``transform``). ``fit`` returns *mergeable* statistics of one block
(counts, sums, maxima) so a scale-out backend can fit per block and :meth:`FeatureHandler.merge`;
``finalize`` turns the merged statistics into the JSON-able metadata stored in ``<stem>.meta.json``;
``transform`` maps a column to the arrays written to HDF5 (first dimension = rows).
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict

__all__ = ["CSR", "FeatureContext", "FeatureHandler", "Params"]


def int_type(vocab_size: int) -> type[np.signedinteger[Any]]:
    """The smallest signed integer dtype holding ids ``0 .. vocab_size - 1`` (Ludwig's ``int_type``).

    Examples:
        >>> int_type(128).__name__, int_type(129).__name__, int_type(40_000).__name__
        ('int8', 'int16', 'int32')
    """
    largest = max(vocab_size - 1, 0)
    for dtype in (np.int8, np.int16, np.int32):
        if largest <= np.iinfo(dtype).max:
            return dtype
    return np.int64


class Params(BaseModel):
    """Base of every type's ``preprocessing:`` model (unknown keys rejected, immutable).

    ``missing_value_strategy`` and ``fill_value`` are handled by the common code, not by handlers.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    missing_value_strategy: str = "fill_with_const"
    fill_value: Any = None


@dataclass(frozen=True)
class FeatureContext:
    """Where a column comes from, for error messages and relative paths."""

    name: str
    column: str
    path: str | None
    base_dir: Path | None
    row_offset: int = 0
    line_offset: int | None = None  # 1-based line of row 0 for text formats (CSV: 2), else None

    def location(self, index: int) -> dict[str, int]:
        """``{"line": ...}`` (text formats) or ``{"row": ...}`` for the block-local row ``index``."""
        if self.line_offset is not None:
            return {"line": self.line_offset + self.row_offset + int(index)}
        return {"row": self.row_offset + int(index)}


@dataclass(frozen=True)
class CSR:
    """Sparse rows for set/bag: row ``i`` is ``indices[offsets[i]:offsets[i+1]]``.

    ``values`` (optional) holds per-entry weights (bag frequencies); ``None`` means all ones.
    """

    indices: NDArray[np.int32]
    offsets: NDArray[np.int64]
    vocab_size: int
    values: NDArray[np.float32] | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1


class FeatureHandler(ABC):
    """One feature type: ``fit`` → ``merge`` → ``finalize`` → ``transform``."""

    type: ClassVar[str]
    Params: ClassVar[builtins.type[BaseModel]]
    #: arrow type the common code casts the column to before fit/transform ("string", "float64", "bool"…)
    input_type: ClassVar[str] = "string"

    @abstractmethod
    def fit(self, column: pa.Array, params: Any, ctx: FeatureContext) -> Any:
        """Mergeable statistics of one block (never the final metadata)."""

    @abstractmethod
    def merge(self, a: Any, b: Any) -> Any:
        """Combine two blocks' statistics."""

    @abstractmethod
    def finalize(self, stats: Any, params: Any, ctx: FeatureContext) -> dict[str, Any]:
        """JSON-able metadata of this feature (vocab via ``Vocab.to_dict()``, sizes, statistics)."""

    @abstractmethod
    def transform(
        self, column: pa.Array, meta: dict[str, Any], params: Any, ctx: FeatureContext
    ) -> dict[str, NDArray[Any] | CSR]:
        """HDF5 key → array (first dimension = rows) or :class:`CSR`."""
