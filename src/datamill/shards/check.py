"""Validation of shardset datasets: every violation is a DatamillError with path/uid/shard set.

:func:`shard_problems` checks one shard table against the mapping (used by ``add`` before anything
is committed, and by :func:`check_dataset`); :func:`check_dataset` checks a whole dataset folder:
the manifest against the files, the mapping, every shard's UID column, uniqueness, placement and
row counts. Nothing is raised by :func:`check_dataset`; it returns the list of violations (as
exceptions, for the CLI), and :func:`check_report` returns the same violations as plain JSON-able
dicts (for the web UI).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.constants import DATASET_MANIFEST, SAMPLES_FILE, SHARD_PATTERN
from datamill.core.errors import DatamillError, SchemaError, ShardsetError
from datamill.shards._fs import Location, read_any
from datamill.shards._manifest import manifest_problems
from datamill.shards._mapping import Mapping, schema_from_b64

__all__ = [
    "MAX_PER_FILE",
    "VIOLATION_KEYS",
    "check_dataset",
    "check_report",
    "shard_file",
    "shard_problems",
    "violation_dict",
]

MAX_PER_FILE = 20  # violations listed per shard file before a summary line
VIOLATION_KEYS = ("kind", "message", "path", "shard", "uid", "column", "row", "hint")
"""The keys of every :func:`check_report` entry."""


def shard_file(shardset: str, k: int, fmt: str) -> str:
    return f"{shardset}/{SHARD_PATTERN.format(index=k, ext=fmt)}"


# long (69 lines): every check of one shard in order, each appending a located problem
def shard_problems(
    table: pa.Table,
    *,
    display: str,
    k: int,
    uid_column: str,
    mapping: Mapping,
    columns: list[str] | None,
    reference: tuple[str, str],
) -> Iterator[DatamillError]:
    """Violations of shard ``k`` of one shardset: UID column, column set,
    unknown/misplaced/duplicate UIDs.

    ``reference`` is ``(first shardset name, its format)``, named in "belongs to shard m" messages.
    """
    if uid_column not in table.column_names:
        yield SchemaError(
            f"the UID column {uid_column!r} is missing (columns: {table.column_names})",
            path=display,
            column=uid_column,
            shard=k,
            hint="every shard file needs the UID column",
        )
        return
    if columns is not None and sorted(table.column_names) != sorted([uid_column, *columns]):
        yield SchemaError(
            f"expected columns {sorted([uid_column, *columns])}, got {sorted(table.column_names)}",
            path=display,
            shard=k,
            hint="every shard of a shardset has the same columns",
        )
    uids = table.column(uid_column)
    if uids.null_count:
        row = int(np.flatnonzero(np.asarray(uids.is_null()))[0])
        yield ShardsetError("a UID is null", path=display, row=row, shard=k)
        return
    try:
        pos = mapping.positions_near(uids, k, display=display)
    except SchemaError as exc:
        yield exc
        return
    valid = np.asarray(pos.is_valid())
    p = np.asarray(pos.fill_null(0).to_numpy(), dtype=np.int64)
    unknown = np.flatnonzero(~valid)

    def errors(
        rows: NDArray[np.int64], why: Callable[[int], str], hint: str
    ) -> list[ShardsetError]:
        return [
            ShardsetError(
                why(int(r)), path=display, uid=uids[int(r)].as_py(), row=int(r), shard=k, hint=hint
            )
            for r in rows[:MAX_PER_FILE]
        ]

    yield from errors(
        unknown,
        lambda r: "uid is not in the sample mapping (samples.parquet)",
        "new samples need a new dataset (the mapping is fixed by the first shardset)",
    )
    owner = mapping.shard[p] if len(p) else np.empty(0, np.int64)
    wrong = np.flatnonzero(valid & (owner != k))
    yield from errors(
        wrong,
        lambda r: (
            f"uid belongs to shard {int(owner[r])} (as in "
            f"{shard_file(reference[0], int(owner[r]), reference[1])})"
        ),
        "a sample lives in the same shard index in every shardset; use `add --route`",
    )
    _, first, counts = np.unique(p[valid], return_index=True, return_counts=True)
    dup_rows = np.flatnonzero(valid)[first[counts > 1]]
    yield from errors(
        dup_rows,
        lambda r: "duplicate uid within the shardset",
        "UIDs must be unique within a shardset",
    )
    more = (
        max(0, len(unknown) - MAX_PER_FILE)
        + max(0, len(wrong) - MAX_PER_FILE)
        + max(0, len(dup_rows) - MAX_PER_FILE)
    )
    if more:
        yield ShardsetError(f"{more} more violations in this file", path=display, shard=k)


def check_dataset(root: str | os.PathLike[str] | Location) -> list[DatamillError]:
    """Every violation in the dataset at ``root`` (empty list when valid).

    Examples:
        >>> import tempfile, pyarrow as pa
        >>> from datamill.shards import ShardsetDataset
        >>> root = tempfile.mkdtemp() + "/ds"
        >>> _ = ShardsetDataset.create(
        ...     root, pa.table({"uid": [1, 2, 3]}), uid="uid", shardset="a", shard_size=2
        ... )
        >>> check_dataset(root)
        []
    """
    from datamill.shards._fs import resolve

    loc = root if isinstance(root, Location) else resolve(root)
    out: list[DatamillError] = []
    try:
        manifest = loc.read_json(DATASET_MANIFEST)
    except DatamillError as exc:
        return [exc]
    parsed, problems = manifest_problems(manifest, path=loc.show(DATASET_MANIFEST))
    if parsed is None:
        return list(problems)
    out.extend(problems)
    uid_col, n = manifest["uid_column"], int(manifest["num_shards"])
    if manifest.get("data_dir"):  # the generation an object-store overwrite wrote (validated above)
        out.extend(
            _unlisted(
                loc,
                {DATASET_MANIFEST},
                "not listed in the manifest (left by an interrupted overwrite?)",
                "remove it; the next overwrite removes it too",
            )
        )
        loc = loc.child(manifest["data_dir"])
    try:
        mt = read_any(loc.fs, loc.join(SAMPLES_FILE), display=loc.show(SAMPLES_FILE))
        mapping = Mapping.from_table(mt, uid_col, n)
    except DatamillError as exc:
        return [*out, exc]
    except (KeyError, ValueError, pa.ArrowException) as exc:
        return [
            *out,
            ShardsetError(
                f"the mapping is unusable (a missing column or a bad shard index?): {exc}",
                path=loc.show(SAMPLES_FILE),
            ),
        ]
    out.extend(_mapping_problems(mapping, n, loc.show(SAMPLES_FILE)))
    sets = manifest.get("shardsets", [])
    out.extend(
        _unlisted(
            loc,
            {ss["name"] for ss in sets} | {DATASET_MANIFEST, SAMPLES_FILE},
            "not listed in the manifest (left by an interrupted add?)",
            "remove it, or add it again with `datamill shards add`",
        )
    )
    out.extend(_litter(loc))
    ref = (sets[0]["name"], sets[0]["format"]) if sets else ("?", "parquet")
    for ss in sets:
        out.extend(_check_shardset(loc, ss, uid_col=uid_col, n=n, mapping=mapping, ref=ref))
    return out


def _unlisted(loc: Location, known: set[str], what: str, hint: str) -> list[DatamillError]:
    """An error per entry of ``loc`` (but hidden ones) the manifest does not list."""
    return [
        ShardsetError(what, path=loc.show(entry), hint=hint)
        for entry in loc.listdir()
        if not entry.startswith(".") and entry not in known
    ]


def _mapping_problems(mapping: Mapping, n: int, where: str) -> list[DatamillError]:
    """Shard indices out of range or unsorted, duplicate UIDs."""
    out: list[DatamillError] = []
    if len(mapping.shard) and (mapping.shard.min() < 0 or mapping.shard.max() >= n):
        out.append(ShardsetError(f"shard indices must be in [0, {n})", path=where))
    if len(mapping.shard) and np.any(np.diff(mapping.shard) < 0):
        out.append(ShardsetError("the mapping is not sorted by shard", path=where))
    if pc.count_distinct(mapping.uids).as_py() != len(mapping.uids):
        out.append(ShardsetError("duplicate UIDs in the mapping", path=where))
    return out


def _litter(loc: Location) -> Iterator[DatamillError]:
    """Temporary files/folders of killed writers (local datasets; the next ``add`` removes them)."""
    from datamill.core.io import find_litter

    if loc.remote:
        return
    for entry in find_litter(loc.path):
        yield ShardsetError(
            "a temporary file/folder left by an interrupted run (its process is gone)",
            path=loc.show(entry.name),
            hint="delete it, or let the next `datamill shards add` remove it",
        )


def _check_shardset(
    loc: Location,
    ss: dict[str, Any],
    *,
    uid_col: str,
    n: int,
    mapping: Mapping,
    ref: tuple[str, str],
) -> Iterator[DatamillError]:
    name, fmt = (
        ss["name"],
        ss["format"],
    )  # (counts disagreeing with num_shards: see manifest_problems)
    expected = {SHARD_PATTERN.format(index=k, ext=fmt) for k in range(n)}
    present = set(loc.listdir(name))
    if not loc.exists(name):
        yield ShardsetError("the shardset folder is missing", path=loc.show(name))
        return
    for extra in sorted(present - expected):
        if extra.startswith("shard."):
            yield ShardsetError(
                f"unexpected shard file (the manifest lists {n} shards)", path=loc.show(name, extra)
            )
    try:
        schema = schema_from_b64(ss["schema"])
    except (pa.ArrowException, ValueError):
        return  # reported by manifest_problems
    shard_rows = ss["shard_rows"]
    for k in range(n):
        rel = shard_file(name, k, fmt)
        if SHARD_PATTERN.format(index=k, ext=fmt) not in present:
            yield ShardsetError("shard file is missing", path=loc.show(rel), shard=k)
            continue
        try:
            t = read_any(loc.fs, loc.join(rel), display=loc.show(rel), schema=schema)
        except DatamillError as exc:
            yield exc
            continue
        if k < len(shard_rows) and t.num_rows != shard_rows[k]:
            yield ShardsetError(
                f"expected {shard_rows[k]} rows (manifest), got {t.num_rows}",
                path=loc.show(rel),
                shard=k,
            )
        yield from shard_problems(
            t,
            display=loc.show(rel),
            k=k,
            uid_column=uid_col,
            mapping=mapping,
            columns=list(ss["columns"]),
            reference=ref,
        )


def _plain(value: object) -> object:
    """``value`` as a JSON scalar (UIDs may be numpy scalars or bytes)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def violation_dict(err: DatamillError) -> dict[str, Any]:
    """One violation as a plain dict with the keys :data:`VIOLATION_KEYS`.

    ``kind`` is the error class name, ``message`` what is wrong without the location (which is in
    ``path``/``shard``/``uid``/``column``/``row``), ``hint`` how to fix it (or ``None``).

    Examples:
        >>> violation_dict(
        ...     ShardsetError("a UID is null", path="a/shard.00000.parquet", row=3, shard=0)
        ... )
        {'kind': 'ShardsetError', 'message': 'a UID is null', 'path': 'a/shard.00000.parquet', \
'shard': 0, 'uid': None, 'column': None, 'row': 3, 'hint': None}
    """
    return {
        "kind": type(err).__name__,
        "message": err.msg,
        "path": err.path,
        "shard": _plain(err.shard),
        "uid": _plain(err.uid),
        "column": err.column,
        "row": err.row,
        "hint": err.hint,
    }


def check_report(root: str | os.PathLike[str] | Location) -> list[dict[str, Any]]:
    """Every violation of the dataset at ``root`` as JSON-able dicts (see :func:`violation_dict`).

    The same violations as :func:`check_dataset`, in the same order; an empty list when valid.

    Examples:
        >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> from datamill.shards import ShardsetDataset
        >>> root = tempfile.mkdtemp() + "/ds"
        >>> ds = ShardsetDataset.create(
        ...     root, pa.table({"uid": [1, 2, 3]}), uid="uid", shardset="a", shard_size=2
        ... )
        >>> check_report(root)
        []
        >>> pq.write_table(pa.table({"uid": [3, 2]}), root + "/a/shard.00001.parquet")
        >>> [(v["kind"], v["shard"], v["uid"], v["message"]) for v in check_report(root)][1]
        ('ShardsetError', 1, 2, 'uid belongs to shard 0 (as in a/shard.00000.parquet)')
    """
    return [violation_dict(e) for e in check_dataset(root)]
