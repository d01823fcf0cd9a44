"""What a :class:`~datamill.shards.ShardsetDataset` says about itself, from its manifest and a
folder listing (no shard file read): the ``datamill shards info`` summary and the web UI's
description."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from datamill.core.constants import DATASET_MANIFEST

if TYPE_CHECKING:
    from datamill.shards.dataset import ShardsetDataset

__all__ = ["description", "summary"]


def summary(ds: ShardsetDataset) -> str:
    """The short human-readable summary of :meth:`ShardsetDataset.info`."""
    n = len(ds)
    lines = [
        (
            f"{ds.manifest.get('name', '')}: {n:,} samples, {ds.num_shards} shards, "
            f"uid column {ds.uid_column!r} ({ds.uids.type})"
        )
    ]
    for name, ss in ds._sets.items():
        have = int(sum(ss["shard_rows"]))
        cols = ", ".join(f"{c}:{ds._schemas[name].field(c).type}" for c in ss["columns"])
        lines.append(f"  {name} [{ss['format']}]: {have:,} samples, {n - have:,} missing; {cols}")
    return "\n".join(lines)


def description(ds: ShardsetDataset) -> dict[str, Any]:
    """The JSON-able description of :meth:`ShardsetDataset.describe`."""
    n = len(ds)
    sets: list[dict[str, Any]] = []
    for name, ss in ds._sets.items():
        rows = int(sum(ss["shard_rows"]))
        schema = ds._schemas[name]
        sets.append(
            {
                "name": name,
                "format": ss["format"],
                "num_shards": int(ss["num_shards"]),
                "columns": [{"name": c, "type": str(schema.field(c).type)} for c in ss["columns"]],
                "rows": rows,
                "missing": n - rows,
                "bytes": ds.loc.tree_size(ds._rel(name)),
            }
        )
    total = (
        ds.loc.size(DATASET_MANIFEST)
        + ds.loc.size(ds.samples_path)
        + sum(ss["bytes"] for ss in sets)
    )
    return {
        "root": ds.loc.display,
        "name": ds.manifest.get("name", ""),
        "uid_column": ds.uid_column,
        "uid_type": str(ds.uids.type),
        "num_samples": n,
        "num_shards": ds.num_shards,
        "fingerprint": ds.fingerprint(),
        "shardsets": sets,
        "bytes": total,
    }
