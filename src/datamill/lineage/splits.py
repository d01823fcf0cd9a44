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

import functools
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat
from numpy.typing import NDArray

from datamill.core.errors import ConfigError, DataFileError
from datamill.core.rng import rng_for
from datamill.lineage.rowhash import column_hash, mix64

__all__ = [
    "SplitReport",
    "check_splits",
    "duplicate_uids",
    "minhash",
    "near_duplicates",
    "row_keys",
    "token_ids",
]

SPLIT_NAMES = {0: "train", 1: "validation", 2: "test"}
EXAMPLES = 5
MAX_PAIRS = 64
"""Candidate training rows kept per validation/test row and LSH band (a bucket of many equal
rows)."""
U64 = NDArray[np.uint64]
I64 = NDArray[np.int64]


def token_ids(column: pa.Array | pa.ChunkedArray, /) -> tuple[I64, I64]:
    """``(values, offsets)`` of each row's tokens as int64 ids: words of a string column (split on
    whitespace, lower-cased), or the ids of an integer list column as they are.

    Examples:
        >>> v, o = token_ids(pa.array(["a b a", "", "B c"]))
        >>> o.tolist(), v.tolist()
        ([0, 3, 3, 5], [0, 1, 0, 1, 2])
    """
    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pat.is_string(col.type) or pat.is_large_string(col.type):
        words = pc.utf8_split_whitespace(pc.utf8_lower(col.fill_null("")))
        flat = words.flatten()
        offsets = np.asarray(words.offsets, dtype=np.int64)
        nonempty = np.asarray(pc.binary_length(flat).to_numpy(zero_copy_only=False)) > 0
        if not nonempty.all():  # "" splits into one empty word: drop those
            flat = flat.filter(pa.array(nonempty))
            offsets = np.concatenate([[0], np.cumsum(nonempty)]).astype(np.int64)[
                offsets - offsets[0]
            ]
        ids = (
            np.asarray(
                pc.dictionary_encode(flat).indices.to_numpy(zero_copy_only=False), dtype=np.int64
            )
            if len(flat)
            else np.zeros(0, dtype=np.int64)
        )  # ids of this call (first seen first): all a check needs
        return ids, offsets - offsets[0]
    if pat.is_list(col.type) or pat.is_large_list(col.type):
        col = col.fill_null([])
        offsets = np.asarray(col.offsets, dtype=np.int64)
        values = np.asarray(col.values.to_numpy(zero_copy_only=False), dtype=np.int64)[
            offsets[0] : offsets[-1]
        ]
        return values, offsets - offsets[0]
    if pat.is_fixed_size_list(col.type):
        size = col.type.list_size
        values = np.asarray(col.flatten().to_numpy(zero_copy_only=False), dtype=np.int64)
        return values, np.arange(len(col) + 1, dtype=np.int64) * size
    raise ConfigError(f"near-duplicate checks need a text or token-id column, got {col.type}")


def _shingles(values: I64, offsets: I64, k: int) -> tuple[U64, I64]:
    """``(hash, row)`` of every ``k`` consecutive tokens of each row (a shorter row: one shingle of
    all its tokens)."""
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    v = values.astype(np.uint64)
    h = np.zeros(len(v), dtype=np.uint64)
    for j in range(k):  # h[i] = sum(token[i + j] * M**j): a polynomial of the k tokens from i
        h[: len(v) - j] += v[j:] * np.uint64(pow(0x100000001B3, j, 1 << 64))
    row = np.repeat(np.arange(n, dtype=np.int64), lengths)
    end = np.repeat(offsets[1:], lengths)
    first = np.zeros(len(v), dtype=bool)
    first[offsets[:-1][lengths > 0]] = True
    keep = (np.arange(len(v), dtype=np.int64) + k <= end) | (
        first & (np.repeat(lengths, lengths) < k)
    )
    short = keep & (
        np.arange(len(v), dtype=np.int64) + k > end
    )  # the first token of a row shorter than k
    out = h[keep]
    if short.any():  # those rows: the hash of their tokens only
        rows_short = row[short]
        whole = column_hash(
            pa.LargeListArray.from_arrays(pa.array(offsets.astype(np.int64)), pa.array(v)).take(
                pa.array(rows_short)
            )
        )
        out[np.flatnonzero(short[keep])] = whole
    return out, row[keep]


@functools.cache
def _probes(num_perm: int) -> I64:
    """Bins probed by an empty bin, attempt after attempt: ``probes[bin, attempt]`` (the same for
    every row)."""
    attempts = 8 * num_perm
    j = np.repeat(np.arange(num_perm, dtype=np.uint64), attempts) * np.uint64(0x9E3779B97F4A7C15)
    a = np.tile(np.arange(1, attempts + 1, dtype=np.uint64), num_perm)
    bits = num_perm.bit_length() - 1
    return (mix64(j + a) >> np.uint64(64 - bits)).astype(np.int64).reshape(num_perm, attempts)


def minhash(
    values: I64, offsets: I64, /, *, num_perm: int = 64, shingle: int = 3, seed: int = 0
) -> U64:
    """MinHash signatures ``(rows, num_perm)`` over word shingles (one-permutation hashing).

    Each shingle is hashed once (with a salt from ``seed``); the top bits pick one of ``num_perm``
    bins and each row keeps the minimum per bin (``np.minimum.at``: one pass, not one per
    permutation). An empty bin borrows the value of a bin chosen by a hash of (bin, attempt), the
    same probes for every row (optimal densification, Shrivastava 2017), so
    the share of equal bins of two rows estimates the Jaccard similarity of their shingle sets.
    Empty rows get all-max signatures.

    Raises:
        ConfigError: ``num_perm`` is not a power of two >= 2.

    Examples:
        >>> v, o = token_ids(
        ...     pa.array(["the cat sat on the mat", "the cat sat on the mat", "a dog"])
        ... )
        >>> sig = minhash(v, o, num_perm=16)
        >>> bool((sig[0] == sig[1]).all()), bool((sig[0] == sig[2]).mean() < 0.5)
        (True, True)
    """
    if num_perm < 2 or num_perm & (num_perm - 1):
        raise ConfigError(f"num_perm must be a power of two >= 2, got {num_perm}")
    sh, row = _shingles(values, offsets, shingle)
    n = len(offsets) - 1
    top = np.iinfo(np.uint64).max
    sig = np.full((n, num_perm), top, dtype=np.uint64)
    if not len(sh):
        return sig
    salt = np.uint64(int(rng_for(seed, "lineage.minhash").integers(0, 2**63)))
    hs = mix64(sh ^ salt)
    bits = num_perm.bit_length() - 1
    key = row * num_perm + (hs >> np.uint64(64 - bits)).astype(np.int64)
    np.minimum.at(sig.reshape(-1), key, hs)
    empty = sig == top
    r, j = np.nonzero(empty & ~empty.all(axis=1)[:, None])
    if not len(r):
        return sig
    full_bits = np.zeros(n, dtype=np.uint64)  # bit b set: bin b of the row holds a shingle
    for b in range(num_perm):
        full_bits |= (~empty[:, b]).astype(np.uint64) << np.uint64(b)
    probes = _probes(num_perm)
    found = np.zeros(len(r), dtype=np.int64)
    todo = np.arange(len(r), dtype=np.int64)
    for attempt in range(
        probes.shape[1]
    ):  # optimal densification: every row probes the same bins per attempt
        p = probes[j[todo], attempt]
        ok = ((full_bits[r[todo]] >> p.astype(np.uint64)) & np.uint64(1)).astype(bool)
        found[todo[ok]] = p[ok]
        todo = todo[~ok]
        if not len(todo):
            break
    for attempt in range(
        len(todo) and num_perm
    ):  # a row that missed every probe: the next full bin to the right
        nxt = (j[todo] + attempt + 1) % num_perm
        ok = ((full_bits[r[todo]] >> nxt.astype(np.uint64)) & np.uint64(1)).astype(bool)
        found[todo[ok]] = nxt[ok]
        todo = todo[~ok]
    sig[r, j] = sig[r, found]
    return sig


def near_duplicates(
    sig: U64, left: I64, right: I64, /, *, threshold: float = 0.8, bands: int | None = None
) -> tuple[I64, I64, NDArray[np.float64]]:
    """Pairs ``(row of right, row of left, estimated Jaccard)`` with similarity >= ``threshold``.

    Banded LSH over the signature columns finds candidates (rows agreeing on a whole band), then the
    share of equal signature values decides. ``bands`` defaults to a split suited to ``threshold``.
    """
    num_perm = sig.shape[1]
    if bands is None:
        bands = _bands_for(num_perm, threshold)
    r = num_perm // bands
    rows = np.concatenate([left, right])
    side = np.concatenate([np.zeros(len(left), bool), np.ones(len(right), bool)])
    empty = (sig[rows] == np.iinfo(np.uint64).max).all(axis=1)
    found_r, found_l = [], []
    for b in range(bands):
        key = np.zeros(len(rows), dtype=np.uint64)
        for j in range(b * r, (b + 1) * r):
            key = mix64(key * np.uint64(0x100000001B3) + sig[rows, j])
        order = np.lexsort((side, key))  # by band key, the left rows of a bucket first
        k, sd = key[order], side[order]
        live = ~empty[order]
        new = np.concatenate([[True], k[1:] != k[:-1]])
        group = np.cumsum(new) - 1
        gstart = np.flatnonzero(new)
        nleft = np.bincount(group, weights=~sd, minlength=len(gstart)).astype(np.int64)
        right = np.flatnonzero(sd & live & (nleft[group] > 0))
        if not len(right):
            continue
        per = np.minimum(
            nleft[group[right]], MAX_PAIRS
        )  # pairs per right row in this band (capped)
        first = np.repeat(gstart[group[right]], per)
        step = np.arange(int(per.sum()), dtype=np.int64) - np.repeat(np.cumsum(per) - per, per)
        found_r.append(rows[order[np.repeat(right, per)]])
        found_l.append(rows[order[first + step]])
    if not found_r:
        z = np.zeros(0, dtype=np.int64)
        return z, z, np.zeros(0)
    both = np.unique(np.stack([np.concatenate(found_r), np.concatenate(found_l)], axis=1), axis=0)
    cand_r, cand_l = both[:, 0], both[:, 1]
    cr, cl = np.asarray(cand_r, dtype=np.int64), np.asarray(cand_l, dtype=np.int64)
    sim = (sig[cr] == sig[cl]).mean(axis=1)
    keep = sim >= threshold
    return cr[keep], cl[keep], sim[keep]


def _bands_for(num_perm: int, threshold: float) -> int:
    """The band count whose LSH S-curve threshold ``(1/b)**(1/r)`` is closest below
    ``threshold``."""
    best, err = 1, 9.0
    for b in range(1, num_perm + 1):
        if num_perm % b:
            continue
        t = (1 / b) ** (1 / (num_perm // b))
        if t <= threshold and threshold - t < err:
            best, err = b, threshold - t
    return best


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


def row_keys(table: pa.Table, columns: Sequence[str], /) -> U64:
    """One uint64 per row, equal for rows with equal ``columns`` (within this table only).

    Strings go through ``dictionary_encode`` (their ids in this table), numbers through their bits,
    anything else through :func:`~datamill.lineage.rowhash.column_hash`; cheaper than content hashes
    that must agree across builds, which an exact check within one table does not need.

    Examples:
        >>> k = row_keys(pa.table({"a": ["x", "y", "x"], "b": [1, 2, 1]}), ["a", "b"])
        >>> bool(k[0] == k[2]), bool(k[0] == k[1])
        (True, False)
    """
    h = np.zeros(table.num_rows, dtype=np.uint64)
    for i, name in enumerate(columns):
        col = table.column(name).combine_chunks()
        typ = col.type
        if (
            pat.is_string(typ)
            or pat.is_large_string(typ)
            or pat.is_binary(typ)
            or pat.is_large_binary(typ)
        ):
            enc = pc.dictionary_encode(col)
            ids = np.asarray(
                enc.indices.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64
            )
            part = ids.astype(np.uint64)
        elif (pat.is_integer(typ) or pat.is_floating(typ)) and not col.null_count:
            part = (
                np.asarray(col.to_numpy(zero_copy_only=False))
                .view(f"u{typ.bit_width // 8}")
                .astype(np.uint64)
            )
        else:
            part = column_hash(col)
        h *= np.uint64(0x100000001B3)
        h += part
        if i % 4 == 3:  # mix every few columns (a plain polynomial of small ids could collide)
            h = mix64(h)
    return mix64(h)


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
    path = "<table>"
    texts_default: list[str] = []
    if isinstance(table_or_path, pa.Table):
        table = table_or_path
    else:
        from datamill.sources import open_source

        path = os.fspath(table_or_path)
        src = open_source(path)
        table = (
            pa.concat_tables([src.read_shard(k) for k in range(src.num_shards)])
            if src.num_shards
            else pa.table({})
        )
        cols_default, texts_default = _inputs(Path(path), table.column_names)
        if columns is None:
            columns = cols_default
    if split_column not in table.column_names:
        raise ConfigError(
            f"no {split_column!r} column to tell the splits apart",
            path=path,
            column=split_column,
            hint="preprocess with a split, or name the column with split_column=",
        )
    cols = (
        [c for c in table.column_names if c != split_column] if columns is None else list(columns)
    )
    unknown = [c for c in cols if c not in table.column_names]
    if unknown:
        raise ConfigError(
            f"unknown column(s) {unknown}; the data has {table.column_names}",
            path=path,
            column=unknown[0],
        )
    texts = list(text_columns) if text_columns is not None else texts_default
    unknown = [c for c in texts if c not in table.column_names]
    if unknown:  # (found by tests/fuzz: a raw KeyError from pyarrow)
        raise ConfigError(
            f"unknown text column(s) {unknown}; the data has {table.column_names}",
            path=path,
            column=unknown[0],
        )
    split = np.asarray(table.column(split_column).to_numpy(zero_copy_only=False), dtype=np.int64)
    rows = {SPLIT_NAMES.get(int(s), str(s)): int((split == s).sum()) for s in np.unique(split)}
    train = np.flatnonzero(split == 0)
    report = SplitReport(
        path,
        rows,
        cols,
        settings={"threshold": threshold, "num_perm": num_perm, "shingle": shingle, "seed": seed},
    )
    h = row_keys(table, cols)
    order = np.argsort(h[train], kind="stable")
    sorted_train = h[train][order]
    for s in (1, 2):
        rows_s = np.flatnonzero(split == s)
        if not len(rows_s) and s not in split:
            continue
        i = np.searchsorted(sorted_train, h[rows_s]).clip(max=max(0, len(train) - 1))
        hit = (sorted_train[i] == h[rows_s]) if len(train) else np.zeros(len(rows_s), dtype=bool)
        ex = [
            (int(r), int(train[order[j]]))
            for r, j in zip(rows_s[hit][:EXAMPLES], i[hit][:EXAMPLES])
        ]
        report.exact[SPLIT_NAMES[s]] = {"rows": int(hit.sum()), "examples": ex}
    for c in texts:
        values, offsets = token_ids(table.column(c))
        sig = minhash(values, offsets, num_perm=num_perm, shingle=shingle, seed=seed)
        per = {}
        for s in (1, 2):
            rows_s = np.flatnonzero(split == s)
            if not len(rows_s) and s not in split:
                continue
            r, l, sim = near_duplicates(sig, train, rows_s, threshold=threshold)
            best: dict[int, tuple[int, float]] = {}
            for x, y, z in zip(r.tolist(), l.tolist(), sim.tolist()):
                if x not in best or z > best[x][1]:
                    best[x] = (y, z)
            near = [(x, y, round(z, 3)) for x, (y, z) in sorted(best.items())[:EXAMPLES]]
            per[SPLIT_NAMES[s]] = {"rows": len(best), "examples": near}
        report.near[c] = per
    return report


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
    h = row_keys(table, cols)
    order = np.argsort(h, kind="stable")
    hs = h[order]
    starts = (
        np.flatnonzero(np.concatenate([[True], hs[1:] != hs[:-1]]))
        if len(hs)
        else np.zeros(0, np.int64)
    )
    sizes = np.diff(np.append(starts, len(hs)))
    dup, dup_sizes = starts[sizes > 1], sizes[sizes > 1]
    first = np.argsort(order[dup], kind="stable")  # groups in the order of their first row
    uids = table.column(uid)
    examples = [
        uids.take(pa.array(np.sort(order[a : a + n]))).to_pylist()
        for a, n in zip(dup[first][:EXAMPLES].tolist(), dup_sizes[first][:EXAMPLES].tolist())
    ]
    return {
        "groups": len(dup),
        "rows": int(sizes[sizes > 1].sum()),
        "examples": examples,
        "columns": cols,
    }
