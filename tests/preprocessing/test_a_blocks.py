"""Block-wise fit/merge and chunked HDF5 writing give exactly the one-block result, for every
type."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.core.errors import ConfigError
from datamill.preprocessing import api, executors, pipeline
from datamill.preprocessing.features.base import CSR

ROWS = 23
CFG = {
    "input_features": [
        {"name": "n", "type": "number", "preprocessing": {"normalization": "iq"}},
        {
            "name": "z",
            "type": "number",
            "preprocessing": {
                "normalization": "zscore",
                "missing_value_strategy": "fill_with_mean",
            },
        },
        {"name": "c", "type": "category", "preprocessing": {"most_common": 3}},
        {"name": "b", "type": "binary"},
        {"name": "s", "type": "set"},
        {"name": "sc", "column": "s", "type": "set", "preprocessing": {"max_dense_bytes": 0}},
        {"name": "g", "type": "bag", "preprocessing": {"max_dense_bytes": 0}},
        {"name": "q", "type": "sequence"},
        {"name": "t", "type": "text"},
        {"name": "ts", "type": "timeseries"},
    ]
}


def _table(seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    words = np.array(["a", "b", "c", "dd", "e"])

    def toks(k: int) -> list[str | None]:
        return [
            None if rng.random() < 0.1 else " ".join(rng.choice(words, rng.integers(1, k + 1)))
            for _ in range(ROWS)
        ]

    return pa.table(
        {
            "n": rng.normal(size=ROWS),
            "z": [None if rng.random() < 0.2 else float(v) for v in rng.integers(0, 50, ROWS)],
            "c": [None if rng.random() < 0.1 else str(v) for v in rng.integers(0, 6, ROWS)],
            "b": rng.choice(["yes", "no"], ROWS),
            "s": toks(3),
            "g": toks(4),
            "q": toks(5),
            "t": toks(6),
            "ts": [
                " ".join(str(x) for x in rng.integers(0, 9, rng.integers(1, 5)))
                for _ in range(ROWS)
            ],
        }
    )


def _same(a: dict, b: dict) -> None:  # type: ignore[type-arg]
    assert sorted(a) == sorted(b)
    for k, va in a.items():
        vb = b[k]
        if isinstance(va, CSR):
            assert isinstance(vb, CSR)
            np.testing.assert_array_equal(va.indices, vb.indices)
            np.testing.assert_array_equal(va.offsets, vb.offsets)
        else:
            np.testing.assert_allclose(va, vb, rtol=1e-6, atol=1e-9, err_msg=k)


@settings(max_examples=8)
@given(st.integers(0, 10_000), st.sampled_from([1, 4, 7, 22]), st.sampled_from([1, 2, 3]))
def test_blocks_equal_one_block(seed: int, block: int, threads: int) -> None:
    """Blocks fitted and transformed by 1-3 worker threads give what one block gives."""
    import tempfile

    table = _table(seed)
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "d.parquet"
        pq.write_table(table, p)
        one = api.preprocess(p, CFG, output_dir=Path(tmp) / "one")
        one_data, one_meta = api.load(one.hdf5_path)  # type: ignore[arg-type]
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(pipeline, "BLOCK_ROWS", block)
            mp.setattr(executors, "THREADS", threads)
            many = api.preprocess(p, CFG, output_dir=Path(tmp) / "many")
        many_data, many_meta = api.load(many.hdf5_path)  # type: ignore[arg-type]
    _same(one_data, many_data)
    for name in one_meta.features:
        _approx_equal(one_meta[name], many_meta[name], name)


def _approx_equal(a: object, b: object, where: str) -> None:
    """Equal JSON documents, floats up to rounding (merged means/variances differ in the last
    bits)."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), where
    elif isinstance(a, dict) and isinstance(b, dict):
        assert sorted(a) == sorted(b), where
        for k in a:
            _approx_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _approx_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_csv_tsv_parquet_jsonl_and_dataframe_agree(tmp_path: Path) -> None:
    import pandas as pd

    table = _table(3)
    df = table.to_pandas()
    df.to_csv(tmp_path / "d.csv", index=False)
    df.to_csv(tmp_path / "d.tsv", index=False, sep="\t")
    pq.write_table(table, tmp_path / "d.parquet")
    df.to_json(tmp_path / "d.jsonl", orient="records", lines=True)
    ref = api.preprocess(table, CFG)
    for name in ("d.csv", "d.tsv", "d.parquet", "d.jsonl"):
        out = api.preprocess(tmp_path / name, CFG, output_dir=tmp_path / name.replace(".", "_"))
        _same(ref.data, out.data)
    _same(ref.data, api.preprocess(pd.DataFrame(df), CFG).data)


def test_thread_count_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAMILL_THREADS", "3")
    assert executors.thread_count() == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("DATAMILL_THREADS", bad)
        with pytest.raises(ConfigError, match="DATAMILL_THREADS must be a positive integer"):
            executors.thread_count()
    monkeypatch.delenv("DATAMILL_THREADS")
    assert 1 <= executors.thread_count() <= 4
