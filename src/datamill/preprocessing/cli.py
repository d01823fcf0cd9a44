"""``datamill preprocess DATASET --config C [--output-dir D] [--skip-save] [--metadata M]``."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

from datamill.core.checks import Limit
from datamill.core.cliargs import add_engine, add_overwrite

__all__ = ["MAX_IMAGE_PIXELS", "register"]

MAX_IMAGE_PIXELS = Limit("max_image_pixels", low=1)


def _cmd(args: argparse.Namespace) -> int:
    from datamill.core.errors import ConfigError
    from datamill.preprocessing.api import preprocess

    if args.config is None and args.metadata is None:
        raise ConfigError("--config is required (or --metadata of an earlier run to apply)")
    options = {"address": args.address, "fmt": args.format} if args.engine == "ray" else None
    if args.engine == "local" and (args.address is not None or args.format != "shards"):
        raise ConfigError("--address and --format apply to --engine ray")
    with _image_pixel_limit(args.max_image_pixels):
        out = preprocess(
            args.dataset,
            args.config,
            output_dir=args.output_dir,
            skip_save=args.skip_save,
            metadata=args.metadata,
            engine=args.engine,
            engine_options=options,
            overwrite=args.overwrite,
        )
    _print_outcome(args, out)
    if args.check_splits != "off" and out.hdf5_path is not None:
        from datamill.core.commands import command_handler

        report_splits = command_handler(
            "report-splits", hint="the split check is datamill.lineage's (`datamill check-splits`)"
        )
        report_splits(out.hdf5_path, fail=args.check_splits == "error")
    return 0


def _print_outcome(args: argparse.Namespace, out: Any) -> None:
    """What ``preprocess`` did: rows, features, fitted/applied/cached, the tensors and files."""
    from datamill.preprocessing.summary import format_table, tensor_rows

    state = (
        "reused cache"
        if out.cached
        else ("applied " + args.metadata if args.metadata else "fitted")
    )
    print(
        f"{args.dataset}: {out.num_rows:,} rows, {len(out.metadata.features)} features, "
        f"{state} in {out.seconds:.2f} s"
    )
    if not out.cached or args.skip_save:
        print(format_table(tensor_rows(out.data, out.metadata)))
    dataset_path = getattr(out, "dataset_path", None)
    if dataset_path is not None:
        print(
            f"wrote {dataset_path} (shardset dataset) and {out.meta_path}"
            if not out.cached
            else f"output: {dataset_path} (shardset dataset) and {out.meta_path}"
        )
    if out.hdf5_path is not None:
        print(
            f"wrote {out.hdf5_path} and {out.meta_path}"
            if not out.cached
            else f"output: {out.hdf5_path}"
        )


@contextlib.contextmanager
def _image_pixel_limit(pixels: int | None) -> Iterator[None]:
    """Pillow's decompression-bomb limit for this run (images above twice it are refused)."""
    if pixels is None:
        yield
        return
    from PIL import Image

    before = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = pixels
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = before


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``preprocess`` subcommand."""
    p = sub.add_parser(
        "preprocess",
        help="typed features (Ludwig-style config) -> HDF5 + meta.json",
        description="Preprocess a CSV/TSV/Parquet/JSONL file into <stem>.hdf5 + <stem>.meta.json.",
    )
    p.add_argument("dataset", help="input file (csv, tsv, parquet, jsonl)")
    p.add_argument(
        "--config", "-c", help="YAML/JSON config (input_features, output_features, preprocessing)"
    )
    p.add_argument("--output-dir", "-o", help="output folder (default: beside the input)")
    p.add_argument("--skip-save", action="store_true", help="compute only, write nothing")
    add_overwrite(p, target="the output paths")
    p.add_argument(
        "--metadata", "-m", help="apply this meta.json to unseen data (nothing refitted)"
    )
    add_engine(p, output="output as a shardset dataset")
    p.add_argument(
        "--format",
        choices=["shards", "hdf5"],
        default="shards",
        help="with --engine ray: shards (<stem>.shards/ + meta.json, default) or hdf5 (also "
        "<stem>.hdf5)",
    )
    p.add_argument(
        "--max-image-pixels",
        type=MAX_IMAGE_PIXELS.arg,
        default=None,
        help="image features: Pillow's decompression-bomb limit in pixels (default 89,478,485; "
        "images "
        "above twice it are refused with the row that names them)",
    )
    p.add_argument(
        "--check-splits",
        choices=["off", "warn", "error"],
        default="off",
        help="after writing: report validation/test rows equal or near-equal to training rows "
        "(`datamill check-splits`); error: exit 2 when there are any (default off)",
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="no progress bars (same as datamill --quiet)",
    )
    p.set_defaults(func=_cmd)
