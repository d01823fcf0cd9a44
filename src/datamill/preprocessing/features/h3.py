"""h3 → ``n × 19`` uint8: Ludwig's components of a 64-bit H3 index, by bit operations in numpy.

The 19 components (Ludwig's ``H3FeatureMixin.h3_to_list``): index mode (bits 59-62), edge/vertex
field (56-58), resolution (52-55), base cell (45-51), then the 15 cell digits (3 bits each, the
first below the base cell); digits past the resolution are written as 7, Ludwig's padding (a valid
index holds 7 there anyway). Values are the index as an integer (an integer column, or decimal
text: what Ludwig's ``int(value)`` reads); a value that is not a valid H3 index is a located error
(file, line/row, column): the high bit set, a mode other than a cell (1), a directed edge (2) or a
vertex (4), a base cell past 121, a digit of 7 inside the resolution, a digit other than 7 past it,
a cell's reserved bits set, or a pentagon cell whose first non-zero digit is 1 (a deleted
subsequence) — the checks of the ``h3`` library's ``is_valid_cell`` for cells. Missing values:
Ludwig's ``fill_with_const`` with ``fill_value`` 576495936675512319 (a resolution-0 cell). The
metadata holds nothing to fit (as Ludwig's).
"""

from __future__ import annotations

import builtins
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.preprocessing.features.base import (
    CSR,
    FeatureContext,
    StringFeatureHandler,
)
from datamill.preprocessing.features.base import Params as BaseParams

__all__ = ["H3Params", "Handler", "h3_components", "h3_invalid"]

#: components per index: mode, edge, resolution, base cell, 15 digits (Ludwig's H3_VECTOR_LENGTH)
H3_VECTOR_LENGTH = 19
#: Ludwig's padding of the digits past the resolution
H3_PADDING_VALUE = 7
#: the base cells that are pentagons (H3's numbering)
PENTAGONS = (4, 14, 24, 38, 49, 58, 63, 72, 83, 97, 107, 117)
#: Ludwig's default fill value: a resolution-0 cell
DEFAULT_FILL = 576495936675512319


class H3Params(BaseParams):
    """``preprocessing:`` of an h3 feature (Ludwig's: only the missing-value keys)."""


def _field(h: NDArray[np.uint64], shift: int, bits: int) -> NDArray[np.uint8]:
    out: NDArray[np.uint8] = ((h >> np.uint64(shift)) & np.uint64((1 << bits) - 1)).astype(np.uint8)
    return out


def h3_components(h: NDArray[np.uint64]) -> NDArray[np.uint8]:
    """Ludwig's 19 components of each index (``n × 19`` uint8).

    Examples:
        >>> h3_components(np.array([622236723497533439], np.uint64))[0].tolist()
        [1, 0, 10, 21, 0, 2, 0, 0, 3, 2, 6, 2, 1, 3, 7, 7, 7, 7, 7]
    """
    out = np.empty((len(h), H3_VECTOR_LENGTH), np.uint8)
    out[:, 0] = _field(h, 59, 4)
    out[:, 1] = _field(h, 56, 3)
    out[:, 2] = res = _field(h, 52, 4)
    out[:, 3] = _field(h, 45, 7)
    for i in range(1, 16):  # one pass per digit position, over the whole column
        out[:, 3 + i] = np.where(res >= i, _field(h, 45 - 3 * i, 3), H3_PADDING_VALUE)
    return out


def h3_invalid(h: NDArray[np.uint64]) -> NDArray[np.bool_]:
    """Which indexes are not valid H3 cells, directed edges or vertices (see the module doc).

    Examples:
        >>> h3_invalid(np.array([622236723497533439, 622236723497533440, 0], np.uint64)).tolist()
        [False, True, True]
    """
    mode = _field(h, 59, 4)
    edge = _field(h, 56, 3)
    res = _field(h, 52, 4)
    base = _field(h, 45, 7)
    bad = (h >> np.uint64(63)).astype(bool) | ~np.isin(mode, (1, 2, 4)) | (base > 121)
    bad |= ((mode == 1) & (edge != 0)) | ((mode == 2) & ((edge == 0) | (edge == 7)))
    bad |= (mode == 4) & (edge > 5)
    first = np.zeros(len(h), np.uint8)  # the first non-zero digit (0: none)
    for i in range(1, 16):
        d = _field(h, 45 - 3 * i, 3)
        inside = res >= i
        bad |= (inside & (d == 7)) | (~inside & (d != 7))
        first = np.where((first == 0) & inside, d, first)
    bad |= np.isin(base, PENTAGONS) & (first == 1)
    out: NDArray[np.bool_] = bad
    return out


def _as_uint64(column: pa.Array, ctx: FeatureContext) -> NDArray[np.uint64]:
    if pa.types.is_integer(column.type):
        ints = column
    else:
        text = pc.utf8_trim_whitespace(column.cast(pa.string()))
        ok = pc.fill_null(pc.match_substring_regex(text, r"^\+?\d{1,20}$"), False)
        if not pc.all(ok).as_py() and len(text):
            bad = int(np.flatnonzero(~np.asarray(ok.to_numpy(zero_copy_only=False), bool))[0])
            raise ctx.error(
                f"expected an H3 index (a 64-bit integer), got {column[bad].as_py()!r}",
                index=bad,
                hint="write H3 indexes as decimal integers (a hex string s: int(s, 16))",
            )
        try:
            ints = pc.cast(text, pa.uint64())
        except pa.ArrowInvalid as exc:  # past 2**64
            raise ctx.error(
                f"an H3 index does not fit in 64 bits ({exc})",
                hint="H3 indexes are 64-bit integers",
            ) from exc
    return np.asarray(ints.to_numpy(zero_copy_only=False)).astype(np.uint64)


class Handler(StringFeatureHandler):  # read as strings: a 64-bit index does not survive float64
    """H3 feature handler.

    Examples:
        >>> from datamill.preprocessing.features import FeatureContext
        >>> h, ctx = Handler(), FeatureContext("loc", "loc", None, None)
        >>> h.transform(pa.array(["622236723497533439"]), {}, h.Params(), ctx)["loc"].shape
        (1, 19)
    """

    type_name: ClassVar[str] = "h3"
    Params: ClassVar[builtins.type[H3Params]] = H3Params
    fill_value: ClassVar[Any] = DEFAULT_FILL
    defaults_key: ClassVar[str] = "h3"

    def fit(self, column: pa.Array, params: H3Params, ctx: FeatureContext) -> None:
        return None

    def merge(self, a: None, b: None) -> None:
        return None

    def finalize(self, stats: None, params: H3Params, ctx: FeatureContext) -> dict[str, Any]:
        return {}

    def transform(
        self, column: pa.Array, meta: dict[str, Any], params: H3Params, ctx: FeatureContext
    ) -> dict[str, NDArray[Any] | CSR]:
        h = _as_uint64(column, ctx)
        bad = np.flatnonzero(h3_invalid(h))
        if len(bad):
            i = int(bad[0])
            raise ctx.error(
                f"not a valid H3 index: {int(h[i])} (hex {int(h[i]):x})",
                index=i,
                hint="H3 indexes come from the h3 library (h3.latlng_to_cell, as an integer: "
                "h3.str_to_int)",
            )
        return {ctx.name: h3_components(h)}
