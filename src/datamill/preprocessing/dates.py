"""Parsing date/time strings to timestamps, column at a time (the ``date`` type and the ``datetime``
split).

With ``datetime_format`` (a ``strptime`` format, Ludwig's option) values are parsed with it; without
one, ISO 8601 values are parsed by Arrow's cast and the rest by ``pandas.to_datetime`` (format
inferred per value, as Ludwig's ``dateutil`` parse does), only for the values Arrow could not parse.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["parse_datetimes"]

_TS = pa.timestamp("ns")


def _cast_iso(strings: pa.Array) -> pa.Array:
    """Arrow's ISO 8601 cast; all null when any value is not ISO (pandas then parses them)."""
    try:
        return pc.cast(strings, _TS)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.nulls(len(strings), _TS)


def parse_datetimes(
    column: pa.Array | pa.ChunkedArray,
    fmt: str | None = None,
    *,
    errors: Literal["null", "raise"] = "null",
) -> pa.Array:
    """Timestamps (ns) of a string column; missing values stay null, unparsable ones too
    (``errors="null"``).

    Raises:
        ValueError: with ``errors="raise"``, the first value that does not parse (the caller locates
            it).

    Examples:
        >>> parse_datetimes(pa.array(["2020-01-02", "03/04/2021", None])).to_pylist()[1].isoformat()
        '2021-03-04T00:00:00'
        >>> parse_datetimes(pa.array(["02.01.2020"]), "%d.%m.%Y").to_pylist()[0].isoformat()
        '2020-01-02T00:00:00'
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_timestamp(column.type) or pa.types.is_date(column.type):
        return pc.cast(column, _TS)
    strings = pc.utf8_trim_whitespace(pc.cast(column, pa.string()))
    strings = pc.if_else(pc.equal(strings, ""), pa.scalar(None, pa.string()), strings)
    if fmt is not None:
        parsed = pc.strptime(strings, format=fmt, unit="ns", error_is_null=True)
    else:
        parsed = _cast_iso(strings) if len(strings) else pa.array([], _TS)
        left = np.flatnonzero(
            pc.and_(pc.is_null(parsed), pc.is_valid(strings)).to_numpy(zero_copy_only=False)
        )
        if len(left):
            import pandas as pd

            values = pd.to_datetime(
                pd.Series(strings.take(pa.array(left)).to_pylist(), dtype=object),
                errors="coerce",
                format="mixed",
            )
            ns = np.array(
                parsed.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False), np.int64
            )
            valid = np.array(parsed.is_valid().to_numpy(zero_copy_only=False), bool)
            got = values.notna().to_numpy()
            ns[left[got]] = values[got].astype("datetime64[ns]").to_numpy().astype(np.int64)
            valid[left[got]] = True
            parsed = pa.array(ns, pa.int64(), mask=~valid).cast(_TS)
    if errors == "raise":
        bad = np.flatnonzero(
            pc.and_(pc.is_null(parsed), pc.is_valid(strings)).to_numpy(zero_copy_only=False)
        )
        if len(bad):
            raise ValueError(
                f"cannot parse {strings[int(bad[0])].as_py()!r} as a date"
                + (f" with datetime_format {fmt!r}" if fmt else ""),
                int(bad[0]),
            )
    return parsed
