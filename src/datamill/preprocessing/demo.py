"""``datamill demo`` section: house prices (numbers, categories with NA, a binary) and CIFAR-10 tiny
(images + category label) → HDF5, then a cache rerun and the house prices metadata applied to
rows."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

__all__ = ["HOUSE_CONFIG", "IMAGE_CONFIG", "run"]

HOUSE_CONFIG: dict[str, Any] = {
    "input_features": [
        {"name": "LotArea", "type": "number", "preprocessing": {"normalization": "zscore"}},
        {
            "name": "LotFrontage",
            "type": "number",
            "preprocessing": {
                "normalization": "minmax",
                "missing_value_strategy": "fill_with_mean",
            },
        },
        {"name": "MSZoning", "type": "category"},
        {"name": "Alley", "type": "category"},  # mostly NA -> <UNK>
        {"name": "MSSubClass", "type": "category"},  # integers kept as their strings
        {"name": "CentralAir", "type": "binary"},  # Y/N
    ],
    "output_features": [
        {"name": "SalePrice", "type": "number", "preprocessing": {"normalization": "log1p"}}
    ],
    "preprocessing": {"split": {"type": "random", "probabilities": [0.7, 0.1, 0.2]}, "seed": 42},
}

IMAGE_CONFIG: dict[str, Any] = {
    "input_features": [
        {
            "name": "image_path",
            "type": "image",
            "preprocessing": {"height": 32, "width": 32, "num_channels": 3},
        }
    ],
    "output_features": [{"name": "label", "type": "category"}],
}


def _show(title: str, out: Any, seconds: float) -> None:
    from datamill.preprocessing.summary import tensor_rows

    print(
        f"  {title}: {out.num_rows:,} rows in {seconds * 1000:.0f} "
        f"ms{' (cache)' if out.cached else ''}"
    )
    for key, shape, dtype, vocab in tensor_rows(out.data, out.metadata):
        print(f"    {key:<12} {shape:<18} {dtype:<8} vocab {vocab}")


def run(data_dir: Path, work_dir: Path) -> None:
    """Preprocess the two shared datasets in ``work_dir`` and print a short table."""
    from datamill.core.errors import ConfigError
    from datamill.preprocessing.api import preprocess

    work = Path(work_dir) / "preprocess"
    work.mkdir(parents=True, exist_ok=True)
    house = work / "house_prices_train.csv"
    shutil.copy(Path(data_dir) / "house_prices_train.csv", house)
    t = time.perf_counter()
    out = preprocess(house, HOUSE_CONFIG)
    _show("house_prices_train.csv", out, time.perf_counter() - t)
    t = time.perf_counter()
    again = preprocess(house, HOUSE_CONFIG)
    print(
        f"  rerun, same input + config: cache reused={again.cached} in "
        f"{(time.perf_counter() - t) * 1000:.1f} ms"
    )

    cifar = work / "cifar10_tiny"
    shutil.copytree(Path(data_dir) / "cifar10_tiny", cifar, dirs_exist_ok=True)
    t = time.perf_counter()
    try:
        img = preprocess(cifar / "labels.csv", IMAGE_CONFIG)
    except ConfigError as exc:  # the image type not available in this build
        print(f"  cifar10_tiny: skipped ({exc.one_line()})")
        return
    _show("cifar10_tiny/labels.csv", img, time.perf_counter() - t)
