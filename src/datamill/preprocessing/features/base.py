"""The feature-handler interface every preprocessing type implements.

A handler works on blocks of a column (pyarrow arrays without nulls: missing values are filled
before ``fit``/``transform`` with the handler's own missing-value methods). ``fit`` returns
*mergeable* statistics of one block (counts, sums, maxima) so an executor can fit blocks anywhere
and :meth:`FeatureHandler.merge` them in block order; ``finalize`` turns the merged statistics into
the JSON-able metadata stored in ``<stem>.meta.json``; ``transform`` maps a block to the arrays
written out (first dimension = rows).

Per-block intermediates shared by ``fit`` and ``transform`` (the tokens of the ragged types) come
from :meth:`FeatureHandler.tokens`; the pipeline passes ``fit``'s tokens of a block to that block's
``transform`` explicitly, and ``fit``/``transform`` also accept the raw column (then they tokenise).

A handler class declares everything the common code needs about its type (see
:data:`REQUIRED_ATTRIBUTES`): ``type_name``, ``input_type``, ``Params``, its missing-value
defaults (``missing_value_strategy``, ``fill_value``), the strategies it accepts and its key in the
config's global ``preprocessing:`` section (``defaults_key``).
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict

from datamill.core.errors import ConfigError, DataFileError
from datamill.core.ragged import smallest_int_dtype
from datamill.preprocessing.missing import MissingStats

__all__ = [
    "COMMON_STRATEGIES",
    "CSR",
    "REQUIRED_ATTRIBUTES",
    "FeatureContext",
    "FeatureHandler",
    "FileFeatureHandler",
    "Params",
    "StringFeatureHandler",
    "int_type",
]

#: class attributes every registered handler class must define itself (or inherit from a concrete
# parent)
REQUIRED_ATTRIBUTES = (
    "Params",
    "defaults_key",
    "fill_value",
    "input_type",
    "missing_value_strategy",
    "strategies",
    "type_name",
)

#: the strategies every type accepts (a handler class may add its own, e.g. number's fill_with_mean)
COMMON_STRATEGIES = ("fill_with_const", "fill_with_mode", "bfill", "ffill", "drop_row")


def int_type(vocab_size: int) -> type[np.signedinteger[Any]]:
    """The smallest signed integer dtype holding ids ``0 .. vocab_size - 1`` (Ludwig's
    ``int_type``).

    Examples:
        >>> int_type(128).__name__, int_type(129).__name__, int_type(40_000).__name__
        ('int8', 'int16', 'int32')
    """
    return smallest_int_dtype(
        max(vocab_size - 1, 0)
    ).type  # the signed ladder (int8, int16, int32, int64)


class Params(BaseModel):
    """Base of every type's ``preprocessing:`` model (unknown keys rejected, immutable).

    ``missing_value_strategy`` and ``fill_value`` are resolved by the config (defaults from the
    handler class) and applied by the handler's missing-value methods.
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
    #: input row of each block-local row when rows were dropped (``drop_row``); None: ``row_offset +
    # index``
    rows: NDArray[np.int64] | None = field(default=None, compare=False, repr=False)

    def location(self, index: int) -> dict[str, int]:
        """``{"line": ...}`` (text formats) or ``{"row": ...}`` for the block-local row
        ``index``."""
        row = int(self.rows[int(index)]) if self.rows is not None else self.row_offset + int(index)
        if self.line_offset is not None:
            return {"line": self.line_offset + row}
        return {"row": row}

    def error(
        self, msg: str, *, index: int | None = None, hint: str | None = None
    ) -> DataFileError:
        """A :class:`~datamill.core.errors.DataFileError` naming the column's file, the column and
        (``index`` given) the location of block-local row ``index``."""
        where = self.location(index) if index is not None else {}
        return DataFileError(msg, path=self.path, column=self.column, hint=hint, **where)


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
    """One feature type: ``fit`` → ``merge`` → ``finalize`` → ``transform``, and its missing values.

    Subclasses set every name in :data:`REQUIRED_ATTRIBUTES` (checked when the registry loads them).
    """

    #: the ``type:`` of the config
    type_name: ClassVar[str]
    Params: ClassVar[builtins.type[BaseModel]]
    #: arrow type the column is cast to before fit/transform ("string", "float64"; "binary": a
    # binary column kept as bytes, anything else as strings)
    input_type: ClassVar[str]
    #: Ludwig's default missing-value strategy of this type
    missing_value_strategy: ClassVar[str]
    #: default ``fill_value`` of ``fill_with_const`` (and of edge nulls ``bfill``/``ffill`` cannot
    # fill)
    fill_value: ClassVar[Any]
    #: missing-value strategies this type accepts
    strategies: ClassVar[tuple[str, ...]]
    #: key of this type's defaults in the config's global ``preprocessing:`` section
    defaults_key: ClassVar[str]
    #: the missing-value strategy of this type's *output* features (Ludwig's: a row without a target
    # is dropped)
    output_missing_value_strategy: ClassVar[str] = "drop_row"

    @classmethod
    def role_defaults(cls, role: str) -> dict[str, Any]:
        """Params defaults that depend on the role ("input"/"output"), under every configured
        value."""
        return {}

    @classmethod
    def default_fill(cls, params: dict[str, Any]) -> Any:
        """The ``fill_value`` when the config sets none (``params``: the merged ``preprocessing:``
        keys)."""
        return cls.fill_value

    # -- missing values ------------------------------------------------------------------------
    @classmethod
    def const_fill(cls, fill_value: Any) -> Any:
        """The value ``fill_with_const`` fills with (``None``: the type's default), as the column's
        type.

        Raises:
            ConfigError: neither the feature nor the type has a fill value.
        """
        value = fill_value if fill_value is not None else cls.fill_value
        if value is None:
            raise ConfigError(
                f"missing_value_strategy fill_with_const of a {cls.type_name} feature needs "
                "fill_value"
            )
        return float(value) if cls.input_type == "float64" else str(value)

    @classmethod
    def edge_fill(cls, params: Any = None) -> Any:
        """What fills the nulls ``bfill``/``ffill`` leave at the ends of the dataset."""
        if cls.input_type == "float64":
            return 0.0
        return "" if cls.fill_value is None else cls.fill_value

    def finalize_missing(
        self, stats: MissingStats, strategy: str, fill_value: Any, params: Any
    ) -> Any:
        """The fill value stored in the metadata (``computed_fill_value``) from the merged fit
        statistics.

        ``bfill``/``ffill``/``drop_row`` (filled from neighbours or dropped) compute nothing and
        store :meth:`unfitted_fill`, the value Ludwig's schema stores then.
        """
        if strategy == "fill_with_const":
            return self.const_fill(fill_value)
        if strategy == "fill_with_mean":
            mean = stats.mean()
            return float(mean) if mean is not None else 0.0
        if strategy == "fill_with_mode":
            mode = stats.mode()
            if mode is None:
                return 0.0 if self.input_type == "float64" else self.fill_value
            return mode
        return self.unfitted_fill()

    @classmethod
    def unfitted_fill(cls) -> Any:
        """The ``computed_fill_value`` stored when none is computed: Ludwig's schema default (the
        type's ``fill_value``; ``<UNK>`` for a category, ``0.0`` for a number)."""
        return cls.fill_value

    # -- the feature itself ----------------------------------------------------------------------
    def tokens(self, column: pa.Array, params: Any, ctx: FeatureContext) -> Any:
        """The per-block intermediate ``fit`` and ``transform`` share (tokens); default: the
        column."""
        return column

    def take_rows(self, tokens: Any, mask: NDArray[np.bool_]) -> Any:
        """The rows of ``tokens`` where ``mask`` is true (the fit rows of a split block)."""
        return tokens.filter(pa.array(mask))

    def compact_tokens(self, tokens: Any) -> Any:
        """``tokens`` in the form held between a block's fit and its transform (smaller; default: as
        is)."""
        return tokens

    def keys(self, name: str, params: Any = None) -> list[str]:
        """The output keys ``transform`` writes for feature ``name`` with ``params`` (sorted)."""
        return [name]

    @abstractmethod
    def fit(self, column: Any, params: Any, ctx: FeatureContext) -> Any:
        """Mergeable statistics of one block (never the final metadata); ``column`` or its
        :meth:`tokens`."""

    @abstractmethod
    def merge(self, a: Any, b: Any) -> Any:
        """Combine two blocks' statistics (``b`` follows ``a``)."""

    @abstractmethod
    def finalize(self, stats: Any, params: Any, ctx: FeatureContext) -> dict[str, Any]:
        """JSON-able metadata of this feature (vocab via ``Vocab.to_dict()``, sizes, statistics)."""

    @abstractmethod
    def transform(
        self, column: Any, meta: dict[str, Any], params: Any, ctx: FeatureContext
    ) -> dict[str, NDArray[Any] | CSR]:
        """Output key → array (first dimension = rows) or :class:`CSR`; ``column`` or its
        :meth:`tokens`."""


class StringFeatureHandler(FeatureHandler):
    """A type read as strings whose missing values Ludwig fills with a constant by default, and
    that accepts the :data:`COMMON_STRATEGIES` (what most types are); a subclass declares the rest.
    """

    input_type: ClassVar[str] = "string"
    missing_value_strategy: ClassVar[str] = "fill_with_const"
    strategies: ClassVar[tuple[str, ...]] = COMMON_STRATEGIES


class FileFeatureHandler(FeatureHandler):
    """A type whose values name files (or hold their bytes): Ludwig back-fills a missing one (no
    constant makes a file), and it accepts the :data:`COMMON_STRATEGIES`; a subclass declares the
    rest."""

    missing_value_strategy: ClassVar[str] = "bfill"
    fill_value: ClassVar[Any] = None
    strategies: ClassVar[tuple[str, ...]] = COMMON_STRATEGIES
