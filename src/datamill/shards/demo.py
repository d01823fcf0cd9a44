"""Demo section: a shardset dataset from cifar10_tiny (image bytes, labels, partial captions)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

__all__ = ["cifar_tables", "run"]


def cifar_tables(data_dir: Path) -> tuple[pa.Table, pa.Table]:
    """cifar10_tiny's ``labels.csv`` and its images (``id``, ``image_path``, ``png``: the file's
    bytes), the tables the shards and serve demos build their datasets from."""
    from datamill.core.io import read_table

    src = Path(data_dir) / "cifar10_tiny"
    labels = read_table(src / "labels.csv")
    paths = labels.column("image_path").to_pylist()
    images = pa.table(
        {
            "id": labels.column("id"),
            "image_path": paths,
            "png": pa.array([(src / p).read_bytes() for p in paths], pa.binary()),
        }
    )
    return labels, images


def run(data_dir: Path, work_dir: Path) -> None:
    """Build ``image`` / ``label`` / ``caption`` shardsets and print ``info`` and one sample."""
    from datamill.shards.check import check_dataset
    from datamill.shards.dataset import ShardsetDataset

    labels, images = cifar_tables(data_dir)
    root = Path(work_dir) / "cifar_shards"
    shutil.rmtree(root, ignore_errors=True)
    ds = ShardsetDataset.create(root, images, uid="id", shardset="image", shard_size=25)
    ds = ds.add("label", labels.select(["id", "label"]), route=True)
    keep = np.flatnonzero(np.arange(labels.num_rows) % 5 != 4)  # every 5th sample has no caption
    lab = labels.take(pa.array(keep))
    captions = [f"a small photo of a {x}" for x in lab.column("label").to_pylist()]
    reversed_rows = pa.array(
        np.arange(len(keep))[::-1]
    )  # any row order: --route puts rows in place
    ds = ds.add(
        "caption",
        pa.table({"id": lab.column("id"), "caption": captions}).take(reversed_rows),
        route=True,
    )
    print(f"shards: {root}")
    print(ds.info())
    uid = ds.uids[4].as_py()
    row = ds.get(uid)
    row["png"] = f"<{len(row['png'])} bytes PNG>"
    print(f"get({uid!r}) = {row}")
    inner = ds.read_shard(0, join="inner")
    print(
        f"read_shard(0, join='inner'): {inner.num_rows} rows, dropped per shardset "
        f"{ds.last_dropped}"
    )
    print(f"check: {len(check_dataset(root))} violations")
