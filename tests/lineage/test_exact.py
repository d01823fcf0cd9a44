"""Exact row equality: keys are only candidates, every reported duplicate is really equal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.lineage.exact import Columns, duplicate_groups, leaks, rows_equal

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
    return tuple(tuple(v) if isinstance(v, list) else v for v in row.values())


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
