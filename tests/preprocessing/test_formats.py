"""Every input format Ludwig reads: one dataset written in each, the same tensors; a damaged file
of each format is a located error."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import feather, orc

import datamill
from datamill.core.errors import DataFileError

ROWS = {
    "x": [1.5, 2.0, None, 4.25, 5.0],
    "c": ["red", "blue", "red", None, "green"],
    "y": ["yes", "no", "no", "yes", "no"],
}
CONFIG: dict[str, Any] = {
    "input_features": [
        {"name": "x", "type": "number", "preprocessing": {"normalization": None}},
        {"name": "c", "type": "category"},
    ],
    "output_features": [{"name": "y", "type": "binary"}],
    "preprocessing": {"split": {"type": "none"}},
}


def _df() -> pd.DataFrame:
    return pd.DataFrame(ROWS)


def _fwf(path: Path) -> None:
    lines = ["x     c      y  "]
    for x, c, y in zip(*ROWS.values()):
        lines.append(f"{'' if x is None else x:<6}{'' if c is None else c:<7}{y:<3}")
    path.write_text("\n".join(lines) + "\n")


WRITERS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "csv": (".csv", lambda p: _df().to_csv(p, index=False)),
    "tsv": (".tsv", lambda p: _df().to_csv(p, index=False, sep="\t")),
    "json": (".json", lambda p: p.write_text(json.dumps(pa.table(ROWS).to_pylist()))),
    "jsonl": (".jsonl", lambda p: _df().to_json(p, orient="records", lines=True)),
    "parquet": (".parquet", lambda p: pq.write_table(pa.table(ROWS), p)),
    "feather": (".feather", lambda p: feather.write_feather(pa.table(ROWS), p)),
    "arrow": (".arrow", lambda p: feather.write_feather(pa.table(ROWS), p)),
    "orc": (".orc", lambda p: orc.write_table(pa.table(ROWS), p)),
    "excel": (".xlsx", lambda p: _df().to_excel(p, index=False, engine="openpyxl")),
    "hdf5": (".h5", lambda p: _df().to_hdf(p, key="data", format="table")),
    "fwf": (".fwf", _fwf),
}


def _run(data: Any, config: dict[str, Any] = CONFIG) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return datamill.preprocess(data, config, skip_save=True)


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    return dict(_run(pa.table(ROWS)).data)


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_every_format_gives_the_same_tensors(
    kind: str, tmp_path: Path, expected: dict[str, np.ndarray]
) -> None:
    suffix, write = WRITERS[kind]
    path = tmp_path / f"rows{suffix}"
    write(path)
    out = _run(path)
    for key, want in expected.items():
        np.testing.assert_array_equal(out.data[key], want, err_msg=f"{kind}: {key}")


def test_format_key_reads_any_extension(tmp_path: Path, expected: dict[str, np.ndarray]) -> None:
    path = tmp_path / "rows.dat"
    _fwf(path)
    out = _run(path, {**CONFIG, "preprocessing": {"split": {"type": "none"}, "format": "fwf"}})
    np.testing.assert_array_equal(out.data["x"], expected["x"])
    feather.write_feather(pa.table(ROWS), tmp_path / "rows.bin")
    cfg = {**CONFIG, "preprocessing": {"split": {"type": "none"}, "format": "feather"}}
    np.testing.assert_array_equal(_run(tmp_path / "rows.bin", cfg).data["c"], expected["c"])


def test_a_dataframe_in_the_api(expected: dict[str, np.ndarray]) -> None:
    out = _run(_df())
    for key, want in expected.items():
        np.testing.assert_array_equal(out.data[key], want)


DAMAGED = {
    "json": (".json", b'[{"x": 1.5, "c": "red", "y": "yes"},\n {"x": 2.0, "c": blue}]', 2),
    "feather": (".feather", b"ARROW1\x00\x00garbage-bytes-not-ipc", None),
    "orc": (".orc", b"ORC\x00not really an orc file at all", None),
    "excel": (".xlsx", b"PK\x03\x04not a real zip archive", None),
    "hdf5": (".h5", b"\x89HDF\r\n\x1a\ntruncated", None),
    "parquet": (".parquet", b"PAR1garbagePAR1", None),
    "csv": (".csv", b'x,c,y\n1,"red,yes\n2,blue,no\n', None),
}


@pytest.mark.parametrize("kind", sorted(DAMAGED))
def test_a_damaged_file_is_a_located_error(kind: str, tmp_path: Path) -> None:
    suffix, data, line = DAMAGED[kind]
    path = tmp_path / f"bad{suffix}"
    path.write_bytes(data)
    with pytest.raises(DataFileError) as info:
        _run(path)
    assert info.value.path == str(path)
    if line is not None:
        assert info.value.line == line


def test_a_damaged_fixed_width_file_is_a_located_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.fwf"
    path.write_bytes(b"x     c\n\xff\xfe\x00 broken\n")
    with pytest.raises(DataFileError) as info:
        _run(path)
    assert info.value.path == str(path)
