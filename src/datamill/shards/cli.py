"""``datamill shards {create,add,check,info,get,export}``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from datamill.core.checks import SHARD_SIZE
from datamill.core.cliargs import add_columns, add_overwrite, columns_of
from datamill.core.errors import ConfigError

__all__ = ["register"]


def _create(args: argparse.Namespace) -> int:
    from datamill.shards.dataset import ShardsetDataset

    if args.from_peer:
        from datamill.shards.peers import from_peer

        if len(args.files) != 1 or args.shard_size is None:
            raise ConfigError(
                "--from FORMAT PATH takes one PATH (no shard files) and needs --shard-size N",
                hint="datamill shards create ROOT --uid U --shardset S --from mds PATH "
                "--shard-size N",
            )
        ds = from_peer(
            args.from_peer,
            args.files[0],
            args.root,
            uid=args.uid,
            shardset=args.shardset,
            shard_size=args.shard_size,
            add_uid=args.add_uid,
            overwrite=args.overwrite,
        )
        print(ds.info())
        return 0

    one = len(args.files) == 1 and (
        args.shard_size is not None or args.files[0].lower().endswith((".hdf5", ".h5"))
    )
    source: str | list[str] = args.files[0] if one else args.files
    ds = ShardsetDataset.create(
        args.root,
        source,
        uid=args.uid,
        shardset=args.shardset,
        shard_size=args.shard_size if one else None,
        fmt=args.format,
        add_uid=args.add_uid,
        overwrite=args.overwrite,
    )
    print(ds.info())
    return 0


def _add(args: argparse.Namespace) -> int:
    from datamill.shards.dataset import ShardsetDataset

    ds = ShardsetDataset(args.root)
    if args.route and len(args.files) != 1:
        raise ConfigError(
            f"--route takes exactly one table file, got {len(args.files)}",
            hint="route one UID-keyed table at a time",
        )
    ds = ds.add(
        args.shardset,
        args.files[0] if args.route else args.files,
        route=args.route,
        fmt=args.format,
    )
    print(ds.info())
    return 0


def _check(args: argparse.Namespace) -> int:
    from datamill.core.constants import DATASET_MANIFEST
    from datamill.shards._fs import resolve
    from datamill.shards.check import check_dataset, violation_dict

    loc = resolve(args.root)
    loc.read_json(DATASET_MANIFEST)  # not a dataset folder at all: one error line, exit 2
    problems = check_dataset(loc)
    if args.json:
        print(json.dumps([violation_dict(p) for p in problems], indent=2))
        return 0 if not problems else 1
    for p in problems:
        print(p.one_line())
    print(f"{args.root}: {'OK' if not problems else f'{len(problems)} violations'}")
    return 0 if not problems else 1


def _info(args: argparse.Namespace) -> int:
    from datamill.shards.dataset import ShardsetDataset

    ds = ShardsetDataset(args.root)
    print(json.dumps(ds.describe(), indent=2) if args.json else ds.info())
    return 0


def _get(args: argparse.Namespace) -> int:
    from datamill.core.source import uid_from_text
    from datamill.shards.dataset import ShardsetDataset

    ds = ShardsetDataset(args.root)
    uid = uid_from_text(args.uid, ds.uids.type)
    row = ds.get(args.uid if uid is None else uid, columns=columns_of(args.columns))
    print(
        json.dumps(
            {k: (f"<{len(v)} bytes>" if isinstance(v, bytes) else v) for k, v in row.items()},
            default=str,
        )
    )
    return 0


def _export(args: argparse.Namespace) -> int:
    from datamill.shards.convert import export
    from datamill.shards.dataset import ShardsetDataset

    table = export(
        ShardsetDataset(args.root),
        args.out,
        columns=columns_of(args.columns),
        join=args.join,
        overwrite=args.overwrite,
    )
    print(f"{args.out}: {table.num_rows:,} rows, columns {table.column_names}")
    return 0


# long (71 lines): argparse declarations, one add_argument call per option
def register(sub: Any) -> None:
    """Add ``datamill shards ...`` to the CLI."""
    p = sub.add_parser(
        "shards", help="UID-keyed shardset datasets: create, add, check, info, get, export"
    )
    s = p.add_subparsers(dest="shards_command", required=True)
    c = s.add_parser("create", help="create a dataset from shard files or one table (--shard-size)")
    c.add_argument("root")
    c.add_argument("--uid", required=True, help="the UID column")
    c.add_argument("--shardset", required=True)
    # files is "+" (not "*"): with "*" argparse gives ROOT's chunk an empty list and then refuses
    # the files after --uid/--shardset; --from's PATH is therefore the one FILES argument (`--from
    # mds PATH` reads the same)
    c.add_argument(
        "files",
        nargs="+",
        help="shard files in shard order, or one table (CSV/Parquet/HDF5); "
        "with --from: the peer's dataset",
    )
    c.add_argument(
        "--from",
        dest="from_peer",
        choices=["mds", "litdata", "webdataset", "hf"],
        default=None,
        metavar="FORMAT",
        help="import a peer's dataset (`--from FORMAT PATH`): mds, litdata, "
        "webdataset or hf (a save_to_disk folder)",
    )
    c.add_argument(
        "--shard-size",
        type=SHARD_SIZE.arg,
        default=None,
        help="cut one table into shards of N rows",
    )
    c.add_argument("--format", choices=["parquet", "csv"], default="parquet")
    c.add_argument(
        "--add-uid", action="store_true", help="add the UID column as row numbers if absent"
    )
    add_overwrite(c, target="ROOT", note=" (an existing dataset there is replaced as a whole)")
    c.set_defaults(func=_create)
    a = s.add_parser(
        "add", help="add a shardset (shard files respecting the mapping, or --route one table)"
    )
    a.add_argument("root")
    a.add_argument("--shardset", required=True)
    a.add_argument("files", nargs="+")
    a.add_argument(
        "--route", action="store_true", help="route the rows of one UID-keyed table to their shards"
    )
    a.add_argument("--format", choices=["parquet", "csv"], default="parquet")
    a.set_defaults(func=_add)
    k = s.add_parser("check", help="validate everything; list every violation")
    k.add_argument("root")
    k.add_argument(
        "--json", action="store_true", help="print the violations as a JSON list of dicts"
    )
    k.set_defaults(func=_check)
    i = s.add_parser("info", help="shardsets, columns, shards, samples and missing counts")
    i.add_argument("root")
    i.add_argument("--json", action="store_true", help="print describe() as JSON")
    i.set_defaults(func=_info)
    g = s.add_parser("get", help="print one joined sample")
    g.add_argument("root")
    g.add_argument("uid")
    add_columns(g)
    g.set_defaults(func=_get)
    e = s.add_parser("export", help="write the joined dataset to one Parquet/CSV file")
    e.add_argument("root")
    e.add_argument("out")
    add_columns(e)
    e.add_argument("--join", choices=["left", "inner"], default="left")
    add_overwrite(e, target="OUT", note=" (an earlier export is replaced anyway)")
    e.set_defaults(func=_export)
