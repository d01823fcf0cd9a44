"""Preprocessed arrays ↔ one Arrow table (a shard of the output shardset), losslessly.

A 1-D array is a column; an ``n × d1 × ...`` array (images, padded sequences) a nested
``fixed_size_list`` column (as :class:`~datamill.preprocessing.hdf5.HDF5Source` reads HDF5); a
:class:`~datamill.preprocessing.features.base.CSR` (set, bag) a ``large_list<int32>`` column of its
indices, plus ``<key>__values`` (``large_list<float32>``) when it has weights, the vocabulary size
in the field metadata. :func:`table_to_arrays` inverts :func:`arrays_to_table`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.preprocessing.features.base import CSR

__all__ = ["VALUES_SUFFIX", "arrays_to_table", "table_to_arrays"]

VALUES_SUFFIX = "__values"
_VOCAB = b"datamill.csr.vocab_size"


def _dense(value: NDArray[Any]) -> pa.Array:
    flat = pa.array(np.ascontiguousarray(value).reshape(-1))
    for dim in reversed(value.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, dim)
    return flat


def arrays_to_table(
    arrays: dict[str, NDArray[Any] | CSR], *, uid: str, uids: pa.Array | NDArray[Any]
) -> pa.Table:
    """One block's output arrays as a table: ``uid`` first, then every key in order.

    Examples:
        >>> t = arrays_to_table({"x": np.arange(2.0), "img": np.zeros((2, 1, 2), np.uint8),
        ...                      "s": CSR(np.array([3, 1], np.int32), np.array([0, 2, 2]), 5)},
        ...                     uid="uid", uids=np.array([7, 8]))
        >>> t.column_names, str(t.schema.field("img").type), t["s"].to_pylist()
        ... # doctest: +NORMALIZE_WHITESPACE
        (['uid', 'x', 'img', 's'], 'fixed_size_list<item: fixed_size_list<item: uint8>[2]>[1]', [[3,
        1], []])
        >>> back = table_to_arrays(t, uid="uid")
        >>> back["s"].vocab_size, back["img"].shape, back["x"].tolist()
        (5, (2, 1, 2), [0.0, 1.0])
    """
    fields: list[pa.Field] = [
        pa.field(uid, uids.type if isinstance(uids, pa.Array) else pa.from_numpy_dtype(uids.dtype))
    ]
    columns: list[pa.Array] = [uids if isinstance(uids, pa.Array) else pa.array(uids)]
    for key, value in arrays.items():
        if isinstance(value, CSR):
            offsets = pa.array(np.asarray(value.offsets, np.int64) - int(value.offsets[0]))
            meta = {_VOCAB: str(int(value.vocab_size)).encode()}
            lo, hi = int(value.offsets[0]), int(value.offsets[-1])
            indices = pa.LargeListArray.from_arrays(
                offsets, pa.array(np.asarray(value.indices[lo:hi]))
            )
            fields.append(pa.field(key, indices.type, metadata=meta))
            columns.append(indices)
            if value.values is not None:
                weights = pa.LargeListArray.from_arrays(
                    offsets, pa.array(np.asarray(value.values[lo:hi]))
                )
                fields.append(pa.field(key + VALUES_SUFFIX, weights.type, metadata=meta))
                columns.append(weights)
        else:
            col = _dense(value)
            fields.append(pa.field(key, col.type))
            columns.append(col)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _numpy(col: pa.Array) -> NDArray[Any]:
    shape: list[int] = [len(col)]
    while pa.types.is_fixed_size_list(col.type):
        shape.append(col.type.list_size)
        col = col.flatten()
    out: NDArray[Any] = np.asarray(col.to_numpy(zero_copy_only=False)).reshape(shape)
    return out


def table_to_arrays(
    table: pa.Table, *, uid: str, vocab_sizes: dict[str, int] | None = None
) -> dict[str, NDArray[Any] | CSR]:
    """The arrays of :func:`arrays_to_table` back from a table (the ``uid`` column left out).

    ``vocab_sizes``: key → vocabulary size of the CSR columns (else from the field metadata).
    """
    out: dict[str, NDArray[Any] | CSR] = {}
    for name in table.column_names:
        if name == uid or (
            name.endswith(VALUES_SUFFIX) and name.removesuffix(VALUES_SUFFIX) in table.column_names
        ):
            continue
        col = table.column(name).combine_chunks()
        field = table.schema.field(name)
        if pa.types.is_large_list(col.type):
            vocab = (vocab_sizes or {}).get(name, int((field.metadata or {}).get(_VOCAB, b"0")))
            offsets = np.asarray(col.offsets.to_numpy(), np.int64)
            indices = np.asarray(col.values.to_numpy(zero_copy_only=False))[
                offsets[0] : offsets[-1]
            ]
            values = None
            if name + VALUES_SUFFIX in table.column_names:
                w = table.column(name + VALUES_SUFFIX).combine_chunks()
                values = np.asarray(w.values.to_numpy(zero_copy_only=False))[
                    offsets[0] : offsets[-1]
                ]
            out[name] = CSR(indices, offsets - offsets[0], vocab, values)
        else:
            out[name] = _numpy(col)
    return out
