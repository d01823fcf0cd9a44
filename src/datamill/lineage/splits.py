"""Leakage and duplicate checks: validation/test rows that repeat training rows, exactly or nearly.

* **Exact**: a row of validation or test whose input features equal a training row's (per-row
  content hashes of the input columns, :mod:`datamill.lineage.rowhash`, compared with one sort).
* **Near-duplicate text**: MinHash signatures over word shingles (``shingle`` consecutive tokens)
  of each text feature, banded locality-sensitive hashing for candidate pairs, kept when the
  signatures agree on at least ``threshold`` of their values (the estimated Jaccard similarity).
  The hash functions come from ``seed``, so the same data gives the same report everywhere.
  Everything is vectorised over the token arrays (``np.minimum.reduceat`` per row).
* **Shardset datasets**: samples whose content (every column but the UID) equals another UID's.

:func:`check_splits` works on a preprocessed ``.hdf5`` (``split`` column, ``meta.json`` roles) or
on any table with a split column; :func:`duplicate_uids` on a shardset dataset.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.errors import ConfigError, DataFileError
from datamill.lineage.exact import Columns, duplicate_groups, leaks, row_keys
from datamill.lineage.near import minhash, near_duplicates, signatures, token_ids

__all__ = [
    "SplitReport",
    "check_splits",
    "duplicate_uids",
    "minhash",
    "near_duplicates",
    "report_splits",
    "row_keys",
    "token_ids",
]

SPLIT_NAMES = {0: "train", 1: "validation", 2: "test"}
EXAMPLES = 5


@dataclass
class SplitReport:
    """What :func:`check_splits` found (``as_dict()`` for JSON, ``as_text()`` for people)."""

    path: str
    rows: dict[str, int]
    columns: list[str]
    exact: dict[str, Any] = field(default_factory=dict)
    near: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def leaks(self) -> int:
        """Rows of validation/test that duplicate a training row, exactly or nearly."""
        return int(
            sum(v["rows"] for v in self.exact.values())
            + sum(v["rows"] for f in self.near.values() for v in f.values())
        )

    def as_dict(self) -> dict[str, Any]:
        """The report as a JSON-able dict."""
        return asdict(self)

    def as_text(self) -> str:
        """A readable report."""
        out = [
            f"{self.path}: "
            + ", ".join(f"{k} {v:,}" for k, v in self.rows.items())
            + f" rows; input columns "
            f"{self.columns}"
        ]
        for split, v in self.exact.items():
            out.append(
                f"{split}: {v['rows']:,} rows equal a training row exactly"
                + (f", e.g. (row, training row) {v['examples']}" if v["examples"] else "")
            )
        for feat, per in self.near.items():
            for split, v in per.items():
                out.append(
                    f"{split}: {v['rows']:,} rows have a near-duplicate {feat!r} in training "
                    "(Jaccard >= "
                    f"{self.settings['threshold']})"
                    + (
                        f", e.g. (row, training row, similarity) {v['examples']}"
                        if v["examples"]
                        else ""
                    )
                )
        out.append("no leakage found" if not self.leaks else f"{self.leaks:,} leaking rows")
        return "\n".join(out)


def _inputs(path: Path, columns: list[str]) -> tuple[list[str], list[str]]:
    """(input columns, text/sequence columns) from the ``meta.json`` beside a preprocessed file."""
    meta_path = path.with_suffix(".meta.json")
    if not meta_path.is_file():
        return [c for c in columns if c != "split"], []
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (
        OSError,
        ValueError,
    ) as exc:  # (found by tests/fuzz: a truncated meta.json was a raw JSONDecodeError)
        raise DataFileError(
            f"cannot read the metadata ({exc})",
            path=meta_path,
            hint="preprocess the data again to rewrite it",
        ) from exc
    if not isinstance(meta, dict):
        raise DataFileError("the metadata is not a JSON object", path=meta_path)
    inputs = [
        n
        for n, f in meta.items()
        if isinstance(f, dict) and f.get("role") == "input" and n in columns
    ]
    texts = [n for n in inputs if meta[n].get("type") in ("text", "sequence")]
    return inputs, texts


def check_splits(
    table_or_path: pa.Table | str | os.PathLike[str],
    /,
    *,
    columns: Sequence[str] | None = None,
    text_columns: Sequence[str] | None = None,
    split_column: str = "split",
    threshold: float = 0.8,
    num_perm: int = 64,
    shingle: int = 3,
    seed: int = 0,
) -> SplitReport:
    """Find validation/test rows that repeat a training row exactly, or nearly (text).

    Args:
        table_or_path: a preprocessed ``.hdf5`` (its ``meta.json`` names the input features) or a
            table with a split column (0 train, 1 validation, 2 test).
        columns: the input columns compared exactly. Defaults to ``None`` (the inputs of
            ``meta.json``, else every column but the split).
        text_columns: columns checked for near-duplicates. Defaults to ``None`` (text/sequence
            inputs).
        split_column: the split column. Defaults to ``"split"``.
        threshold: estimated Jaccard similarity of shingle sets that counts as near-duplicate.
            Defaults to ``0.8``.
        num_perm: MinHash values per row. Defaults to ``64``.
        shingle: tokens per shingle. Defaults to ``3``.
        seed: seeds the hash functions. Defaults to ``0``.

    Raises:
        ConfigError: no split column, or unknown columns.

    Examples:
        >>> t = pa.table(
        ...     {"x": [1, 2, 3, 1], "s": ["a b c d", "e f", "a b c d", "z"], "split": [0, 0, 1, 2]}
        ... )
        >>> r = check_splits(t, text_columns=["s"])
        >>> (
        ...     r.exact["validation"]["rows"],
        ...     r.exact["test"]["rows"],
        ...     r.near["s"]["validation"]["rows"],
        ... )
        (0, 0, 1)
    """
    path, table, (cols_default, texts_default) = _load(table_or_path)
    if split_column not in table.column_names:
        raise ConfigError(
            f"no {split_column!r} column to tell the splits apart",
            path=path,
            column=split_column,
            hint="preprocess with a split, or name the column with split_column=",
        )
    if columns is None:
        columns = cols_default
    cols = (
        [c for c in table.column_names if c != split_column] if columns is None else list(columns)
    )
    texts = list(text_columns) if text_columns is not None else texts_default
    _known(cols, table, path, what="column(s)")
    _known(texts, table, path, what="text column(s)")  # (fuzz: a raw KeyError from pyarrow)
    split = np.asarray(table.column(split_column).to_numpy(zero_copy_only=False), dtype=np.int64)
    rows = {SPLIT_NAMES.get(int(s), str(s)): int((split == s).sum()) for s in np.unique(split)}
    train = np.flatnonzero(split == 0)
    report = SplitReport(
        path,
        rows,
        cols,
        settings={"threshold": threshold, "num_perm": num_perm, "shingle": shingle, "seed": seed},
    )
    prepared = Columns.of(table, cols)
    found_r, found_t = leaks(prepared, prepared.keys(), train, np.flatnonzero(split != 0))
    for s in (1, 2):
        if s in split:
            mine = split[found_r] == s
            hit_r, hit_t = found_r[mine], found_t[mine]
            ex = [(int(r), int(t)) for r, t in zip(hit_r[:EXAMPLES], hit_t[:EXAMPLES])]
            report.exact[SPLIT_NAMES[s]] = {"rows": len(hit_r), "examples": ex}
    for c in texts:
        sig = signatures(table.column(c), num_perm=num_perm, shingle=shingle, seed=seed)
        report.near[c] = {
            SPLIT_NAMES[s]: _nearest(sig, train, np.flatnonzero(split == s), threshold)
            for s in (1, 2)
            if s in split or len(np.flatnonzero(split == s))
        }
    return report


def _load(table_or_path: pa.Table | str | os.PathLike[str]) -> tuple[str, pa.Table, Any]:
    """``(path shown, table, (default columns, default text columns))``."""
    if isinstance(table_or_path, pa.Table):
        return "<table>", table_or_path, (None, [])
    from datamill.sources import open_source

    path = os.fspath(table_or_path)
    src = open_source(path)
    table = (
        pa.concat_tables([src.read_shard(k) for k in range(src.num_shards)])
        if src.num_shards
        else pa.table({})
    )
    return path, table, _inputs(Path(path), table.column_names)


def _known(cols: list[str], table: pa.Table, path: str, *, what: str) -> None:
    unknown = [c for c in cols if c not in table.column_names]
    if unknown:
        raise ConfigError(
            f"unknown {what} {unknown}; the data has {table.column_names}",
            path=path,
            column=unknown[0],
        )


def _nearest(
    sig: NDArray[Any], train: NDArray[np.int64], rows: NDArray[np.int64], threshold: float
) -> dict[str, Any]:
    """The rows of a split nearly duplicating a training row, each with its most similar one."""
    r, l, sim = near_duplicates(sig, train, rows, threshold=threshold)
    o = np.lexsort((l, -sim, r))  # each row's most similar training row (ties: the first)
    first = np.concatenate([[True], r[o][1:] != r[o][:-1]])[: len(r)]
    br, bl, bs = r[o][first], l[o][first], sim[o][first]
    near = [
        (int(x), int(y), round(float(z), 3))
        for x, y, z in zip(br[:EXAMPLES], bl[:EXAMPLES], bs[:EXAMPLES])
    ]
    return {"rows": len(br), "examples": near}


def duplicate_uids(source: Any, /, *, columns: Sequence[str] | None = None) -> dict[str, Any]:
    """Groups of UIDs whose content (``columns``, default every column but the UID) is identical.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> src = TableSource(
        ...     pa.table({"u": [1, 2, 3, 4], "x": ["a", "b", "a", "a"]}), uid_column="u"
        ... )
        >>> duplicate_uids(src)["groups"], duplicate_uids(src)["examples"]
        (1, [[1, 3, 4]])
    """
    from datamill.core.source import uid_column_of

    uid = uid_column_of(source)
    if uid is None:
        raise ConfigError("duplicate content across UIDs needs a source with a UID column")
    tables = [source.read_shard(k) for k in range(source.num_shards)]
    table = pa.concat_tables(tables) if tables else pa.table({})
    cols = [c for c in table.column_names if c != uid] if columns is None else list(columns)
    unknown = [c for c in cols if c not in table.column_names]
    if unknown:  # (found by tests/fuzz: a raw KeyError from pyarrow)
        raise ConfigError(
            f"unknown column(s) {unknown}; the data has {table.column_names}", column=unknown[0]
        )
    prepared = Columns.of(table, cols)
    groups = duplicate_groups(prepared, prepared.keys())
    sizes = np.bincount(groups, minlength=len(groups))
    dup = np.flatnonzero(sizes > 1)  # the first row of each group of several (row order)
    uids = table.column(uid)
    in_dup = sizes[groups] > 1
    members = np.flatnonzero(in_dup)
    examples = [
        uids.take(pa.array(members[groups[members] == g])).to_pylist()
        for g in dup[:EXAMPLES].tolist()
    ]
    return {
        "groups": len(dup),
        "rows": int(in_dup.sum()),
        "examples": examples,
        "columns": cols,
    }


def report_splits(
    path: str | os.PathLike[str], /, *, fail: bool, json_out: bool = False, **options: Any
) -> SplitReport:
    """Print the split check of ``path`` (:func:`check_splits` with ``options``) and return it.

    ``datamill preprocess --check-splits`` calls it through the command handler ``"report-splits"``
    (:mod:`datamill.core.commands`), so preprocessing never imports lineage.

    Args:
        path: a preprocessed ``.hdf5`` or a table with a split column.
        fail: raise when validation/test rows duplicate training rows.
        json_out: print the report as JSON instead of text. Defaults to ``False``.
        **options: passed to :func:`check_splits`.

    Returns:
        The report that was printed.

    Raises:
        DataFileError: ``fail`` and rows leak.

    Examples:
        >>> report_splits("missing.hdf5", fail=True)
        Traceback (most recent call last):
        ...
        datamill.core.errors.DataFileNotFoundError: missing.hdf5: no such file or folder
    """
    report = check_splits(path, **options)
    print(json.dumps(report.as_dict(), indent=2, sort_keys=True) if json_out else report.as_text())
    if fail and report.leaks:
        raise DataFileError(
            f"{report.leaks:,} validation/test rows duplicate training rows",
            path=str(path),
            hint="deduplicate the input, split by a group column, or pass --check-splits warn",
        )
    return report
