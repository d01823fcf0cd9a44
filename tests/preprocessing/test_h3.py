"""h3 features: Ludwig's 19 components, checked against the ``h3`` library."""

from __future__ import annotations

from pathlib import Path

import h3.api.basic_int as h3i
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import datamill
from datamill.core.errors import DataFileError
from datamill.preprocessing.features.h3 import h3_components, h3_invalid

NO_SPLIT = {"preprocessing": {"split": {"type": "none"}}}

cells = st.builds(
    h3i.latlng_to_cell,
    st.floats(-89.9, 89.9),
    st.floats(-179.9, 179.9),
    st.integers(0, 15),
)


@given(st.lists(cells, min_size=1, max_size=40))
def test_components_are_the_h3_librarys(values: list[int]) -> None:
    h = np.array(values, np.uint64)
    comp = h3_components(h)
    assert not h3_invalid(h).any()
    for row, cell in zip(comp.tolist(), values):
        res = h3i.get_resolution(cell)
        assert row[:4] == [1, 0, res, h3i.get_base_cell_number(cell)]
        # the digits: the path from the base cell, read from the parents at each resolution
        digits = [h3i.cell_to_parent(cell, r) >> (45 - 3 * r) & 7 for r in range(1, res + 1)]
        assert row[4 : 4 + res] == digits
        assert row[4 + res :] == [7] * (15 - res)


@given(cells, st.integers(0, 63))
def test_invalid_indexes_are_those_the_h3_library_rejects(cell: int, bit: int) -> None:
    flipped = cell ^ (1 << bit)
    if (flipped >> 59) & 15 == 1:  # a cell's mode: the library's is_valid_cell decides
        assert bool(h3_invalid(np.array([flipped], np.uint64))[0]) == (
            not h3i.is_valid_cell(flipped)
        )


def test_pentagon_deleted_subsequence_edges_and_vertices() -> None:
    pentagon = h3i.get_pentagons(3)[0]
    children = h3i.cell_to_children(pentagon, 4)
    assert not h3_invalid(np.array(children, np.uint64)).any()
    k_axis = pentagon & ~(7 << (45 - 3 * 4)) | (1 << (45 - 3 * 4))  # res 3 → 4 with digit 1
    k_axis = (k_axis & ~(15 << 52)) | (4 << 52)
    assert not h3i.is_valid_cell(k_axis) and h3_invalid(np.array([k_axis], np.uint64))[0]
    cell = h3i.latlng_to_cell(37.77, -122.42, 9)
    edge = h3i.cells_to_directed_edge(cell, h3i.grid_ring(cell, 1)[0])
    vertex = h3i.cell_to_vertex(cell, 2)
    comp = h3_components(np.array([edge, vertex], np.uint64))
    assert (
        comp[:, 0].tolist() == [2, 4] and not h3_invalid(np.array([edge, vertex], np.uint64)).any()
    )


def test_h3_feature_end_to_end_with_missing_values_and_ludwigs_fill(tmp_path: Path) -> None:
    cell = h3i.latlng_to_cell(48.85, 2.35, 7)
    path = tmp_path / "places.csv"
    path.write_text(f"loc,y\n{cell},1\n,2\n{cell},3\n")
    cfg = {"input_features": [{"name": "loc", "type": "h3"}], **NO_SPLIT}
    out = datamill.preprocess(path, cfg, skip_save=True)
    x = out.data["loc"]
    assert x.shape == (3, 19) and x.dtype == np.uint8
    assert x[0].tolist() == h3_components(np.array([cell], np.uint64))[0].tolist()
    # a missing value is Ludwig's fill value, a resolution-0 cell
    assert x[1].tolist()[:4] == [1, 0, 0, 0] and x[1].tolist()[4:] == [7] * 15
    meta = out.metadata["loc"]["preprocessing"]
    assert meta["computed_fill_value"] == "576495936675512319"
    # an integer column (Parquet, DataFrame) reads the same
    ints = datamill.preprocess(
        pa.table({"loc": pa.array([cell], pa.uint64())}), cfg, skip_save=True
    )
    assert ints.data["loc"][0].tolist() == x[0].tolist()


@pytest.mark.parametrize(
    ("value", "match"),
    [("8928308280fffff", "expected an H3 index"), ("622236723497533440", "not a valid H3 index")],
)
def test_an_invalid_index_is_a_located_error(tmp_path: Path, value: str, match: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(f"loc\n622236723497533439\n{value}\n")
    cfg = {"input_features": [{"name": "loc", "type": "h3"}], **NO_SPLIT}
    with pytest.raises(DataFileError, match=match) as info:
        datamill.preprocess(path, cfg, skip_save=True)
    assert info.value.line == 3 and info.value.column == "loc" and info.value.path == str(path)
