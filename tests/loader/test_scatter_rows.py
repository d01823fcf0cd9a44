"""``scatter_rows`` equals numpy's ``dst[at] = src[rows]`` for every array the gathers hand it."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.loader.stages import scatter_rows

DTYPES = [np.int8, np.int16, np.int32, np.int64, np.float32, np.float64, np.bool_]


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(DTYPES),
    st.sampled_from(DTYPES),
    st.lists(st.integers(0, 4), max_size=2),
    st.integers(1, 30),
    st.integers(1, 20),
    st.booleans(),
    st.sampled_from(["C", "strided", "F"]),
    st.randoms(use_true_random=False),
)
def test_scatter_rows_equals_numpys_fancy_assignment(
    src_type: type,
    dst_type: type,
    inner: list[int],
    n_src: int,
    n_dst: int,
    strided: bool,
    dst_layout: str,
    rnd: Any,
) -> None:
    shape = tuple(inner)
    rng = np.random.default_rng(rnd.randrange(1 << 30))
    base: np.ndarray = (rng.integers(-100, 100, (n_src * (2 if strided else 1), *shape))).astype(
        src_type
    )
    src = base[::2] if strided else base  # a view that is not C-contiguous
    k = rng.integers(1, n_dst + 1)
    at = rng.permutation(n_dst)[:k]
    rows = rng.integers(0, len(src), k)
    want: np.ndarray = np.full((n_dst, *shape), 7).astype(dst_type)
    room: np.ndarray = np.full((2 * n_dst, *shape), 7).astype(dst_type)
    if dst_layout == "F":
        room = np.asfortranarray(room)
    # written in place: rows one after the other, every other row, or column-major
    got = room[::2] if dst_layout == "strided" else room[:n_dst]
    before = room.copy()
    want[at] = src[rows]
    scatter_rows(got, at, src, rows)
    assert got.dtype == want.dtype
    assert np.array_equal(got, want)
    rest = slice(1, None, 2) if dst_layout == "strided" else slice(n_dst, None)
    assert np.array_equal(room[rest], before[rest])  # nothing written beside the rows


def test_rows_move_whole_into_a_slice_of_a_larger_buffer() -> None:
    """The gathers hand it a column's region of a shared block (a C-contiguous view): rows land
    there and nowhere else."""
    buf = np.zeros(40, dtype=np.uint8)
    dst = buf[8:32].view(np.float32).reshape(3, 2)
    src = np.arange(10, dtype=np.float32).reshape(5, 2)
    scatter_rows(dst, np.array([1, 2, 0]), src, np.array([4, 0, 2]))
    assert dst.tolist() == [[4, 5], [8, 9], [0, 1]]
    assert not buf[:8].any() and not buf[32:].any()
