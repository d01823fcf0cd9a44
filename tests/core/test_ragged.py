"""datamill.core.ragged: each CSR kernel against a plain-Python statement of what it does."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.ragged import (
    concat_csr,
    csr_from_arrays,
    csr_from_arrow,
    encodings_to_csr,
    offsets_from_lengths,
    pad,
    ranges,
    runs,
    smallest_int_dtype,
)


def ragged_rows(max_rows: int = 12, max_len: int = 9) -> st.SearchStrategy[list[list[int]]]:
    """Rows of small ints (some empty): the input of the CSR kernels."""
    return st.lists(st.lists(st.integers(-1000, 1000), max_size=max_len), max_size=max_rows)


def _rows(values: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    return [values[a:b].tolist() for a, b in itertools.pairwise(offsets)]


@given(
    rows=ragged_rows(),
    width=st.none() | st.integers(0, 12),
    side=st.sampled_from(["right", "left"]),
    fill=st.integers(-5, 5),
    lead=st.integers(0, 3),
)
def test_pad_places_each_row_cut_to_width(
    rows: list[list[int]], width: int | None, side: str, fill: int, lead: int
) -> None:
    values = np.asarray(
        [7] * lead + [x for r in rows for x in r], dtype=np.int64
    )  # offsets need not start at 0
    offsets = offsets_from_lengths([len(r) for r in rows]) + lead
    out, mask = pad(values, offsets, width, fill=fill, dtype=np.int32, side=side)  # type: ignore[arg-type]
    w = max((len(r) for r in rows), default=0) if width is None else width
    assert out.shape == mask.shape == (len(rows), w) and out.dtype == np.int32
    for got, m, row in zip(out.tolist(), mask.tolist(), rows, strict=True):
        kept = row[:w]
        want = (
            kept + [fill] * (w - len(kept)) if side == "right" else [fill] * (w - len(kept)) + kept
        )
        assert got == want
        assert sum(m) == len(kept) and [g for g, k in zip(got, m, strict=True) if k] == kept


@given(rows=ragged_rows(), dims=st.integers(1, 3))
def test_pad_keeps_trailing_dimensions_and_object_fill(rows: list[list[int]], dims: int) -> None:
    values = np.repeat(
        np.asarray([x for r in rows for x in r], dtype=np.int64)[:, None], dims, axis=1
    )
    out, mask = pad(values, offsets_from_lengths([len(r) for r in rows]))
    assert out.shape[2:] == (dims,)
    np.testing.assert_array_equal(out[mask], values)
    strings = np.asarray([str(x) for r in rows for x in r] or [""], dtype=object)[
        : sum(map(len, rows))
    ]
    padded, m = pad(strings, offsets_from_lengths([len(r) for r in rows]), fill=None)
    assert all(v is None for v in padded[~m]) and padded[m].tolist() == strings.tolist()


@given(rows=ragged_rows(), cut=st.integers(0, 12))
def test_csr_builders_round_trip(rows: list[list[int]], cut: int) -> None:
    """csr_from_arrays / encodings_to_csr / concat_csr / csr_from_arrow (slices, nulls) give back
    the rows."""
    values, offsets = csr_from_arrays(rows, dtype=np.int64)
    assert values.dtype == np.int64 and offsets.dtype == np.int64 and _rows(values, offsets) == rows
    ids, off = encodings_to_csr([SimpleNamespace(ids=r) for r in rows])
    assert ids.dtype == np.int32 and _rows(ids, off) == rows
    head, tail = rows[:cut], rows[cut:]
    both = concat_csr([csr_from_arrays(head), csr_from_arrays(tail)])
    assert _rows(*both) == rows
    with_nulls = pa.array([None, *rows, None], pa.list_(pa.int64()))
    for arr, want in [
        (pa.array(rows, pa.list_(pa.int64())).slice(min(cut, len(rows))), rows[cut:]),
        (with_nulls, [[], *rows, []]),
        (
            pa.chunked_array(
                [pa.array(head, pa.list_(pa.int64())), pa.array(tail, pa.list_(pa.int64()))]
            ),
            rows,
        ),
    ]:
        v, o = csr_from_arrow(arr)
        assert o[0] == 0 and _rows(v, o) == want


@given(pairs=st.lists(st.tuples(st.integers(-50, 50), st.integers(0, 6)), max_size=10))
def test_ranges_concatenates_aranges(pairs: list[tuple[int, int]]) -> None:
    starts = np.asarray([s for s, _ in pairs], dtype=np.int64)
    lengths = np.asarray([n for _, n in pairs], dtype=np.int64)
    assert ranges(starts, lengths).tolist() == [x for s, n in pairs for x in range(s, s + n)]


@given(max_value=st.integers(0, 2**63 - 1), signed=st.booleans())
def test_smallest_int_dtype_is_the_first_that_fits(max_value: int, signed: bool) -> None:
    dt = smallest_int_dtype(max_value, signed=signed)
    assert np.iinfo(dt).max >= max_value and (np.iinfo(dt).min < 0) == signed
    smaller = [
        d
        for d in ((np.int8, np.int16, np.int32) if signed else (np.uint8, np.uint16, np.uint32))
        if np.dtype(d).itemsize < dt.itemsize
    ]
    assert all(np.iinfo(d).max < max_value for d in smaller)
    ladder = smallest_int_dtype(
        max_value, dtypes=(np.uint16, np.int32, np.int64)
    )  # the corpus files' rule
    assert ladder == (
        np.uint16 if max_value < 1 << 16 else np.int32 if max_value < 1 << 31 else np.int64
    )


def test_smallest_int_dtype_errors() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        smallest_int_dtype(300, dtypes=(np.uint8,))
    with pytest.raises(ValueError, match=">= 0"):
        smallest_int_dtype(-1)


@given(units=st.sets(st.integers(0, 600), max_size=300))
def test_runs_is_the_inverse_of_ranges(units: set[int]) -> None:
    want = sorted(units)
    for given_ids in (want, np.asarray(want, dtype=np.int64)):
        got = runs(given_ids)
        starts = np.asarray([a for a, _ in got], dtype=np.int64)
        lengths = np.asarray([b - a for a, b in got], dtype=np.int64)
        assert ranges(starts, lengths).tolist() == want
        assert all(b < c for (_, b), (c, _) in itertools.pairwise(got))  # disjoint, not touching
