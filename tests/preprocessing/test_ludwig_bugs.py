"""Regression tests of issue 30's two bugs: missing values under ``lowercase`` and stratified split
sizes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.preprocessing import api
from datamill.preprocessing import split as splits
from datamill.preprocessing.split import uniform_at

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ludwig"


def _run(table: pa.Table, feature: dict) -> api.Preprocessed:  # type: ignore[type-arg]
    return api.preprocess(
        table, {"input_features": [feature], "preprocessing": {"split": {"type": "none"}}}
    )


def test_missing_category_stays_unknown_under_lowercase() -> None:
    # broke: the fill <UNK> was lowercased to <unk> and became a real class (the missing row got id
    # 3)
    t = pa.table({"c": ["Blue", "red", None, "RED", "green", "blue"]})
    out = _run(t, {"name": "c", "type": "category", "preprocessing": {"lowercase": True}})
    idx2str = out.metadata["c"]["idx2str"]
    assert "<unk>" not in idx2str and idx2str[0] == "<UNK>"
    assert sorted(idx2str) == sorted(["<UNK>", "blue", "red", "green"])
    assert out.data["c"][2] == 0  # the missing row is the unknown id


def test_missing_set_and_bag_values_stay_unknown_under_lowercase() -> None:
    # broke: a missing set value (filled with <UNK>) became the token <unk>
    t = pa.table({"s": ["A b", None, "a C"]})
    for kind in ("set", "bag"):
        out = _run(t, {"name": "s", "type": kind, "preprocessing": {"lowercase": True}})
        meta = out.metadata["s"]
        assert "<unk>" not in meta["idx2str"], kind
        unk = meta["str2idx"]["<UNK>"]
        row = out.data["s"][1]
        assert row[unk] == 1 and row.sum() == 1, kind


def test_missing_sequence_value_stays_unknown_under_lowercase_and_custom_unknown_symbol() -> None:
    # same root: the fill <UNK> became the token <unk>; with unknown_symbol <U> the fill was a real
    # token
    t = pa.table({"s": ["A b", None, "a C"]})
    for pp, unk in (({"lowercase": True}, "<UNK>"), ({"unknown_symbol": "<U>"}, "<U>")):
        out = _run(t, {"name": "s", "type": "sequence", "preprocessing": pp})
        meta = out.metadata["s"]
        assert "<unk>" not in meta["idx2str"], pp
        assert unk == "<UNK>" or "<UNK>" not in meta["idx2str"], (
            pp
        )  # the fill is the unknown symbol, not a token
        assert out.data["s"][1].tolist()[0] == meta["str2idx"][unk], (
            pp
        )  # the missing row: the unknown id


def _stratified(
    counts: list[int], probabilities: tuple[float, float, float], seed: int = 42
) -> dict[str, list[int]]:
    labels = [f"c{k}" for k, c in enumerate(counts) for _ in range(c)]
    order = np.argsort(uniform_at(seed + 1, 0, len(labels)))  # classes interleaved, not in blocks
    t = pa.table(
        {
            "label": pa.array(labels).take(pa.array(order)),
            "x": np.arange(len(labels), dtype=np.float64),
        }
    )
    out = api.preprocess(
        t,
        {
            "input_features": [{"name": "x", "type": "number"}],
            "output_features": [{"name": "label", "type": "category"}],
            "preprocessing": {
                "seed": seed,
                "split": {
                    "type": "stratify",
                    "column": "label",
                    "probabilities": list(probabilities),
                },
            },
        },
    )
    split = np.asarray(out.data["split"])
    names = np.asarray(t["label"].to_pylist())
    return {c: np.bincount(split[names == c], minlength=3).tolist() for c in sorted(set(labels))}


def test_stratified_split_sizes_are_ludwigs_on_a_178_row_three_class_target() -> None:
    # broke: datamill gave 108/34/36 where Ludwig 0.17 (scikit-learn's train_test_split twice) gives
    # 106/36/36
    per_class = _stratified([59, 71, 48], (0.6, 0.2, 0.2))
    assert np.sum(list(per_class.values()), axis=0).tolist() == [106, 36, 36]
    ludwig = _stored_case([59, 71, 48], [0.6, 0.2, 0.2], 42)  # real Ludwig 0.17.10 output
    assert per_class == {f"c{k}": row for k, row in enumerate(ludwig)}


def _stored_case(counts: list[int], probabilities: list[float], seed: int) -> list[list[int]]:
    for case in json.loads((FIXTURE / "stratify_sizes.json").read_text())["cases"]:
        if (case["counts"], case["probabilities"], case["seed"]) == (counts, probabilities, seed):
            sizes: list[list[int]] = case["sizes"]
            return sizes
    raise AssertionError("case not stored")


def _check_totals(
    counts: list[int], probabilities: tuple[float, float, float], sizes: np.ndarray
) -> None:
    """scikit-learn's rule, n_test = ceil(test_size * n), in both rounds; a class of one row stays
    on the first side."""
    n = sum(counts)
    rest = math.ceil((1.0 - probabilities[0]) * n)
    assert sizes[:, 0].sum() == n - rest  # no class of one row in round one (counts >= 2)
    second = sizes[:, 1] + sizes[:, 2]  # per class, what round two splits
    single = second == 1
    n2 = int(second[~single].sum())
    test = math.ceil(probabilities[2] / (probabilities[1] + probabilities[2]) * n2)
    assert sizes[:, 2].sum() == test and sizes[single, 2].sum() == 0


_TRIPLES = st.sampled_from(
    [
        (0.7, 0.1, 0.2),
        (0.6, 0.2, 0.2),
        (0.8, 0.1, 0.1),
        (0.5, 0.25, 0.25),
        (0.34, 0.33, 0.33),
        (0.9, 0.05, 0.05),
        (0.75, 0.15, 0.1),
    ]
)


@given(
    counts=st.lists(st.integers(2, 400), min_size=2, max_size=6),
    probabilities=_TRIPLES,
    seed=st.integers(0, 2**31 - 1),
)
def test_stratify_sizes_follow_the_train_test_split_rule(
    counts: list[int], probabilities: tuple[float, float, float], seed: int
) -> None:
    sizes = splits.stratify_sizes(counts, probabilities, seed)
    assert sizes.sum(axis=1).tolist() == counts  # every row in exactly one split
    _check_totals(counts, probabilities, sizes)
    # each class within one row of its proportional share of the first round (approximate mode)
    n, train = sum(counts), sizes.sum(axis=0)[0]
    assert (np.abs(sizes[:, 0] - np.asarray(counts) * train / n) < 1 + 1e-9).all()
    assert (sizes >= 0).all()


@settings(max_examples=15)
@given(
    counts=st.lists(st.integers(2, 60), min_size=2, max_size=4),
    probabilities=_TRIPLES,
    seed=st.integers(0, 1000),
)
def test_stratified_split_of_a_table_has_the_rules_sizes_per_class(
    counts: list[int], probabilities: tuple[float, float, float], seed: int
) -> None:
    got = _stratified(counts, probabilities, seed)
    want = splits.stratify_sizes(counts, probabilities, seed).tolist()
    assert got == {f"c{k}": want[k] for k in range(len(counts))} or len(counts) > 9


def test_stratify_sizes_equal_scikit_learns_on_stored_cases() -> None:
    """Cases whose sizes were computed by real scikit-learn
    (``benchmarks/make_stratify_fixture.py``)."""
    cases = [
        c
        for c in json.loads((FIXTURE / "stratify_sizes.json").read_text())["cases"]
        if "sizes" in c
    ]
    assert len(cases) >= 150  # the rest: cases Ludwig itself refuses (scikit-learn's ValueError)
    for case in cases:
        got = splits.stratify_sizes(
            case["counts"], tuple(case["probabilities"]), case["seed"]
        ).tolist()
        assert got == case["sizes"], case
