"""Collation rules: zero-copy fixed-size tensors, ragged padding with masks, nulls, slices,
strings."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.core.errors import ConfigError
from datamill.loader.collate import OFFSETS_SUFFIX, collate_numpy, resolve_collate, to_numpy


def _tensor(data: np.ndarray) -> pa.Array:
    flat = pa.array(data.reshape(-1))
    for dim in reversed(data.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, dim)
    return flat


def test_nested_fixed_size_list_is_a_view_of_the_arrow_buffer() -> None:
    data = np.arange(6 * 2 * 3, dtype=np.float32).reshape(6, 2, 3)
    arr = _tensor(data).slice(2, 3)  # the slice offset must be honoured
    out = to_numpy(arr)
    assert out.shape == (3, 2, 3) and out.dtype == np.float32
    np.testing.assert_array_equal(out, data[2:5])
    assert not out.flags.owndata  # no copy


def test_ragged_lists_padded_with_mask_including_nulls_and_slices() -> None:
    col = pa.array([[1, 2], None, [], [3, 4, 5], [6]], type=pa.list_(pa.int32())).slice(1)
    out = collate_numpy(pa.table({"ids": col}))
    assert out["ids"].dtype == np.int32
    assert out["ids"].tolist() == [[0, 0, 0], [0, 0, 0], [3, 4, 5], [6, 0, 0]]
    assert out["ids_mask"].tolist() == [[False] * 3, [False] * 3, [True] * 3, [True, False, False]]
    large = collate_numpy(
        pa.table({"w": pa.array([["a"], ["b", "c"]], type=pa.large_list(pa.string()))})
    )
    assert large["w"].tolist() == [["a", None], ["b", "c"]]
    assert large["w_mask"].tolist() == [[True, False], [True, True]]


def test_list_of_fixed_size_vectors_pads_to_3d() -> None:
    inner = _tensor(np.arange(10, dtype=np.int64).reshape(5, 2))
    col = pa.ListArray.from_arrays(pa.array([0, 2, 5], type=pa.int32()), inner)
    out = collate_numpy(pa.table({"v": col}))
    assert out["v"].shape == (2, 3, 2)
    assert out["v"][0].tolist() == [[0, 1], [2, 3], [0, 0]] and out["v"][1, 2].tolist() == [8, 9]


def test_scalars_strings_dictionaries_and_empty_batches() -> None:
    table = pa.table(
        {
            "f": pa.array([1.5, None]),
            "b": [True, False],
            "s": ["x", None],
            "d": pa.array(["u", "v"]).dictionary_encode(),
            "i": pa.array([1, None], type=pa.int64()),
        }
    )
    out = collate_numpy(table)
    assert out["b"].dtype == bool and out["s"].dtype == object and out["s"].tolist() == ["x", None]
    assert out["d"].tolist() == ["u", "v"] and np.isnan(out["f"][1]) and np.isnan(out["i"][1])
    empty = collate_numpy(
        pa.table({"ids": pa.array([], type=pa.list_(pa.int64())), "x": pa.array([], pa.int8())})
    )
    assert empty["ids"].shape == (0, 0) and empty["x"].shape == (0,)


def test_multi_chunk_columns() -> None:
    col = pa.chunked_array([pa.array([[1], [2, 3]]), pa.array([[4, 5, 6]])])
    out = collate_numpy(pa.table({"c": col}))
    assert out["c"].tolist() == [[1, 0, 0], [2, 3, 0], [4, 5, 6]]


def test_unknown_collate_lists_choices() -> None:
    with pytest.raises(ConfigError, match="'arrow', 'numpy', 'torch'"):
        resolve_collate("jax")


@given(
    blobs=st.lists(st.one_of(st.none(), st.binary(max_size=30)), max_size=20),
    start=st.integers(0, 5),
    large=st.booleans(),
)
def test_binary_columns_are_their_bytes_and_offsets(
    blobs: list[bytes | None], start: int, large: bool
) -> None:
    col = pa.array(blobs, pa.large_binary() if large else pa.binary()).slice(start)
    out = collate_numpy(pa.table({"img": col}))
    values, offsets = out["img"], out["img" + OFFSETS_SUFFIX]
    assert values.dtype == np.uint8 and offsets.dtype == np.int64
    assert len(offsets) == len(col) + 1 and offsets[0] == 0 and offsets[-1] == len(values)
    got = [values[offsets[i] : offsets[i + 1]].tobytes() for i in range(len(col))]
    assert got == [b or b"" for b in blobs[start:]]  # a null is empty
    as_bytes = collate_numpy(pa.table({"img": col}), binary="bytes")
    assert list(as_bytes) == ["img"] and as_bytes["img"].dtype == object
    assert as_bytes["img"].tolist() == blobs[start:]


def test_binary_bytes_are_a_view_of_the_arrow_buffer_not_python_objects() -> None:
    col = pa.array([b"a" * 3000, b"b" * 3000, b"c" * 10]).slice(1)
    values = collate_numpy(pa.table({"img": col}))["img"]
    assert not values.flags.owndata  # no copy: the bytes stay in Arrow's buffer
    data = col.buffers()[2]
    assert values.ctypes.data == data.address + 3000  # starts at the slice's first sample


def test_binary_output_option_is_checked() -> None:
    with pytest.raises(ConfigError, match="'offsets' or 'bytes'"):
        collate_numpy(pa.table({"img": [b"x"]}), binary="objects")  # type: ignore[arg-type]
