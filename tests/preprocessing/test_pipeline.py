"""The pipeline seams: handler registry attributes, block-wise fills and split, executors, sinks,
picklable stages."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import pickle
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.core.errors import ConfigError
from datamill.core.parallel import ordered_map
from datamill.preprocessing import api, executors, pipeline
from datamill.preprocessing.config import SplitConfig, defaults_keys, load_config
from datamill.preprocessing.executors import LocalExecutor
from datamill.preprocessing.features import CSR, FEATURE_TYPES, handler_class
from datamill.preprocessing.features.base import REQUIRED_ATTRIBUTES, FeatureHandler
from datamill.preprocessing.missing import STRATEGIES
from datamill.preprocessing.sinks import MemorySink
from datamill.preprocessing.split import random_split, uniform_at

T = TypeVar("T")
R = TypeVar("R")


# -- registry --------------------------------------------------------------------------------------
@pytest.mark.parametrize("type_name", sorted(FEATURE_TYPES))
def test_every_registered_type_declares_every_required_attribute(type_name: str) -> None:
    cls = handler_class(type_name)
    for attr in REQUIRED_ATTRIBUTES:
        assert hasattr(cls, attr), attr
    assert cls.type_name == type_name and cls.input_type in ("string", "float64", "binary")
    assert cls.missing_value_strategy in cls.strategies and set(cls.strategies) <= set(STRATEGIES)
    assert defaults_keys()[cls.defaults_key] == type_name


def test_a_handler_missing_an_attribute_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("datamill_test_fake_feature")

    class Handler(
        FeatureHandler
    ):  # a new type that forgets its missing-value defaults and defaults key
        type_name = "fake"
        Params = handler_class("number").Params
        input_type = "string"

        def fit(self, column: Any, params: Any, ctx: Any) -> Any:
            return None

        def merge(self, a: Any, b: Any) -> Any:
            return None

        def finalize(self, stats: Any, params: Any, ctx: Any) -> dict[str, Any]:
            return {}

        def transform(self, column: Any, meta: Any, params: Any, ctx: Any) -> dict[str, Any]:
            return {}

    Handler.__module__ = module.__name__
    module.Handler = Handler  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(FEATURE_TYPES, "fake", module.__name__)
    handler_class.cache_clear()
    try:
        with pytest.raises(
            TypeError, match="does not define defaults_key, fill_value, missing_value_strategy"
        ):
            handler_class("fake")
    finally:
        handler_class.cache_clear()
    assert not issubclass(ConfigError, TypeError)  # a programming error, not a config error


def test_global_defaults_keys_come_from_the_handlers() -> None:
    cfg, _ = load_config(
        {
            "input_features": [{"name": "a", "type": "text"}],
            "preprocessing": {"text": {"lowercase": False}},
        }
    )
    assert cfg.preprocessing.type_defaults("text") == {"lowercase": False}
    with pytest.raises(ConfigError) as info:
        load_config(
            {"input_features": [{"name": "a", "type": "text"}], "preprocessing": {"txt": {}}}
        )
    assert info.value.where == "preprocessing" and "'txt'" in str(info.value)  # type: ignore[attr-defined]


def test_datamill_preprocess_is_only_the_function() -> None:
    import datamill.preprocessing

    assert (
        isinstance(datamill.preprocess, types.FunctionType)
        and datamill.preprocess is api.preprocess
    )
    assert datamill.load is api.load


# -- split -----------------------------------------------------------------------------------------
@given(seed=st.integers(0, 2**63 - 1), cuts=st.lists(st.integers(0, 500), max_size=4))
def test_random_split_is_a_pure_function_of_the_row_index(seed: int, cuts: list[int]) -> None:
    cfg = SplitConfig(probabilities=(0.6, 0.3, 0.1))
    whole = random_split(cfg, seed=seed, lo=0, hi=500, num_rows=500)
    bounds = [0, *sorted(cuts), 500]
    parts = [
        random_split(cfg, seed=seed, lo=a, hi=b, num_rows=500)
        for a, b in itertools.pairwise(bounds)
    ]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    assert np.bincount(whole, minlength=3).tolist() == [300, 150, 50]  # exact sizes
    u = uniform_at(seed, 0, 500)
    assert ((u >= 0) & (u < 1)).all()


def test_random_split_same_for_any_block_size() -> None:
    t = pa.table({"x": np.arange(3000, dtype=np.float64)})
    cfg = {
        "input_features": [{"name": "x", "type": "number"}],
        "preprocessing": {"split": {"probabilities": [0.5, 0.25, 0.25]}, "seed": 3},
    }
    one = api.preprocess(t, cfg)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "BLOCK_ROWS", 7)
        many = api.preprocess(t, cfg)
    np.testing.assert_array_equal(one.data["split"], many.data["split"])
    assert one.metadata.header["split"] == many.metadata.header["split"]
    assert sum(one.metadata.header["split"].values()) == 3000


# -- fills across blocks ---------------------------------------------------------------------------
def _nullable(draw: Any, values: list[Any], n: int) -> list[Any]:
    return [None if draw(st.booleans()) else values[i % len(values)] for i in range(n)]


@settings(max_examples=15)
@given(
    data=st.data(),
    block=st.integers(1, 9),
    threads=st.sampled_from([1, 3]),
    strategy=st.sampled_from(["ffill", "bfill", "fill_with_mode", "drop_row"]),
    split=st.booleans(),
)
def test_fills_across_blocks_equal_one_block(
    data: Any, block: int, threads: int, strategy: str, split: bool
) -> None:
    """ffill/bfill carry values across block boundaries, mode merges counts: the output equals one
    block's."""
    n = data.draw(st.integers(1, 30))
    table = pa.table(
        {
            "c": _nullable(data.draw, ["x", "y", "zz"], n),
            "n": _nullable(data.draw, [1.0, 2.5, -3.0], n),
            "t": _nullable(data.draw, ["a b", "b", "c a"], n),
            "s": ["train", "test"] * (n // 2) + ["train"] * (n % 2),
        }
    )
    feats = [
        {"name": "c", "type": "category", "preprocessing": {"missing_value_strategy": strategy}},
        {
            "name": "n",
            "type": "number",
            "preprocessing": {
                "missing_value_strategy": "ffill" if strategy == "drop_row" else strategy
            },
        },
        {
            "name": "t",
            "type": "sequence",
            "preprocessing": {
                "missing_value_strategy": "bfill" if strategy == "drop_row" else strategy
            },
        },
    ]
    cfg: dict[str, Any] = {"input_features": feats}
    if split:
        cfg["preprocessing"] = {"split": {"type": "fixed", "column": "s"}}
    if strategy == "drop_row" and table["c"].null_count == n:
        return
    one = api.preprocess(table, cfg)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "BLOCK_ROWS", block)
        mp.setattr(executors, "THREADS", threads)
        many = api.preprocess(table, cfg)
    assert sorted(one.data) == sorted(many.data)
    for key, value in one.data.items():
        np.testing.assert_array_equal(value, many.data[key], err_msg=key)  # type: ignore[arg-type]
    _approx_equal(one.metadata.to_dict(), many.metadata.to_dict(), "meta")


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


def test_ffill_bfill_carry_over_many_empty_blocks() -> None:
    t = pa.table({"n": [None, 4.0, None, None, None, None, 7.0, None]})
    for strategy, expect in (
        ("ffill", [0.0, 4, 4, 4, 4, 4, 7, 7]),
        ("bfill", [4.0, 4, 7, 7, 7, 7, 7, 0]),
    ):
        cfg = {
            "input_features": [
                {
                    "name": "n",
                    "type": "number",
                    "preprocessing": {"missing_value_strategy": strategy, "normalization": "none"},
                }
            ],
            "preprocessing": {"split": {"type": "none"}},
        }
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(pipeline, "BLOCK_ROWS", 1)
            assert api.preprocess(t, cfg).data["n"].tolist() == expect  # type: ignore[union-attr]


# -- executors and the kernel ----------------------------------------------------------------------
def test_ordered_map_keeps_order_bounds_in_flight_and_propagates_errors() -> None:
    running = 0
    peak = 0
    lock = threading.Lock()
    finished = [threading.Event() for _ in range(21)]

    def work(i: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        if i % 3 == 0:  # finish after the next item: completion order is not input order
            finished[i + 1].wait(timeout=10)
        with lock:
            running -= 1
        finished[i].set()
        return i * 10

    assert list(ordered_map(work, range(20), threads=3)) == [i * 10 for i in range(20)]
    assert 1 <= peak <= 3

    def boom(i: int) -> int:
        if i == 4:
            raise ValueError("block 4")
        return i

    got: list[int] = []
    with pytest.raises(ValueError, match="block 4"):
        got.extend(ordered_map(boom, range(10), threads=2))
    assert got == [0, 1, 2, 3]
    with pytest.raises(ConfigError):
        LocalExecutor(threads=0)


class PicklingExecutor:
    """Stands in for a distributed executor: every function and item crosses a pickle boundary."""

    def map_ordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        for item in items:
            remote_fn = pickle.loads(pickle.dumps(fn))
            yield pickle.loads(pickle.dumps(remote_fn(pickle.loads(pickle.dumps(item)))))


def test_stages_are_picklable_and_give_the_local_result(tmp_path: Path) -> None:
    """plan → prepare → fit → finalize → transform through pickles, tokenising again in
    transform."""
    t = pa.table(
        {
            "c": ["a", None, "b", "a", "c"],
            "x": [1.0, None, 3.0, 4.0, None],
            "w": ["x y", "y", None, "z z y", "x"],
            "tags": ["p q", "q", "", None, "p"],
        }
    )
    t = pa.concat_tables(
        [t] * 4
    )  # 20 rows: Ludwig's exact split sizes give 5 rows no training row (min 3 per split)
    cfg = {
        "input_features": [
            {"name": "c", "type": "category"},
            {"name": "x", "type": "number", "preprocessing": {"missing_value_strategy": "ffill"}},
            {"name": "w", "type": "text"},
            {"name": "tags", "type": "bag", "preprocessing": {"max_dense_bytes": 0}},
        ],
        "preprocessing": {"split": {"probabilities": [0.6, 0.2, 0.2]}, "seed": 5},
    }
    local = api.preprocess(t, cfg)
    p = pipeline.bind(
        pipeline.plan(cfg, t), t.num_rows, {}
    )  # the split's first pass (the row count)
    p = dataclasses.replace(p, block_rows=2)
    ex = PicklingExecutor()
    origin = pipeline.Origin(None, None, None)
    slices = [
        (i, lo, t.slice(lo, hi - lo)) for i, (lo, hi) in enumerate(p.block_ranges(t.num_rows))
    ]
    blocks = list(ex.map_ordered(functools.partial(pipeline.prepare, p, origin), slices))
    stats = pipeline.fit(p, blocks, executor=ex, keep_tokens=False)
    assert stats.tokens == [{}] * len(blocks)
    meta = pipeline.finalize(p, stats)
    sink = MemorySink()
    sink.open(p, stats.num_rows)
    for i, block in enumerate(blocks):
        sink.write(i, 0, 0, pipeline.transform(p, block, meta, carry=stats.carries[i]))
    sink.commit(meta.to_dict())
    assert sorted(sink.data) == sorted(local.data)
    for key, value in local.data.items():
        other = sink.data[key]
        if isinstance(value, CSR):
            assert isinstance(other, CSR)
            np.testing.assert_array_equal(value.indices, other.indices)
            np.testing.assert_array_equal(value.offsets, other.offsets)
            np.testing.assert_array_equal(value.values, other.values)  # type: ignore[arg-type]
        else:
            np.testing.assert_array_equal(value, other, err_msg=key)  # type: ignore[arg-type]
    _approx_equal(
        {k: v for k, v in meta.to_dict().items() if k != "datamill"},
        {k: v for k, v in local.metadata.to_dict().items() if k != "datamill"},
        "meta",
    )


def test_saved_and_in_memory_outputs_agree_over_many_blocks(tmp_path: Path) -> None:
    table = pa.table({"s": ["a b", "b", None, "c a a", "d"] * 5})
    pq.write_table(table, tmp_path / "d.parquet")
    cfg = {
        "input_features": [
            {"name": "s", "type": "set", "preprocessing": {"max_dense_bytes": 0}},
            {"name": "g", "column": "s", "type": "bag", "preprocessing": {"max_dense_bytes": 0}},
        ]
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "BLOCK_ROWS", 4)
        mem = api.preprocess(table, cfg)
        saved = api.preprocess(tmp_path / "d.parquet", cfg, output_dir=tmp_path / "o")
    data, _ = api.load(saved.hdf5_path)  # type: ignore[arg-type]
    for key in ("s", "g"):
        a, b = mem.data[key], data[key]
        assert isinstance(a, CSR) and isinstance(b, CSR)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.offsets, b.offsets)
    assert not [p for p in (tmp_path / "o").iterdir() if ".tmp-" in p.name]


def test_handler_instances_keep_no_state() -> None:
    """Regression: handlers cached vocabularies by id(meta) and tokens by buffer address."""
    for type_name in FEATURE_TYPES:
        h: FeatureHandler = handler_class(type_name)()
        assert not vars(h), type_name
