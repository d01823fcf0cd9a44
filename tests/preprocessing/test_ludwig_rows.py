"""The rows Ludwig 0.17.10 picks, against its stored output (``benchmarks/bench_ludwig_rows.py``).

``tests/fixtures/ludwig/rows.csv`` is the generated table; ``rows_ludwig.json`` holds Ludwig's
answer for each config (the ``Id`` of every row in each split, metadata fields, refusals).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest
from hypothesis import given
from hypothesis import strategies as st

import datamill
from datamill.core.errors import ConfigError, DataFileError
from datamill.preprocessing.ludwig_rows import _json_strings, hash_split, sample_ranks
from datamill.preprocessing.result import Preprocessed

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/ludwig"
ROWS = FIXTURE / "rows.csv"
LUDWIG = json.loads((FIXTURE / "rows_ludwig.json").read_text())
SPLITS = ("training", "validation", "test")


def _run(name: str, data: Any = ROWS) -> Preprocessed:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return datamill.preprocess(data, LUDWIG["configs"][name], skip_save=True)


def _ids(out: Preprocessed) -> dict[str, list[int]]:
    ids = out.data["Id"].astype(np.int64)
    return {s: sorted(ids[out.data["split"] == k].tolist()) for k, s in enumerate(SPLITS)}


def _ludwig_ids(name: str, *, missing_key_kept: bool = True) -> dict[str, list[int]]:
    ids = {s: list(v) for s, v in LUDWIG["ludwig"][name]["ids"].items()}
    if (
        missing_key_kept
    ):  # Ludwig drops the row whose split key is missing (Id 9); datamill keeps it
        ids["test"] = sorted([*ids["test"], 9])
    return ids


def test_hash_split_gives_ludwigs_rows_for_string_keys() -> None:
    # cause (a): md5 of the value's JSON, then crc32; non-ASCII and quoted keys included
    assert _ids(_run("hash_str")) == _ludwig_ids("hash_str")


def test_hash_split_gives_ludwigs_rows_for_integer_keys() -> None:
    assert _ids(_run("hash_int")) == _ludwig_ids("hash_int", missing_key_kept=False)


def test_hash_split_types_the_key_as_ludwig_reads_it() -> None:
    # a CSV is read as strings by Ludwig (dtype=object): an Arrow table of the same strings agrees
    table = pcsv.read_csv(
        ROWS,
        convert_options=pcsv.ConvertOptions(
            column_types={"num_id": pa.string()}, strings_can_be_null=True
        ),
    )
    assert _ids(_run("hash_int", table)) == _ludwig_ids("hash_int", missing_key_kept=False)
    # typed values hash as Ludwig hashes them (computed with Ludwig 0.17.10's hash_dict + crc32)
    p = (0.5, 0.25, 0.25)
    ints = hash_split(pa.array(range(12)), p, csv=False).tolist()
    assert ints == [2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0]
    floats = hash_split(pa.array([float(v) for v in range(12)]), p, csv=False).tolist()
    assert floats == [0, 1, 2, 0, 0, 1, 0, 1, 0, 1, 0, 2]
    strs = hash_split(pa.array([str(v) for v in range(12)]), p, csv=False).tolist()
    assert strs == [2, 0, 0, 2, 0, 0, 2, 2, 0, 1, 1, 1]
    assert hash_split(pa.array([True, False, None]), p, csv=False).tolist() == [1, 0, 2]
    # a CSV number column read as numbers (a number feature on the key) hashes as its text
    assert hash_split(pa.array([float(v) for v in range(12)]), p, csv=True).tolist() == strs


def test_sample_ratio_keeps_ludwigs_rows_and_count() -> None:
    # cause (b): pandas' df.sample(frac, random_state) is RandomState(seed).permutation(n)[:k]
    out = _run("sample")
    ours = _ids(out)
    assert ours == _ludwig_ids("sample", missing_key_kept=False)
    assert sum(map(len, ours.values())) == sum(map(len, LUDWIG["ludwig"]["sample"]["ids"].values()))


def test_binary_fallback_true_label_is_stored_as_ludwig_stores_it() -> None:
    # cause (c): the first sorted value, also for a Y/N column where it is unused
    out = _run("hash_str")
    for name in ("yn", "hb"):
        want = LUDWIG["ludwig"]["hash_str"]["preprocessing"][name]
        assert out.metadata[name]["fallback_true_label"] == want["meta_fallback_true_label"]
        assert (
            out.metadata[name]["preprocessing"]["fallback_true_label"]
            == (want["fallback_true_label"])
        )
    assert out.metadata["yn"]["fallback_true_label"] == "N"
    # the rows are still read with the conventional strings: Y is true
    raw = pcsv.read_csv(ROWS).column("yn").to_pylist()
    ids = out.data["Id"].astype(np.int64)
    np.testing.assert_array_equal(out.data["yn"], np.array([raw[i] == "Y" for i in ids]))


def test_output_computed_fill_value_under_drop_row_is_ludwigs() -> None:
    # cause (d): nothing is computed under drop_row; Ludwig stores its schema default, <UNK>
    out = _run("hash_str")
    want = LUDWIG["ludwig"]["hash_str"]["preprocessing"]["target"]
    assert want == {
        "fallback_true_label": None,
        "computed_fill_value": "<UNK>",
        "missing_value_strategy": "drop_row",
    }
    assert out.metadata["target"]["preprocessing"]["computed_fill_value"] == "<UNK>"
    assert out.metadata["target"]["preprocessing"]["missing_value_strategy"] == "drop_row"


def test_a_binary_column_of_three_values_is_refused_as_ludwig_refuses_it() -> None:
    assert "expects 2 distinct values" in LUDWIG["ludwig"]["refuse_binary"]["error"]
    with pytest.raises(ConfigError, match="expects 2 distinct values") as info:
        _run("refuse_binary")
    assert info.value.column == "tri"
    # an object column of three values with another strategy is refused too (get_feature_meta)
    cfg = {
        "input_features": [
            {"name": "tri", "type": "binary", "preprocessing": {"missing_value_strategy": "bfill"}}
        ]
    }
    with pytest.raises(DataFileError, match="expects 2 distinct values") as info2:
        datamill.preprocess(ROWS, cfg, skip_save=True)
    assert info2.value.column == "tri" and info2.value.path == str(ROWS)


def test_iq_normalization_with_a_zero_interquartile_range_is_refused() -> None:
    assert "interquartile range is 0" in LUDWIG["ludwig"]["refuse_iq"]["error"]
    with pytest.raises(DataFileError, match="interquartile range is 0") as info:
        _run("refuse_iq")
    assert info.value.column == "const" and info.value.path == str(ROWS)


@given(st.integers(0, 2**32 - 1), st.integers(1, 300), st.floats(0.01, 1.0))
def test_sample_ranks_are_pandas_sample_rows(seed: int, n: int, ratio: float) -> None:
    k = round(ratio * n)
    kept = np.flatnonzero(sample_ranks(seed, n) < k)
    want = np.random.RandomState(seed).choice(n, size=k, replace=False)  # what pandas calls
    assert sorted(kept.tolist()) == sorted(want.tolist())


@given(st.lists(st.text(max_size=8), min_size=1, max_size=20))
def test_hash_split_is_a_function_of_the_value(values: list[str]) -> None:
    col = pa.array(values)
    whole = hash_split(col, (0.7, 0.1, 0.2), csv=False)
    rev = hash_split(pa.array(values[::-1]), (0.7, 0.1, 0.2), csv=False)
    np.testing.assert_array_equal(whole, rev[::-1])


@given(st.lists(st.text(max_size=6), min_size=1, max_size=20))
def test_json_strings_are_json_dumps(values: list[str]) -> None:
    import json

    assert _json_strings(pa.array(values)).to_pylist() == [json.dumps(v) for v in values]
