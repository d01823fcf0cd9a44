"""numpy <-> Arrow from buffers: the same arrays as pyarrow's own conversions, slices included."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.arrow import from_numpy, large_strings, list_array, to_numpy

DTYPES = [
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint32,
    np.uint64,
    np.float32,
    np.float64,
    np.bool_,
]


@given(
    dtype=st.sampled_from(DTYPES),
    n=st.integers(0, 200),
    lo=st.integers(0, 50),
    seed=st.integers(0, 2**32 - 1),
)
def test_round_trip_equals_pyarrow(dtype: type, n: int, lo: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = (rng.integers(0, 2, n) if dtype is np.bool_ else rng.integers(0, 100, n)).astype(dtype)
    arr = from_numpy(values)
    assert arr.equals(pa.array(values))
    sliced = arr.slice(min(lo, n))
    np.testing.assert_array_equal(to_numpy(sliced), values[min(lo, n) :])
    assert to_numpy(sliced).dtype == np.dtype(dtype)


@given(texts=st.lists(st.text(max_size=8), max_size=20))
def test_large_strings_equal_pyarrow(texts: list[str]) -> None:
    assert large_strings(texts).equals(pa.array(texts, pa.large_string()))


def test_list_array_and_errors() -> None:
    got = list_array(np.array([0, 2, 2, 3]), np.array([7, 8, 9], dtype=np.int32))
    assert got.to_pylist() == [[7, 8], [], [9]]
    import pytest

    with pytest.raises(ValueError, match="no nulls"):
        to_numpy(pa.array([1, None]))
    with pytest.raises(TypeError):
        from_numpy(np.array(["a"]))
