"""``datamill iterate SOURCE`` (iterate with the Loader, print throughput), ``datamill plan
SOURCE`` (plan a run without reading data: shard reads, memory, cache traffic, first batch, shuffle
quality) and ``datamill describe SOURCE`` (what a dataset holds: counts, column statistics, checks;
:mod:`datamill.loader.describe`)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from datamill.core.checks import (
    PREFETCH,
    WINDOW,
    Limit,
)
from datamill.core.cliargs import (
    add_batch_size,
    add_cache,
    add_columns,
    add_epochs,
    add_order,
    add_ranks,
    add_served,
    add_threads,
    cache_bytes,
    columns_of,
)
from datamill.loader.options import Batching, Workers
from datamill.loader.planner import RANKS_PER_NODE

__all__ = ["register"]

LIMIT = Limit("limit", low=0)
SHOW = Limit("show", low=0, high=100_000)
READ_SPEED_MIB = Limit("read_speed", low=0, low_open=True, high=1e9, kind="float")
"""--read-speed in MiB/s (the planner's read_bytes_per_s times 2**20)."""


def _open(args: argparse.Namespace) -> Any:
    from datamill.core.objstore import is_remote
    from datamill.loader.sources import open_source

    if getattr(args, "split", None) is not None:  # `iterate --split` (plan has no such flag)
        from datamill.loader.sources import HDF5Source

        return HDF5Source(args.source, split=args.split)
    if is_remote(
        args.source
    ):  # a shardset dataset or Parquet objects, through the local shard cache
        limit = cache_bytes(args.cache_limit)
        return open_source(args.source, cache_dir=args.cache_dir, cache_limit=limit)
    return open_source(args.source)


def _remote(args: argparse.Namespace) -> int:
    """``datamill iterate DATASET --url URL``: the same as ``datamill serve iterate`` (its
    registered handler)."""
    from datamill.core.commands import command_handler

    run_iterate = command_handler(
        "serve iterate", hint="install the serve extra: pip install 'datamill[serve]'"
    )
    served = argparse.Namespace(  # the names `datamill serve iterate` parses
        dataset=args.source,
        url=args.url,
        key=args.key,
        batch_size=args.batch_size,
        seed=args.seed,
        columns=args.columns,
        rank=args.rank,
        world_size=args.world_size,
        mode=args.mode,
        name=args.name,
        limit=args.limit,
        save_state=args.save_state,
        transport=args.transport,
    )
    return int(run_iterate(served))


def _check_transport(args: argparse.Namespace) -> None:
    from datamill.core.errors import ConfigError

    if args.transport is not None and not args.url:
        raise ConfigError(
            "--transport chooses who builds a served dataset's batches; it needs --url",
            hint="add --url http://HOST:PORT, or drop --transport",
        )
    if args.url and args.save_record:
        raise ConfigError(
            "--save-record works for in-process runs; a served iteration's record is on the server"
        )


def _cmd(args: argparse.Namespace) -> int:
    _check_transport(args)
    if args.url:
        args.transport = args.transport or "built"
        return _remote(args)
    from datamill.core.io import check_output
    from datamill.loader.loader import Loader

    if args.save_state:
        check_output(
            args.save_state, is_own=_is_state_file, inputs=[args.source], what="loader state file"
        )
    if args.save_record:
        _check_record_output(args)
    source = _open(args)
    cols = columns_of(args.columns)
    loader = Loader(
        source,
        args.batch_size,
        seed=args.seed,
        columns=cols,
        rank=args.rank,
        world_size=args.world_size,
        batching=Batching(shuffle=not args.no_shuffle, drop_last=args.drop_last),
        workers=Workers(threads=args.num_workers, progress=True),
    )
    if args.resume:
        _resume(loader, args.resume)
    n = int(source.shard_sizes().sum())
    print(
        f"{type(source).__name__}: {n:,} samples in {source.num_shards} shards; "
        f"rank {args.rank}/{args.world_size}: {len(loader)} batches of {args.batch_size}"
    )
    start = time.perf_counter()
    shapes: dict[str, Any] = {}
    first_epoch = loader.epoch
    for e in range(args.epochs):
        if e:
            loader.set_epoch(first_epoch + e)  # also after an epoch cut short by --limit
        got = _run_epoch(loader, args.limit)
        shapes = shapes or got
    if shapes:
        print("batch: " + ", ".join(f"{k} {v}" for k, v in shapes.items()))
    print(f"total {time.perf_counter() - start:.2f} s")
    if args.save_state:
        from datamill.core.io import atomic_write

        with atomic_write(args.save_state, "w") as f:
            json.dump(loader.state_dict(), f, indent=2, sort_keys=True)
        print(f"state -> {args.save_state}")
    if args.save_record:
        _save_record(loader, args.save_record)
    return 0


def _run_epoch(loader: Any, limit: int) -> dict[str, Any]:
    """Iterate one epoch (at most ``limit`` batches, 0: all), print its statistics; the first
    batch's shapes."""
    shapes: dict[str, Any] = {}
    for i, batch in enumerate(loader):
        if not shapes and isinstance(batch, dict):
            shapes = {k: tuple(getattr(v, "shape", (len(v),))) for k, v in batch.items()}
        if limit and i + 1 >= limit:
            break
    s = loader.stats()
    print(
        f"epoch {s['epoch']}: read {s['read']:,}, filtered {s['filtered']:,}, failed "
        f"{s['failed']:,}, yielded {s['yielded']:,} in {s['elapsed_s']:.2f} s "
        f"({s['samples_per_s']:,.0f} samples/s; first batch after "
        f"{(s['first_batch_s'] or 0) * 1000:.1f} ms)"
    )
    return shapes


def _is_record_file(path: Path) -> bool:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and str(record.get("format", "")).startswith("datamill.run/")


def _check_record_output(args: argparse.Namespace) -> None:
    from datamill.core.errors import ConfigError
    from datamill.core.io import check_output

    if args.limit and args.epochs > 1:
        raise ConfigError(
            "--save-record with --limit and --epochs > 1 would record epochs as complete that "
            "--limit cut short",
            hint="record one epoch at a time (--epochs 1), or drop --limit",
        )
    check_output(args.save_record, is_own=_is_record_file, inputs=[args.source], what="run record")


def _save_record(loader: Any, path: str) -> None:
    """Write the run record; an existing record (the run this one resumed) is extended, then
    replaced."""
    from datamill.core.io import atomic_write

    previous = json.loads(Path(path).read_text(encoding="utf-8")) if Path(path).exists() else None
    record = loader.run_record(previous=previous)
    with atomic_write(path, "w") as f:
        json.dump(record, f, indent=2, sort_keys=True)
    print(f"run record -> {path}")


def _disk_bytes(path: str) -> int:
    from pathlib import Path

    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def _plan_cmd(args: argparse.Namespace) -> int:
    import numpy as np

    from datamill.loader.order import default_window
    from datamill.loader.planner import plan_run

    source = _open(args)
    sizes = np.asarray(source.shard_sizes(), dtype=np.int64)
    total_rows = max(1, int(sizes.sum()))
    nbytes = getattr(source, "shard_nbytes", None)
    shard_bytes = (
        np.asarray(nbytes(), dtype=np.int64)
        if callable(nbytes)
        else (sizes * (_disk_bytes(args.source) / total_rows)).astype(np.int64)
    )
    window = args.window or default_window(sizes, shard_bytes if callable(nbytes) else None)
    order: dict[str, Any] = {
        "batch_size": args.batch_size,
        "world_size": args.world_size,
        "seed": args.seed,
        "batching": Batching(window=window, shuffle=not args.no_shuffle, drop_last=args.drop_last),
    }
    probe = plan_run(sizes, **order, workers=Workers(prefetch=args.prefetch))
    first = probe.ranks[0]["reads"][0] if probe.ranks and probe.ranks[0]["reads"] else None
    speed = args.read_speed * 2**20 if args.read_speed else None
    if speed is None and first is not None:  # measure: read the first shard rank 0 needs
        t0 = time.perf_counter()
        source.read_shard(int(first))
        speed = max(1.0, float(shard_bytes[first])) / max(1e-6, time.perf_counter() - t0)
    plan = plan_run(
        sizes,
        **order,
        workers=Workers(threads=args.num_workers, prefetch=args.prefetch),
        epochs=args.epochs,
        shard_bytes=shard_bytes,
        cache_limit=cache_bytes(args.cache_limit),
        ranks_per_node=args.ranks_per_node,
        read_bytes_per_s=speed or 200e6,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "settings": plan.settings,
                    "ranks": plan.ranks,
                    "epochs": plan.epochs,
                    "read_bytes_per_s": speed,
                },
                indent=2,
                sort_keys=True,
            )
        )
        return 0
    print(
        f"{type(source).__name__} {args.source}: read speed {(speed or 0) / 2**20:,.1f} MiB/s "
        f"({'given' if args.read_speed else 'measured on one shard'})"
    )
    print(plan.as_text(show=args.show))
    return 0


def _is_state_file(path: Path) -> bool:
    from datamill.core.constants import LOADER_STATE_FORMAT

    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and state.get("format") == LOADER_STATE_FORMAT


def _resume(loader: Any, path: str) -> None:
    """Load a state written by ``--save-state``; every problem names the file."""
    from datamill.core.errors import DataFileNotFoundError, DatamillError, ResumeStateError

    hint = "pass a state JSON written by `datamill iterate --save-state` for this source"
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError as exc:
        raise DataFileNotFoundError("no such resume-state file", path=path, hint=hint) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ResumeStateError(
            f"cannot read the resume-state file ({exc.__class__.__name__})", path=path, hint=hint
        ) from exc
    except ValueError as exc:
        raise ResumeStateError(
            f"not valid JSON (truncated or edited?): {exc}", path=path, hint=hint
        ) from exc
    if not isinstance(state, dict):
        raise ResumeStateError(
            f"expected a JSON object, got {type(state).__name__}", path=path, hint=hint
        )
    try:
        loader.load_state_dict(state)
    except DatamillError as exc:
        if exc.path is not None:
            raise
        raise ResumeStateError(exc.msg, path=path, hint=exc.hint or hint) from exc
    except (
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
        IndexError,
    ) as exc:  # an edited state's field
        raise ResumeStateError(
            f"the state is malformed ({exc.__class__.__name__}: {exc})", path=path, hint=hint
        ) from exc


def _describe_cmd(args: argparse.Namespace) -> int:
    from datamill.core.progress import progress
    from datamill.loader.describe import check_column, column_values, details, summary
    from datamill.loader.sources import open_source

    src = open_source(args.source)  # opened once: describe()'s two parts and the columns read it
    for column in args.column or []:  # every name checked before anything is read
        check_column(src, column)
    d = summary(src, path=args.source) | details(src, path=args.source, check=not args.no_check)
    for column in args.column or []:
        with progress(desc=column, total=src.num_shards, unit="shard") as bar:
            values = column_values(src, column, on_shard=lambda k: bar.update(1))
        d.setdefault("values", {})[column] = values
    if args.rows is not None:
        from datamill.loader.samples import sample_page

        offset, _, limit = args.rows.rpartition(":")
        d["samples"] = sample_page(
            src, path=args.source, offset=_int(offset or "0"), limit=_int(limit)
        )
    print(json.dumps(d, indent=2, default=str) if args.json else _description_text(d))
    return 0


def _int(text: str) -> int:
    from datamill.core.errors import ConfigError

    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--rows expects [OFFSET:]LIMIT (whole numbers), got {text!r}") from None


def _description_text(d: dict[str, Any]) -> str:
    """:func:`datamill.loader.describe.describe`'s answer as lines for a terminal."""
    size = "" if d["bytes"] is None else f", {d['bytes']:,} bytes"
    lines = [
        f"{d['kind']}: {d['num_samples']:,} samples in {d['num_shards']} shards{size}",
        f"columns: {', '.join(d['columns'])}",
    ]
    for s in d.get("describe", {}).get("shardsets", []):
        lines.append(
            f"shardset {s['name']} [{s['format']}]: {s['rows']:,} rows, {s['missing']:,}"
            f" missing, {s['num_shards']} shards"
        )
    lines.extend(_footer_lines(d.get("footer") or {}))
    if "footer_error" in d:
        lines.append(f"footer statistics unreadable: {d['footer_error']}")
    if "check" in d:
        lines.append(f"check: {len(d['check'])} violations" if d["check"] else "check: OK")
        lines.extend(f"  {v['message']}" for v in d["check"])
    if "meta" in d:
        feats = [f"{k} ({v.get('type')})" for k, v in d["meta"].items() if k != "datamill"]
        lines.append(f"preprocessed features: {', '.join(feats)}")
    for column, v in d.get("values", {}).items():
        lines.extend(_values_lines(column, v))
    if "samples" in d:
        lines.extend(_sample_lines(d["samples"]))
    return "\n".join(lines)


def _sample_lines(page: dict[str, Any]) -> list[str]:
    """A page of :func:`~datamill.loader.samples.sample_page`, a line a row: each cell's text."""
    first = page["offset"]
    lines = [f"rows {first:,} to {first + len(page['rows']):,} of {page['total']:,}:"]
    for r in page["rows"]:
        cells = " ".join(f"{k}={_cell_text(c)}" for k, c in zip(page["columns"], r["cells"]))
        uid = "" if r["uid"] is None else f" uid {r['uid']!r}"
        lines.append(f"  row {r['row']}{uid}  {cells}")
    return lines


def _cell_text(cell: dict[str, Any]) -> str:
    if cell["t"] in ("missing", "image"):
        return "missing" if cell["t"] == "missing" else f"<{cell['mime']}>"
    return str(cell["text" if cell["t"] == "tokens" else "head" if cell["t"] == "list" else "v"])


def _footer_lines(footer: dict[str, dict[str, Any]]) -> list[str]:
    """The Parquet footers' null counts and ranges, a line a column."""
    if not footer:
        return []
    width = max(6, *map(len, footer))
    lines = [f"{'column':<{width}}  {'nulls':>9}  min .. max (Parquet footers)"]
    for c, f in footer.items():
        nulls = f"{f['nulls']:,}" + ("" if f["exact"] else "?")
        lines.append(f"{c:<{width}}  {nulls:>9}  {f['min_text']} .. {f['max_text']}")
    return lines


def _values_lines(column: str, v: dict[str, Any]) -> list[str]:
    """A column's counts, most common values and histogram."""
    lines = [f"{column}: {v['count']:,} values, {v['nulls']:,} missing"]
    if v["top"]:
        lines.append("  top: " + ", ".join(f"{t['value']!r} ({t['count']:,})" for t in v["top"]))
    if v["histogram"]:
        h = v["histogram"]
        lines.append(
            f"  {v['of']} from {h['edges'][0]:g} to {h['edges'][-1]:g} in "
            f"{len(h['counts'])} bins: {' '.join(map(str, h['counts']))}"
        )
    return lines


# long (105 lines): argparse declarations, one add_argument call per option
def register(sub: Any) -> None:
    """Add ``datamill iterate``, ``datamill plan`` and ``datamill describe``."""
    p = sub.add_parser(
        "iterate", help="iterate a datamill output with the loader; print throughput and stats"
    )
    p.add_argument(
        "source",
        help="shardset dataset folder, corpus folder, .hdf5 file, Parquet file or folder, "
        "or s3://bucket/prefix of Parquet files; with --url: a served dataset's id or name",
    )
    add_served(
        p, url_help="iterate a dataset served by `datamill serve` at this URL (RemoteLoader)"
    )
    add_cache(p)
    add_batch_size(p)
    add_epochs(p)
    add_order(p, drop_last=True)
    add_columns(p)
    p.add_argument(
        "--split", help="read one split of a preprocessed .hdf5: train, validation or test"
    )
    add_ranks(p)
    add_threads(p)
    p.add_argument(
        "--limit", type=LIMIT.arg, default=0, help="stop each epoch after this many batches"
    )
    p.add_argument("--resume", help="resume from a state JSON written by --save-state")
    p.add_argument("--save-state", help="write the loader state JSON here at the end")
    p.add_argument(
        "--save-record",
        help="write the run record for `datamill trace` here at the end (an existing "
        "record of the run this one resumes is extended)",
    )
    p.set_defaults(func=_cmd)

    q = sub.add_parser(
        "plan",
        help="plan a loader run without reading data: shard reads per rank, peak memory, "
        "bytes fetched through a cache, time to first batch, shuffle quality",
    )
    q.add_argument(
        "source",
        help="shardset dataset folder, corpus folder, .hdf5 file, Parquet file or folder, "
        "or s3://bucket/prefix of Parquet files",
    )
    add_cache(q)
    add_batch_size(q)
    add_ranks(q, rank=False)
    q.add_argument(
        "--ranks-per-node",
        type=RANKS_PER_NODE.arg,
        default=None,
        help="ranks sharing one shard cache (default all)",
    )
    add_threads(q)
    q.add_argument(
        "--prefetch", type=PREFETCH.arg, default=2, help="shards loaded ahead (default 2)"
    )
    q.add_argument(
        "--window",
        type=WINDOW.arg,
        default=None,
        help="shards per shuffle window (default: the loader's)",
    )
    add_epochs(q, what="plan")
    add_order(q, drop_last=True)
    q.add_argument(
        "--read-speed",
        type=READ_SPEED_MIB.arg,
        default=None,
        help="MiB/s (default: measured by reading one shard)",
    )
    q.add_argument(
        "--show", type=SHOW.arg, default=12, help="shard reads listed per rank (default 12)"
    )
    q.add_argument("--json", action="store_true", help="print the whole plan as JSON")
    q.set_defaults(func=_plan_cmd)

    d = sub.add_parser(
        "describe",
        help="what a dataset holds: kind, counts, columns, null counts and min/max from Parquet "
        "footers, a shardset dataset's check, a preprocessed dataset's features",
    )
    d.add_argument(
        "source",
        help="shardset dataset folder, corpus folder, .hdf5 file, Parquet "
        "file or folder, or s3://bucket/prefix",
    )
    d.add_argument(
        "--column",
        action="append",
        metavar="COLUMN",
        help="also read this column: its most common values and a histogram (repeatable)",
    )
    d.add_argument(
        "--rows",
        metavar="[OFFSET:]LIMIT",
        help="also print LIMIT rows from OFFSET (default 0) as the web UI's samples page shows "
        "them: token ids decoded, floats rounded, long lists cut (at most 200)",
    )
    d.add_argument("--json", action="store_true", help="print everything as JSON")
    d.add_argument(
        "--no-check",
        action="store_true",
        help="skip a shardset dataset's check (it reads every shard's UIDs)",
    )
    d.set_defaults(func=_describe_cmd)
