"""date → Ludwig's date component vector: ``(n, 9)`` int32.

The components (Ludwig's ``create_vector_from_datetime_obj``): year, month, day, weekday (Monday 0),
day of the year (1-based), hour, minute, second, second of the day. Values are parsed with
``datetime_format`` when given (a ``strptime`` format), else ISO 8601 by Arrow and anything else by
``pandas.to_datetime`` (see :mod:`datamill.preprocessing.dates`).

Differences from Ludwig, deliberate: a value that does not parse is an error naming the file,
line/row and column (Ludwig logs it and uses the fill value), and the default fill value ``""``
gives an all-zero vector (Ludwig uses the current time, so its output changes from run to run).
Nothing is fitted: the metadata records the format and the vector size.
"""

from __future__ import annotations

import builtins
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.preprocessing.dates import parse_datetimes
from datamill.preprocessing.features.base import (
    CSR,
    FeatureContext,
    StringFeatureHandler,
)
from datamill.preprocessing.features.base import Params as BaseParams

__all__ = ["DATE_COMPONENTS", "DateParams", "Handler"]

DATE_COMPONENTS = (
    "year",
    "month",
    "day",
    "weekday",
    "yearday",
    "hour",
    "minute",
    "second",
    "second_of_day",
)


class DateParams(BaseParams):
    """``preprocessing:`` of a date feature."""

    datetime_format: str | None = None


class Handler(StringFeatureHandler):
    """Date feature handler."""

    type_name: ClassVar[str] = "date"
    Params: ClassVar[builtins.type[DateParams]] = DateParams
    fill_value: ClassVar[Any] = ""
    defaults_key: ClassVar[str] = "date"

    def fit(self, column: pa.Array, params: DateParams, ctx: FeatureContext) -> int:
        return len(column)

    def merge(self, a: int, b: int) -> int:
        return a + b

    def finalize(self, stats: int, params: DateParams, ctx: FeatureContext) -> dict[str, Any]:
        return {
            "datetime_format": params.datetime_format,
            "vector_size": len(DATE_COMPONENTS),
            "components": list(DATE_COMPONENTS),
        }

    def transform(
        self, column: pa.Array, meta: dict[str, Any], params: DateParams, ctx: FeatureContext
    ) -> dict[str, NDArray[Any] | CSR]:
        try:
            t = parse_datetimes(column, params.datetime_format, errors="raise")
        except ValueError as exc:
            raise ctx.error(
                str(exc.args[0]),
                index=exc.args[1],
                hint="set preprocessing.datetime_format (a strptime format) for this column",
            ) from exc
        out = np.zeros((len(column), len(DATE_COMPONENTS)), np.int32)
        valid = np.asarray(t.is_valid().to_numpy(zero_copy_only=False), bool)
        if not valid.any():
            return {ctx.name: out}
        comps = [
            pc.year(t),
            pc.month(t),
            pc.day(t),
            pc.day_of_week(t),
            pc.day_of_year(t),
            pc.hour(t),
            pc.minute(t),
            pc.second(t),
        ]
        for j, c in enumerate(comps):
            out[valid, j] = np.asarray(c.to_numpy(zero_copy_only=False))[valid]
        out[:, 8] = out[:, 5] * 3600 + out[:, 6] * 60 + out[:, 7]
        return {ctx.name: out}
