"""Feature names Ludwig accepts (``/``, spaces, dots, ``%``) are accepted; the HDF5 file escapes
``/`` and ``%``."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pytest

import datamill
from datamill.core.errors import ConfigError
from datamill.preprocessing import api
from datamill.preprocessing.hdf5 import HDF5Source, hdf5_name, key_of

NAMES = ["bill/length (mm)", "island name", "a.b", "100%", ".", "x/y/z"]


def test_ludwig_feature_names_round_trip_through_hdf5_and_metadata(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text(
        "bill/length (mm),island name,a.b,100%,.,x/y/z\n1.5,Dream,x y,3,1,a\n2.5,Biscoe,y,4,2,b\n"
    )
    cfg = {
        "input_features": [
            {"name": NAMES[0], "type": "number"},
            {"name": NAMES[1], "type": "category"},
            {"name": NAMES[2], "type": "text"},
            {"name": NAMES[3], "type": "number"},
            {"name": NAMES[4], "type": "number"},
            {"name": NAMES[5], "type": "set"},
        ],
        "preprocessing": {"split": {"type": "none"}},
    }
    out = api.preprocess(csv, cfg)
    assert out.metadata.features == NAMES  # metadata keys: the names as written (as Ludwig's)
    with h5py.File(out.hdf5_path) as f:  # the documented mapping inside the file
        assert sorted(f.keys()) == sorted(
            [
                "bill%2Flength (mm)",
                "island name",
                "a.b_char",
                "a.b_word",
                "100%25",
                "%2E",
                "x%2Fy%2Fz",
            ]
        )
    arrays, meta = datamill.load(out.hdf5_path)
    assert sorted(arrays) == sorted(
        ["bill/length (mm)", "island name", "a.b_char", "a.b_word", "100%", ".", "x/y/z"]
    )
    np.testing.assert_array_equal(arrays["bill/length (mm)"], out.data["bill/length (mm)"])
    assert meta.decode("island name", arrays["island name"]).tolist() == ["Dream", "Biscoe"]
    shard = HDF5Source(out.hdf5_path).read_shard(0, columns=["x/y/z", "100%"])
    assert shard.column_names == ["x/y/z", "100%"] and shard.num_rows == 2
    assert api.preprocess(csv, cfg).cached  # the cache finds the file again


@pytest.mark.parametrize("name", ["a/b", "%2F", "%", "a%2Fb/c", "..", "."])
def test_hdf5_name_is_reversible_and_has_no_slash(name: str) -> None:
    assert "/" not in hdf5_name(name) and hdf5_name(name) not in (".", "..")
    assert key_of(hdf5_name(name)) == name


def test_the_metadata_header_name_is_still_refused() -> None:
    with pytest.raises(ConfigError) as info:
        api.preprocess(
            pa.table({"datamill": [1.0, 2.0]}),
            {"input_features": [{"name": "datamill", "type": "number"}]},
        )
    assert "datamill" in str(info.value)
