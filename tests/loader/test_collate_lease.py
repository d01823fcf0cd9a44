"""Lease-level collation equals per-batch collation exactly, and no two batches share memory."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.core.errors import ConfigError, SchemaError
from datamill.loader.collate import collate_numpy, collate_torch
from datamill.loader.collate_lease import (
    block_collate,
    collate_block,
    collate_numpy_batches,
    collate_torch_batches,
)
from tests.strategies import COLUMN_KINDS, LEAF_TYPES, arrow_columns, batch_cuts


def _ipc_batches(columns: list[pa.Array], cuts: list[int]) -> list[pa.RecordBatch]:
    """``columns`` cut into batches of ``cuts`` rows, through an Arrow IPC stream (as a lease)."""
    names = [f"c{i}" for i in range(len(columns))]
    batches, start = [], 0
    for size in cuts:
        batches.append(pa.record_batch([c.slice(start, size) for c in columns], names=names))
        start += size
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for b in batches:
            writer.write_batch(b)
    return list(pa.ipc.open_stream(sink.getvalue().to_pybytes()))


def _same_object(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    return type(a) is type(b) and bool(a == b)


def assert_same_arrays(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """Same keys in the same order, dtypes, shapes, values (NaN where NaN), writeability."""
    assert list(got) == list(want)
    for key, w in want.items():
        g = got[key]
        assert (g.dtype, g.shape) == (w.dtype, w.shape), key
        if w.dtype == object:
            assert all(_same_object(a, b) for a, b in zip(g.ravel(), w.ravel())), key
        else:
            assert np.array_equal(g, w, equal_nan=w.dtype.kind in "fc"), key
        if w.size:  # an empty array's flags depend on whether Arrow allocated a buffer
            assert g.flags.writeable == w.flags.writeable, key


def _per_batch(batches: list[pa.RecordBatch], binary: Any) -> list[dict[str, np.ndarray]] | type:
    try:
        return [collate_numpy(pa.Table.from_batches([b]), binary=binary) for b in batches]
    except Exception as exc:  # noqa: BLE001 - the lease-level function must raise it too
        return type(exc)


@st.composite
def leases(draw: st.DrawFn) -> tuple[list[pa.Array], list[int]]:
    n = draw(st.integers(0, 40))
    columns = draw(st.lists(arrow_columns(n), min_size=1, max_size=6))
    return columns, draw(batch_cuts(n))


@given(lease=leases(), binary=st.sampled_from(["offsets", "bytes"]))
def test_lease_collation_equals_per_batch_collation(
    lease: tuple[list[pa.Array], list[int]], binary: Any
) -> None:
    columns, cuts = lease
    batches = _ipc_batches(columns, cuts)
    want = _per_batch(batches, binary)
    if isinstance(want, type):  # e.g. a null in a fixed-size list: its batch cannot reshape
        with pytest.raises(want):
            collate_numpy_batches(batches, binary=binary)
        return
    got = collate_numpy_batches(batches, binary=binary)
    assert len(got) == len(want) == len(cuts)
    for g, w in zip(got, want):
        assert_same_arrays(g, w)


@given(lease=leases())
def test_block_collation_equals_collate_numpy_of_each_slice(
    lease: tuple[list[pa.Array], list[int]],
) -> None:
    """A built block (in-memory columns, writeable buffers) cut into batches: the arrays of
    collate_numpy on each batch's slice, writeability included (a direct client's batches are
    the in-process Loader's)."""
    columns, cuts = lease
    table = pa.table(columns, names=[f"c{i}" for i in range(len(columns))])
    starts = np.concatenate([[0], np.cumsum(cuts)]).tolist()
    try:
        want = [collate_numpy(table.slice(a, n)) for a, n in zip(starts, cuts)]
    except Exception as exc:  # noqa: BLE001 - the block function must raise it too
        with pytest.raises(type(exc)):
            collate_block(table, cuts)
        return
    got = collate_block(table, cuts)
    assert len(got) == len(want) == len(cuts)
    for g, w in zip(got, want):
        assert_same_arrays(g, w)
    assert [d.keys() for d in block_collate(collate_numpy)(table, cuts)] == [d.keys() for d in want]


_CASES = [
    *[("number", t) for t in LEAF_TYPES],
    *[("fixed_size_list", t) for t in (pa.int16(), pa.uint64(), pa.float32(), pa.bool_())],
    *[(kind, None) for kind in COLUMN_KINDS if kind not in ("number", "fixed_size_list")],
]


# 15 examples per type, not the profile's 40: the 21 types make 315 (840 before, 59 s of a
# whole-suite run at load 9); each type's space is small (nulls or not, n <= 30, four kinds of
# cuts, two columns), and test_lease_collation_equals_per_batch_collation mixes the types with the
# profile's count.
@pytest.mark.parametrize(("kind", "leaf"), _CASES, ids=[f"{k}-{t}" for k, t in _CASES])
@settings(max_examples=15)
@given(data=st.data())
def test_each_column_type(kind: str, leaf: pa.DataType | None, data: Any) -> None:
    """Every type (with and without nulls), in size-1 batches, one batch, batches with a shorter
    last one, or random cuts (empty batches included)."""
    n = data.draw(st.integers(1, 30))
    columns = [data.draw(arrow_columns(n, kind, leaf)) for _ in range(2)]
    special = [[1] * n, [n], [*[4] * (n // 4), n % 4]]
    cuts = data.draw(st.one_of(st.sampled_from(special), batch_cuts(n)))
    batches = _ipc_batches(columns, cuts)
    for binary in ("offsets", "bytes"):
        want = _per_batch(batches, binary)
        if isinstance(want, type):
            with pytest.raises(want):
                collate_numpy_batches(batches, binary=binary)
            continue
        for g, w in zip(collate_numpy_batches(batches, binary=binary), want, strict=True):
            assert_same_arrays(g, w)


def test_sliced_batches_not_from_ipc() -> None:
    """Batches that are slices of in-memory arrays (offsets into shared buffers) give the same
    values as per batch (writeability aside: these buffers are writeable)."""
    table = pa.table(
        {
            "i": pa.array([1, None, 3, 4, 5, 6], pa.int16()),
            "f": pa.array([[1.0, 2.0], [3.0, 4.0]] * 3, pa.list_(pa.float32(), 2)),
            "b": pa.array([b"ab", None, b"", b"c", b"dd", b"e"]),
            "s": ["a", None, "c", "d", "e", "f"],
        }
    ).slice(1)
    batches = table.to_batches(max_chunksize=2)
    for got, batch in zip(collate_numpy_batches(batches), batches, strict=True):
        want = collate_numpy(pa.Table.from_batches([batch]))
        assert list(got) == list(want)
        for key in want:
            assert got[key].dtype == want[key].dtype
            assert np.array_equal(got[key], want[key], equal_nan=want[key].dtype.kind == "f")


def test_batches_do_not_share_memory_numpy() -> None:
    batches = _ipc_batches(
        [
            pa.array([True, False, None, True]),
            pa.array([1, None, 3, 4], pa.int32()),
            pa.array([b"ab", b"cd", None, b"ef"]),
        ],
        [2, 2],
    )
    first, second = collate_numpy_batches(batches)
    before = {k: v.copy() for k, v in second.items()}
    for key, arr in first.items():
        assert not any(np.shares_memory(arr, other) for other in second.values()), key
        if arr.flags.writeable and arr.size:  # a training loop mutating its batch in place
            arr[...] = None if arr.dtype == object else 0
    for key, value in before.items():
        np.testing.assert_array_equal(second[key], value)


@pytest.mark.torch
def test_torch_batches_equal_collate_torch_and_do_not_share_memory() -> None:
    torch = pytest.importorskip("torch")
    columns = [
        pa.array(np.arange(12, dtype=np.int64)),
        pa.array(np.arange(12, dtype=np.int8)),
        pa.array([1.5, None] * 6, pa.float32()),
        pa.array([[1, 2]] * 12, pa.list_(pa.uint8(), 2)),
        pa.array([b"xy", b"z", None] * 4),
        pa.array([[1], [2, 3], []] * 4, pa.list_(pa.int32())),
        pa.array(["a", "b", None] * 4),
    ]
    batches = _ipc_batches(columns, [5, 5, 2])
    got = collate_torch_batches(batches)
    for g, batch in zip(got, batches, strict=True):
        want = collate_torch(pa.Table.from_batches([batch]))
        assert list(g) == list(want)
        for key, w in want.items():
            if isinstance(w, list):
                assert g[key] == w
            else:
                assert g[key].dtype == w.dtype and torch.equal(
                    g[key].nan_to_num(7), w.nan_to_num(7)
                )
    snapshot = [{k: v.clone() for k, v in d.items() if not isinstance(v, list)} for d in got]
    for d in got[:2]:  # a training loop mutating its batch in place
        for v in d.values():
            if not isinstance(v, list):
                v.fill_(0)
    for key, v in snapshot[2].items():
        assert torch.equal(got[2][key].nan_to_num(7), v.nan_to_num(7)), key


def test_errors() -> None:
    batch = pa.record_batch([pa.array([1])], names=["x"])
    with pytest.raises(ConfigError, match="'offsets' or 'bytes'"):
        collate_numpy_batches([batch], binary="objects")  # type: ignore[arg-type]
    other = pa.record_batch([pa.array(["a"])], names=["x"])
    with pytest.raises(SchemaError, match="one schema"):
        collate_numpy_batches([batch, other])
    with pytest.raises(TypeError):
        collate_numpy_batches([pa.table({"x": [1]})])  # type: ignore[list-item]
    assert collate_numpy_batches([]) == []
    assert collate_numpy_batches([pa.record_batch([], names=[])]) == [{}]


@pytest.mark.torch
@given(lease=leases(), binary=st.sampled_from(["offsets", "bytes"]))
def test_lease_torch_collation_equals_collate_torch(
    lease: tuple[list[pa.Array], list[int]], binary: Any
) -> None:
    torch = pytest.importorskip("torch")
    batches = _ipc_batches(*lease)
    try:
        want = [collate_torch(pa.Table.from_batches([b]), binary=binary) for b in batches]
    except Exception as exc:  # noqa: BLE001 - the lease-level function must raise it too
        with pytest.raises(type(exc)):
            collate_torch_batches(batches, binary=binary)
        return
    for got, w in zip(collate_torch_batches(batches, binary=binary), want, strict=True):
        assert list(got) == list(w)
        for key, value in w.items():
            g = got[key]
            if isinstance(value, list):
                assert len(g) == len(value)
                assert all(_same_object(a, b) for a, b in zip(g, value)), key
                continue
            assert isinstance(g, torch.Tensor) and (g.dtype, g.shape) == (value.dtype, value.shape)
            a, b = g.numpy(), value.numpy()
            assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), key


@pytest.mark.torch
def test_block_torch_collation_equals_collate_torch_of_each_slice() -> None:
    torch = pytest.importorskip("torch")
    table = pa.table(
        {
            "i": pa.array([1, 2, 3, 4, 5], pa.int16()),
            "f": pa.array([[1.0, 2.0]] * 5, pa.list_(pa.float32(), 2)),
            "s": ["a", "b", "c", "d", "e"],
        }
    )
    got = block_collate(collate_torch)(table, [2, 3])
    for g, (a, n) in zip(got, [(0, 2), (2, 3)], strict=True):
        want = collate_torch(table.slice(a, n))
        assert list(g) == list(want) and g["s"] == want["s"]
        for key in ("i", "f"):
            assert isinstance(g[key], torch.Tensor) and g[key].dtype == want[key].dtype
            assert torch.equal(g[key], want[key])
    got[0]["i"][0] = 9  # batches do not share memory
    assert got[1]["i"].tolist() == [3, 4, 5]
