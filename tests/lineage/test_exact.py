"""Exact row equality: keys are only candidates, every reported duplicate is really equal."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.lineage.exact import Columns, duplicate_groups, leaks, rows_equal
from datamill.lineage.packed import Code, column_codes, pack

VALUES: dict[str, Any] = {
    "s": st.one_of(st.none(), st.text(alphabet="ab\x00é", max_size=10)),
    "i": st.one_of(st.none(), st.integers(-3, 3)),
    "f": st.one_of(st.none(), st.sampled_from([0.0, 1.5, -2.0])),
    "l": st.one_of(st.none(), st.lists(st.integers(0, 2), max_size=3)),
    "b": st.one_of(st.none(), st.booleans()),
    "t": st.one_of(st.none(), st.text(alphabet="xy", min_size=20, max_size=30)),
}
ROWS = st.lists(st.fixed_dictionaries(VALUES), min_size=1, max_size=30)


def table_of(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.table(
        {
            "s": pa.array([r["s"] for r in rows], pa.string()),
            "i": pa.array([r["i"] for r in rows], pa.int32()),
            "f": pa.array([r["f"] for r in rows], pa.float64()),
            "l": pa.array([r["l"] for r in rows], pa.list_(pa.int64())),
            "b": pa.array([r["b"] for r in rows], pa.bool_()),
            "t": pa.array([r["t"] for r in rows], pa.large_string()),
            "d": pa.array([r["s"] for r in rows], pa.string()).dictionary_encode(),
        }
    )


def as_tuple(row: dict[str, Any]) -> tuple[Any, ...]:
    """The row's values in the columns' order (hypothesis may build a dict in another key order)."""
    return tuple(tuple(row[k]) if isinstance(row[k], list) else row[k] for k in VALUES)


@settings(max_examples=60)
@given(ROWS, st.booleans())
def test_groups_and_leaks_equal_python_equality_even_when_every_key_collides(
    rows: list[dict[str, Any]], collide: bool
) -> None:
    table = table_of(rows).slice(1) if len(rows) > 1 else table_of(rows)  # an offset too
    rows = rows[1:] if len(rows) > 1 else rows
    cols = Columns.of(table, table.column_names)
    keys = np.zeros(len(rows), np.uint64) if collide else cols.keys()
    tuples = [as_tuple(r) + (r["s"],) for r in rows]
    groups = duplicate_groups(cols, keys)
    first = {}
    for i, t in enumerate(tuples):
        first.setdefault(t, i)
    assert groups.tolist() == [first[t] for t in tuples]
    n = len(rows)
    a, b = np.repeat(np.arange(n), n), np.tile(np.arange(n), n)
    assert rows_equal(cols, a, b).tolist() == [tuples[x] == tuples[y] for x, y in zip(a, b)]
    train, rest = np.arange(0, n, 2), np.arange(1, n, 2)
    r, t = leaks(cols, keys, train, rest)
    expect = [i for i in rest.tolist() if any(tuples[i] == tuples[j] for j in train.tolist())]
    assert r.tolist() == expect
    assert all(tuples[x] == tuples[y] and y % 2 == 0 for x, y in zip(r.tolist(), t.tolist()))


def test_house_prices_leaks_equal_pandas_with_keys_forced_to_collide(data_dir: Path) -> None:
    houses = pacsv.read_csv(data_dir / "house_prices_train.csv").slice(0, 300)
    table = pa.concat_tables([houses, houses.slice(0, 60)])
    cols = Columns.of(table, table.column_names[1:])  # without Id: the copies are equal
    n = table.num_rows
    train, rest = np.arange(300), np.arange(300, n)
    keys = cols.keys()
    r, t = leaks(cols, keys, train, rest)
    assert r.tolist() == list(range(300, n)) and t.tolist() == list(range(60))
    # a key shared by many unequal rows (every 10th row's key forced to one value) changes nothing
    forced = keys.copy()
    forced[::10] = forced[0]
    r2, t2 = leaks(cols, forced, train, rest)
    assert r2.tolist() == r.tolist() and t2.tolist() == t.tolist()
    df = table.select(table.column_names[1:]).to_pandas()
    pandas_first = df.groupby(list(df.columns), dropna=False, sort=False).ngroup()
    groups = duplicate_groups(cols, forced)
    assert len(np.unique(groups)) == pandas_first.nunique()
    assert (groups[300:] == np.arange(60)).all()


WIDE: dict[str, Any] = {  # the types with exact packed codes (lineage/packed.py), with extremes
    "i64": st.one_of(st.none(), st.sampled_from([-(2**63), -1, 0, 7, 2**63 - 1])),
    "u64": st.one_of(st.none(), st.sampled_from([0, 5, 2**63, 2**64 - 1])),
    "i8": st.one_of(st.none(), st.sampled_from([-128, -1, 0, 127])),
    "u16": st.sampled_from([0, 9, 65535]),
    "bin": st.one_of(st.none(), st.binary(max_size=12)),  # zero bytes, 1 to 3 codes of 4 bytes
    "mid": st.one_of(st.none(), st.text(alphabet="ab\x00", min_size=5, max_size=12)),
    "dec": st.one_of(st.none(), st.sampled_from([Decimal("-1.25"), Decimal("3.50")])),
    "day": st.one_of(st.none(), st.sampled_from([date(1900, 1, 1), date(2024, 2, 29)])),
    "st": st.one_of(st.none(), st.fixed_dictionaries({"a": st.sampled_from([None, 1, 2])})),
}


def wide_table(rows: list[dict[str, Any]]) -> pa.Table:
    types = {
        "i64": pa.int64(),
        "u64": pa.uint64(),
        "i8": pa.int8(),
        "u16": pa.uint16(),
        "bin": pa.binary(),
        "mid": pa.large_string(),
        "dec": pa.decimal128(5, 2),
        "day": pa.date32(),
        "st": pa.struct([("a", pa.int64())]),
    }
    return pa.table({k: pa.array([r[k] for r in rows], t) for k, t in types.items()})


def wide_tuple(row: dict[str, Any]) -> tuple[Any, ...]:
    """The row's values in the columns' order (as :func:`as_tuple`)."""
    return tuple((-1, row[k]["a"]) if isinstance(row[k], dict) else row[k] for k in WIDE)


@settings(max_examples=60)
@given(st.lists(st.fixed_dictionaries(WIDE), min_size=1, max_size=30), st.integers(0, 29))
def test_packed_codes_equal_python_equality_in_chunks_on_any_threads(
    rows: list[dict[str, Any]], cut: int
) -> None:
    """Every type with packed codes, split into chunks (Arrow offsets): equal exactly when Python
    says so, and the keys do not depend on the threads."""
    whole = wide_table(rows)
    cut = min(cut, len(rows))
    table = pa.concat_tables([whole.slice(0, cut), whole.slice(cut)])
    cols = Columns.of(table, table.column_names, threads=1)
    assert not cols.cols  # (all packed)
    for name in table.column_names:  # every code fits the bits it claims (else fields overlap)
        for code in column_codes(table.column(name).combine_chunks()) or []:
            assert code.bits == 64 or not (code.as_uint64() >> np.uint64(code.bits)).any(), name
    n = len(rows)
    tuples = [wide_tuple(r) for r in rows]
    a, b = np.repeat(np.arange(n), n), np.tile(np.arange(n), n)
    assert rows_equal(cols, a, b).tolist() == [tuples[x] == tuples[y] for x, y in zip(a, b)]
    keys = cols.keys()
    np.testing.assert_array_equal(keys, Columns.of(table, table.column_names, threads=3).keys())
    first: dict[tuple[Any, ...], int] = {}
    for i, t in enumerate(tuples):
        first.setdefault(t, i)
    assert duplicate_groups(cols, keys).tolist() == [first[t] for t in tuples]


def test_strings_that_pad_alike_are_told_apart_by_length() -> None:
    """'a' and 'a\\0' have the same zero-padded bytes: the length must separate them."""
    table = pa.table({"s": ["a", "a\x00", "a", "a\x00\x00"], "b": [b"", b"\x00", b"", b"\x00"]})
    cols = Columns.of(table, ["s", "b"])
    assert duplicate_groups(cols, cols.keys()).tolist() == [0, 1, 0, 3]


def check_pack(bits: list[int], rows: list[tuple[int, ...]]) -> None:
    codes = [Code(np.array([r[k] for r in rows], np.uint64), b) for k, b in enumerate(bits)]
    words = np.stack(pack(codes), axis=1)
    assert len(words[0]) <= len(bits)
    for x in range(len(rows)):
        for y in range(len(rows)):
            assert (rows[x] == rows[y]) == bool((words[x] == words[y]).all()), (rows[x], rows[y])


@settings(max_examples=100)
@given(st.lists(st.integers(1, 64), min_size=1, max_size=8), st.data())
def test_packed_words_are_equal_exactly_when_every_code_is(bits: list[int], data: Any) -> None:
    values = [st.sampled_from([0, 1, 2 ** (b - 1), 2**b - 1]) for b in bits]
    check_pack(bits, data.draw(st.lists(st.tuples(*values), min_size=2, max_size=12)))


def test_a_word_holds_64_bits_not_65() -> None:
    check_pack([60, 5], [(0, 0), (0, 16), (2**60 - 1, 31), (2**60 - 1, 15)])
