"""Split checks: planted duplicates are found (exact: equal to pandas), none invented."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.cli import main
from datamill.core.errors import ConfigError
from datamill.core.source import TableSource
from datamill.lineage import near
from datamill.lineage.near import signatures, token_hashes
from datamill.lineage.splits import check_splits, duplicate_uids, minhash, token_ids
from datamill.preprocessing.api import load, preprocess
from datamill.shards.dataset import ShardsetDataset

CONFIG = {
    "input_features": [
        {"name": "LotArea", "type": "number"},
        {"name": "Neighborhood", "type": "category"},
        {"name": "OverallQual", "type": "category"},
    ],
    "output_features": [{"name": "SalePrice", "type": "number"}],
}


def pandas_leaks(hdf5: Path, columns: list[str]) -> dict[str, int]:
    data, _ = load(hdf5)
    df = pd.DataFrame({c: np.asarray(data[c]) for c in columns})
    split = np.asarray(data["split"])
    train = df[split == 0].drop_duplicates()
    out = {}
    for s, name in ((1, "validation"), (2, "test")):
        part = df[split == s].reset_index(drop=True)
        merged = part.merge(train.assign(_hit=True), on=columns, how="left")
        out[name] = int(merged["_hit"].notna().sum())
    return out


def test_planted_exact_duplicates_are_found_and_equal_pandas(
    data_dir: Path, tmp_path: Path
) -> None:
    houses = pacsv.read_csv(data_dir / "house_prices_train.csv")
    planted = pa.concat_tables(
        [houses, houses.slice(0, 200)]
    )  # 200 rows twice: about 1/3 cross the splits
    pacsv.write_csv(planted, tmp_path / "hp.csv")
    preprocess(tmp_path / "hp.csv", CONFIG)
    cols = ["LotArea", "Neighborhood", "OverallQual"]
    report = check_splits(tmp_path / "hp.hdf5")
    assert report.columns == cols
    got = {k: v["rows"] for k, v in report.exact.items()}
    assert got == pandas_leaks(tmp_path / "hp.hdf5", cols)
    assert sum(got.values()) > 20  # the planted copies that landed in validation/test
    data, _ = load(tmp_path / "hp.hdf5")
    for row, train_row in report.exact["test"]["examples"]:
        assert data["split"][train_row] == 0 and data["split"][row] == 2
        assert all(data[c][row] == data[c][train_row] for c in cols)
    # the CLI, and preprocess --check-splits error
    assert main(["check-splits", str(tmp_path / "hp.hdf5"), "--fail"]) == 2
    (tmp_path / "out").mkdir()
    (tmp_path / "c.yaml").write_text(json.dumps(CONFIG))
    assert (
        main(
            [
                "-q",
                "preprocess",
                str(tmp_path / "hp.csv"),
                "-c",
                str(tmp_path / "c.yaml"),
                "-o",
                str(tmp_path / "out"),
                "--check-splits",
                "error",
            ]
        )
        == 2
    )
    assert (
        main(
            [
                "-q",
                "preprocess",
                str(tmp_path / "hp.csv"),
                "-c",
                str(tmp_path / "c.yaml"),
                "-o",
                str(tmp_path / "out"),
                "--check-splits",
                "warn",
            ]
        )
        == 0
    )


def test_no_leak_is_invented_on_distinct_rows(data_dir: Path, tmp_path: Path) -> None:
    houses = pacsv.read_csv(data_dir / "house_prices_train.csv")
    pacsv.write_csv(houses, tmp_path / "hp.csv")
    config = {
        "input_features": [{"name": "Id", "type": "number"}, {"name": "LotArea", "type": "number"}],
        "output_features": [{"name": "SalePrice", "type": "number"}],
    }
    preprocess(tmp_path / "hp.csv", config)
    report = check_splits(tmp_path / "hp.hdf5")
    assert report.leaks == 0 and "no leakage found" in report.as_text()


def wiki_lines(data_dir: Path, n: int) -> list[str]:
    lines = [
        ln.strip()
        for ln in (data_dir / "wikitext2_test.raw").read_text(encoding="utf-8").splitlines()
    ]
    return [ln for ln in lines if len(ln.split()) >= 20][:n]


def jaccard(a: str, b: str, k: int = 3) -> float:
    def sh(t: str) -> set[tuple[str, ...]]:
        w = t.lower().split()
        return {tuple(w[i : i + k]) for i in range(len(w) - k + 1)} or {tuple(w)}

    x, y = sh(a), sh(b)
    return len(x & y) / len(x | y)


def test_planted_near_duplicate_text_is_found_and_nothing_else(data_dir: Path) -> None:
    lines = wiki_lines(data_dir, 600)
    train, rest = lines[:400], lines[400:]
    planted = []
    for i in range(40):  # a copy of a training paragraph with one word changed near its end
        words = train[i * 7].split()
        words[-2] = "CHANGED"
        planted.append(" ".join(words))
    test = planted + rest
    table = pa.table({"text": train + test, "split": [0] * len(train) + [2] * len(test)})
    report = check_splits(table, columns=["text"], text_columns=["text"], threshold=0.7)
    near = report.near["text"]["test"]
    assert near["rows"] >= 38  # MinHash recall on pairs with Jaccard ~0.95
    found = {r for r, _, _ in near["examples"]}
    assert found <= set(range(len(train), len(train) + 40))
    # none invented: every reported pair is really similar (checked on the full candidate list)
    from datamill.lineage.splits import near_duplicates

    v, o = token_hashes(table.column("text"))  # the tokens check_splits uses
    sig = minhash(v, o)
    r, left, _ = near_duplicates(
        sig, np.arange(len(train)), np.arange(len(train), len(train) + len(test)), threshold=0.7
    )
    texts = table.column("text").to_pylist()
    assert all(jaccard(texts[x], texts[y]) >= 0.5 for x, y in zip(r.tolist(), left.tolist()))
    assert len(set(r.tolist())) == near["rows"]
    assert report.exact["test"]["rows"] == 0


def test_duplicate_content_across_uids_of_a_shardset(data_dir: Path, tmp_path: Path) -> None:
    houses = pacsv.read_csv(data_dir / "house_prices_train.csv")
    copies = houses.slice(100, 7).set_column(0, "Id", pa.array(np.arange(9000, 9007)))
    ShardsetDataset.create(
        tmp_path / "d", pa.concat_tables([houses, copies]), uid="Id", shardset="raw", shard_size=400
    )
    found = duplicate_uids(ShardsetDataset(tmp_path / "d"))
    assert (found["groups"], found["rows"]) == (7, 14)
    assert found["examples"][0] == [101, 9000]
    assert duplicate_uids(TableSource(houses, uid_column="Id"))["groups"] == 0
    assert main(["check-splits", str(tmp_path / "d"), "--fail"]) == 2
    with pytest.raises(ConfigError):
        duplicate_uids(TableSource(houses))


@settings(max_examples=25)
@given(
    st.lists(
        st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), max_size=8), min_size=1, max_size=12
    ),
    st.integers(0, 2**32),
)
def test_identical_token_rows_have_identical_signatures(rows: list[list[str]], seed: int) -> None:
    texts = [" ".join(r) for r in rows]
    sig = minhash(*token_ids(pa.array(texts + texts)), num_perm=16, seed=seed)
    n = len(texts)
    np.testing.assert_array_equal(sig[:n], sig[n:])
    for i in range(n):
        if not rows[i]:
            assert (sig[i] == np.iinfo(np.uint64).max).all()


@settings(max_examples=40)
@given(
    st.lists(
        st.one_of(
            st.none(),
            st.lists(
                st.sampled_from(
                    ["a", "B", "É", "é", " ", "\t", "\u00a0", "\u3000", "ü", "LongWord9"]
                    + ["\x01", "\x1f", "\x0b", "\u2028", "\u0085", "\u2013", "\u1680", "\u205f"]
                )
            ).map("".join),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_tokens_are_python_lower_split_words(texts: list[str | None]) -> None:
    """Words split and lower-cased as ``str.lower().split()`` (ASCII, UTF-8, Unicode spaces).

    (Found here: pyarrow 26's ``utf8_split_whitespace`` sometimes returned a word of a trailing
    no-break space, run to run; the byte path does not use it.) Control bytes that are not
    whitespace belong to words; rows without spaces at their ends do not run together.
    """
    arr = pa.array(texts, pa.string())
    words = [w for t in texts for w in (t or "").lower().split()]
    offsets = np.cumsum([0] + [len((t or "").split()) for t in texts]).tolist()
    ids, id_off = token_ids(arr)
    hashes, h_off = token_hashes(arr)
    assert id_off.tolist() == h_off.tolist() == offsets
    first: dict[str, int] = {}
    assert ids.tolist() == [first.setdefault(w, len(first)) for w in words]
    np.testing.assert_array_equal(hashes[:, None] == hashes[None, :], ids[:, None] == ids[None, :])


def test_each_unicode_space_alone_splits_words() -> None:
    """Each of str.split()'s non-ASCII spaces, alone in the text, splits (and nothing like it)."""
    spaces = [chr(c) for c in range(0x80, 0x3001) if chr(c).isspace()]
    assert len(spaces) == 19
    for ch in spaces + ["\u2013", "\u200b", "\u00e9", "\u3001"]:
        text = f"x{ch}y é"
        _, offsets = token_hashes(pa.array([text]))
        assert offsets.tolist() == [0, len(text.split())], repr(ch)


def test_a_long_word_hashes_alike_whatever_else_the_text_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: a word over 8 bytes was mixed once more per 8 bytes of the longest word in
    the same block, so signature blocks (threads) disagreed on it."""
    alone, _ = token_hashes(pa.array(["television"]))
    beside, _ = token_hashes(pa.array(["television", "a" * 40]))
    assert alone[0] == beside[0]
    texts = pa.array(
        [f"the television set number {i % 7} was a" + " b" * (i % 3) for i in range(400)]
        + ["x" * 50 + " television set number"] * 10
    )
    whole = signatures(texts, threads=1)
    monkeypatch.setattr(near, "BLOCK_BYTES", 512)  # blocks of a few rows each
    np.testing.assert_array_equal(signatures(texts, threads=2), whole)
