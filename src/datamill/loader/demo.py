"""Demo section: one epoch over the cifar10_tiny shardset dataset with 2 ranks (PNGs decoded by a
transform in the workers), batch shapes, stats and a resume check."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from datamill.loader.options import Batching, Workers

if TYPE_CHECKING:
    from datamill.core.parquet import ParquetSource
    from datamill.core.source import Source
    from datamill.shards import ShardsetDataset

__all__ = ["run"]


def _cifar_parquet(data_dir: Path, work_dir: Path) -> ParquetSource:
    """cifar10_tiny as a Parquet file (4 row groups): uid, image (32x32x3 uint8), label."""
    import pyarrow.parquet as pq
    from PIL import Image

    from datamill.core.io import atomic_path, read_table
    from datamill.core.parquet import ParquetSource

    root = data_dir / "cifar10_tiny"
    labels = read_table(root / "labels.csv")
    images = np.stack(
        [
            np.asarray(Image.open(root / p).convert("RGB"), dtype=np.uint8)
            for p in labels.column("image_path").to_pylist()
        ]
    )
    flat = pa.array(images.reshape(-1))
    for dim in reversed(images.shape[1:]):  # innermost (channels) first
        flat = pa.FixedSizeListArray.from_arrays(flat, dim)
    table = pa.table({"uid": labels.column("id"), "image": flat, "label": labels.column("label")})
    out = work_dir / "loader_cifar10_tiny.parquet"
    with atomic_path(out) as tmp:
        pq.write_table(table, tmp, row_group_size=25)
    return ParquetSource(out)


def _cifar_shardset(data_dir: Path, work_dir: Path) -> ShardsetDataset:
    """cifar10_tiny as a shardset dataset: ``image`` (PNG bytes), ``label``, ``caption`` (20%
    missing)."""
    import shutil

    from datamill.core.io import read_table
    from datamill.shards import ShardsetDataset

    root = data_dir / "cifar10_tiny"
    labels = read_table(root / "labels.csv")
    pngs = pa.array(
        [(root / p).read_bytes() for p in labels.column("image_path").to_pylist()], pa.binary()
    )
    out = work_dir / "loader_cifar_shards"
    shutil.rmtree(out, ignore_errors=True)
    ds = ShardsetDataset.create(
        out,
        pa.table({"id": labels.column("id"), "png": pngs}),
        uid="id",
        shardset="image",
        shard_size=30,
    )
    ds = ds.add("label", labels.select(["id", "label"]), route=True)
    keep = pa.array(np.flatnonzero(np.arange(labels.num_rows) % 5 != 4))
    captions = pa.table(
        {
            "id": labels.column("id"),
            "caption": [f"a photo of a {x}" for x in labels.column("label").to_pylist()],
        }
    )
    return ds.add("caption", captions.take(keep), route=True)


def decode_png(table: pa.Table) -> pa.Table:
    """A transform (runs in the loader's workers): PNG bytes -> ``image`` uint8 (32, 32, 3)."""
    import io

    from PIL import Image

    images = np.stack(
        [
            np.asarray(Image.open(io.BytesIO(b)).convert("RGB"), dtype=np.uint8)
            for b in table.column("png").to_pylist()
        ]
    )
    flat = pa.array(images.reshape(-1))
    for dim in reversed(images.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, dim)
    return table.drop_columns(["png"]).append_column("image", flat)


def _source(
    data_dir: Path, work_dir: Path
) -> tuple[Source, str, Callable[[pa.Table], pa.Table] | None]:
    try:
        return (
            _cifar_shardset(data_dir, work_dir),
            "shardset dataset (image PNG / label / caption)",
            decode_png,
        )
    except ImportError:  # datamill.shards not installed
        return _cifar_parquet(data_dir, work_dir), "Parquet (4 row groups)", None


def run(data_dir: Path, work_dir: Path) -> None:
    """Print a short tour of the loader (< 25 lines)."""
    from datamill.loader.loader import Loader

    work_dir.mkdir(parents=True, exist_ok=True)
    source, kind, transform = _source(Path(data_dir), Path(work_dir))
    n = int(source.shard_sizes().sum())
    print(
        f"loader: cifar10_tiny as a {kind}: {n} samples, {source.num_shards} shards, columns "
        f"{source.columns}"
    )
    seen: list[Any] = []
    for rank in range(2):
        loader = Loader(
            source,
            16,
            seed=7,
            rank=rank,
            world_size=2,
            batching=Batching(transform=transform),
            workers=Workers(threads=2),
        )
        batches = list(loader)
        first = batches[0]
        shapes = ", ".join(
            f"{k} {tuple(v.shape)} {v.dtype}" for k, v in first.items() if k != "caption"
        )
        s = loader.stats()
        print(f"  rank {rank}: {len(batches)} batches; first: {shapes}")
        print(
            f"    stats: read {s['read']}, filtered {s['filtered']}, failed {s['failed']}, "
            f"yielded {s['yielded']}, "
            f"{s['samples_per_s']:,.0f} samples/s"
        )
        seen += [u for b in batches for u in b[source.columns[0]].tolist()]
    print(f"  every sample exactly once over both ranks: {len(seen) == len(set(seen)) == n}")
    uid = source.columns[0]
    full = [b[uid].tolist() for b in Loader(source, 8, seed=3, epoch=1, columns=[uid])]
    loader = Loader(source, 8, seed=3, epoch=1, columns=[uid], workers=Workers(threads=2))
    it = iter(loader)
    head = [next(it)[uid].tolist() for _ in range(5)]
    state = loader.state_dict()
    it.close()
    tail = [b[uid].tolist() for b in Loader.from_state(source, state, workers=Workers(threads=0))]
    print(
        f"  resume after 5 batches (2 workers -> 0): state {state['batches_seen']} batches/"
        f"{state['samples_seen']} samples; rest identical to the uninterrupted run: "
        f"{head + tail == full}"
    )
