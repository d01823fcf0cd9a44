"""``datamill trace RECORD``: which steps read a sample, and which samples a step read (from a run
record)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
from typing import TYPE_CHECKING, Any

from datamill.core.cliargs import add_columns, add_seed, columns_of

if TYPE_CHECKING:
    from datamill.lineage.join import RunTracer
    from datamill.lineage.trace import Tracer

__all__ = ["register"]


def _filter(spec: str) -> Any:
    """``module:function`` -> the function (the run's filter, to mark rejected samples)."""
    from datamill.core.errors import ConfigError

    mod, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            f"--filter {spec!r}: cannot import it ({type(exc).__name__}: {exc})",
            hint="give the run's filter as module:function, importable from here",
        ) from exc
    return fn


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= width else text[: width - 3] + "..."


def _trace_cmd(args: argparse.Namespace) -> int:
    from datamill.core.errors import ConfigError
    from datamill.lineage.fetch import fetch_records
    from datamill.lineage.trace import Tracer, load_record

    record_args: list[Any] = []
    for r in args.record:
        if str(r).startswith(("http://", "https://")):
            record_args += fetch_records(
                str(r), key=args.key if args.key is not None else os.environ.get("DATAMILL_KEY")
            )
        else:
            record_args.append(r)
    record_arg = record_args[0]
    source = None
    if args.source:
        from datamill.sources import open_source

        source = open_source(args.source)
    from datamill.loader.lm_trace import is_lm_record, trace_command

    if is_lm_record(record_arg):  # a language-model run: its packed sequences, by step
        return trace_command(args, source, _filter(args.filter) if args.filter else None)
    record = load_record(record_arg)
    _check_trace_args(args, record, source)
    from datamill.lineage.join import RunTracer

    tracer: Tracer | RunTracer
    if len(record_args) > 1:
        tracer = RunTracer(record_args, source=source)
    else:
        tracer = Tracer(record_arg, source=source)
    filt = _filter(args.filter) if args.filter else None
    if filt is not None and source is None:
        raise ConfigError(
            "--filter evaluates the filter on the rows and needs the dataset",
            hint="add --source PATH",
        )
    epochs = [args.epoch] if args.epoch is not None else None
    out: dict[str, Any] = {"hits": [], "batches": []}
    for uid, sample in _queries(args, record, tracer):
        out["hits"] += _trace_uid(args, tracer, filt, uid, sample, epochs)
    if args.step is not None:
        out["batches"].append(_trace_step(args, tracer, filt))
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True, default=str))
    return 0


def _trace_uid(
    args: argparse.Namespace,
    tracer: Tracer | RunTracer,
    filt: Any,
    uid: Any,
    sample: int,
    epochs: list[int] | None,
) -> list[dict[str, Any]]:
    """Every batch that held ``sample`` (printed unless --json), with the filter's verdict."""
    hits = tracer.find([sample], epochs=epochs, uids=[uid])
    if filt is not None:
        hits = [
            type(h)(
                **{
                    **h.as_dict(),
                    "rejected": tracer.rejected(
                        tracer.batch(rank=h.rank, step=h.step, epoch=h.epoch), filt
                    )[h.position],
                }
            )
            for h in hits
        ]
    if not args.json:
        print(
            f"uid {uid!r} (sample {sample}): {len(hits)} "
            f"batch{'es' if len(hits) != 1 else ''} in epochs "
            f"{tracer.epochs().start}..{tracer.epochs().stop - 1}"
            if epochs is None
            else f"uid {uid!r} (sample {sample}): {len(hits)} "
            f"batch{'es' if len(hits) != 1 else ''} in epoch {args.epoch}"
        )
        if hits:
            print(
                f"{'epoch':>6} {'rank':>5} {'step':>7} {'global':>8} {'batch':>7} "
                f"{'position':>8}" + ("  filter" if filt is not None else "")
            )
        for h in hits:
            print(
                f"{h.epoch:>6} {h.rank:>5} {h.step:>7} {h.global_step:>8} {h.batch:>7} "
                f"{h.position:>8}"
                + (f"  {'rejected' if h.rejected else 'passed'}" if filt is not None else "")
                + (f"  client {h.client}" if h.client is not None else "")
                + (f"  iteration {h.iteration}" if h.iteration is not None else "")
            )
    return [h.as_dict() for h in hits]


def _check_trace_args(args: argparse.Namespace, record: dict[str, Any], source: Any) -> None:
    """The option combinations `datamill trace` refuses, each with what to give instead."""
    from datamill.core.errors import ConfigError

    if not args.uid and args.sample is None and args.step is None:
        raise ConfigError(
            "nothing to trace", hint="give --uid X, --sample N, or --step S --rank R [--epoch E]"
        )
    served = record.get("served") or {}
    if args.step is not None and args.rank is None and args.client is None:
        raise ConfigError(
            "--step needs --rank (or --client for a served dynamic iteration)",
            hint="name the rank whose batch you want: --rank R",
        )
    if args.client is not None and served.get("mode") != "dynamic":
        raise ConfigError(
            "--client is for a served dynamic iteration's record", hint="give --rank R instead"
        )
    if args.show and source is None:
        raise ConfigError(
            "--show reads the rows and needs the dataset",
            hint="add --source PATH (what the run read)",
        )


def _queries(
    args: argparse.Namespace, record: dict[str, Any], tracer: Tracer | RunTracer
) -> list[tuple[Any, int]]:
    """``(uid, sample)`` of each --uid and --sample, checked against the dataset."""
    from datamill.core.errors import ConfigError

    queries: list[tuple[Any, int]] = []
    if args.uid:
        from datamill.core.source import uid_from_text

        values = None if record.get("uid_column") is None else tracer.uid_values()
        parsed = [uid_from_text(u, None if values is None else values.type) for u in args.uid]
        unknown: list[Any] = [u for u, p in zip(args.uid, parsed) if p is None]  # not an integer
        uids = [p for p in parsed if p is not None]
        samples = tracer.samples_of(uids)
        unknown += [u for u, s in zip(uids, samples) if s < 0]
        if unknown:
            raise ConfigError(
                f"UID(s) {unknown[:5]} are not in the dataset", hint="check the UID and --source"
            )
        queries += list(zip(uids, samples.tolist()))
    if args.sample is not None:
        if not 0 <= args.sample < tracer.n:
            raise ConfigError(f"--sample {args.sample} is outside the dataset's [0, {tracer.n})")
        queries.append((tracer.uids_of([args.sample])[0], args.sample))  # type: ignore[arg-type]  # a list is fine
    return queries


def _trace_step(args: argparse.Namespace, tracer: Tracer | RunTracer, filt: Any) -> dict[str, Any]:
    """The batch of --step (and --rank/--client/--epoch): printed unless --json; its dict."""
    from datamill.lineage.trace import BatchTrace

    b: BatchTrace = tracer.batch(
        rank=args.rank, step=args.step, epoch=args.epoch, client=args.client
    )
    rejected = tracer.rejected(b, filt) if filt is not None else None
    b = BatchTrace(**{**b.as_dict(), "rejected": rejected})
    cols = columns_of(args.columns)
    row_dicts = tracer.rows(b.samples, columns=cols).to_pylist() if args.show else None
    d = b.as_dict()
    if row_dicts is not None:
        d["rows"] = row_dicts
    if not args.json:
        if b.iteration is not None:
            print(f"iteration {b.iteration}:")
        if b.client is not None:
            print(f"client {b.client}:")
        print(
            f"epoch {b.epoch}, rank {b.rank}, step {b.step} (global step {b.global_step}; "
            f"segment {b.segment}, "
            f"batch {b.batch}): {len(b.samples)} samples"
            + (
                f", {sum(rejected)} rejected by the filter (would have been in the batch)"
                if rejected
                else ""
            )
        )
        for i, (s, u) in enumerate(zip(b.samples, b.uids)):
            flag = "  rejected" if rejected and rejected[i] else ""
            line = f"{i:>5}  sample {s:>10}  uid {u!r}{flag}"
            if row_dicts is not None:
                line += "  " + " ".join(
                    f"{k}={_short(v, args.width)}" for k, v in row_dicts[i].items()
                )
            print(line)
    return d


def register(sub: Any) -> None:
    """Add ``datamill trace``, ``datamill diff`` and ``datamill check-splits``."""
    from datamill.core.commands import register_handler
    from datamill.lineage.splits import report_splits

    register_trace(sub)
    register_diff(sub)
    register_check_splits(sub)
    register_handler("report-splits", report_splits)  # `datamill preprocess --check-splits`


def register_trace(sub: Any) -> None:
    """Add ``datamill trace``."""
    p = sub.add_parser(
        "trace",
        help="which epochs, ranks and steps read a sample; which samples a step read "
        "(from a run record, no per-sample log)",
        description="Answer lineage questions from a run record (Loader.run_record() or "
        "`datamill iterate --save-record`). The per-epoch order index is built on "
        "first use and kept beside the record (RECORD.index/).",
    )
    p.add_argument(
        "record",
        nargs="+",
        help="the run record JSON, or a server's URL .../api/v1/iterations/ID/trace (one "
        "iteration) or .../api/v1/runs/NAME/trace (every iteration of a named run); several "
        "records of one run (e.g. one served iteration per epoch) are traced together",
    )
    p.add_argument("--key", help="API key for a URL record (default $DATAMILL_KEY)")
    p.add_argument(
        "--client",
        help="with --step: the client of a served dynamic iteration (its k-th "
        "acknowledged batch is its step k)",
    )
    p.add_argument(
        "--uid",
        action="append",
        default=[],
        help="a sample's UID (its `uid` column value, else its sample number); repeatable",
    )
    p.add_argument("--sample", type=int, help="a sample number (row of the dataset in shard order)")
    p.add_argument(
        "--step", type=int, help="a step: of --epoch, or counted from the record's first epoch"
    )
    p.add_argument("--rank", type=int, help="with --step: the rank whose batch to list")
    p.add_argument(
        "--epoch", type=int, help="the epoch of --step; with --uid: search only this epoch"
    )
    p.add_argument(
        "--source", help="the dataset the run read (for UIDs in a column, --show, length buckets)"
    )
    p.add_argument(
        "--show", action="store_true", help="with --step: print the rows too (needs --source)"
    )
    add_columns(
        p, help="with --show: comma-separated columns to print (default: those the run read)"
    )
    p.add_argument(
        "--filter", help="the run's filter as module:function: mark the samples it rejected"
    )
    p.add_argument(
        "--width", type=int, default=40, help="with --show: characters per value (default 40)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_trace_cmd)


def _diff_cmd(args: argparse.Namespace) -> int:
    from datamill.lineage.diff import Thresholds, diff

    report = diff(
        args.a,
        args.b,
        thresholds=Thresholds(
            mean_shift=args.mean_shift, quantile_shift=args.quantile_shift, tvd=args.tvd
        ),
        cache=not args.no_cache,
    )
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, sort_keys=True, default=str))
    else:
        print(report.as_text(all_stats=args.all_stats))
    return 1 if args.exit_code and report.changed else 0


def register_diff(sub: Any) -> None:
    """Add ``datamill diff``."""
    p = sub.add_parser(
        "diff",
        help="what changed between two builds of the same kind: samples, columns, "
        "vocabularies, statistics drift",
    )
    p.add_argument(
        "a", help="the old build (shardset dataset, .hdf5, BERT/word2vec output, Parquet)"
    )
    p.add_argument("b", help="the new build, of the same kind")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--mean-shift",
        type=float,
        default=0.1,
        help="a number column drifts when its mean moves by more than this many stds (default 0.1)",
    )
    p.add_argument(
        "--quantile-shift",
        type=float,
        default=0.1,
        help="... or its median by more than this share of the 5-95%% range (default 0.1)",
    )
    p.add_argument(
        "--tvd",
        type=float,
        default=0.05,
        help="a category column drifts when the total variation distance exceeds this (default "
        "0.05)",
    )
    p.add_argument(
        "--all-stats", action="store_true", help="list every compared column, not only drifted ones"
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="recompute the row hashes (default: cached per build)",
    )
    p.add_argument(
        "--exit-code", action="store_true", help="exit with status 1 when the builds differ"
    )
    p.set_defaults(func=_diff_cmd)


def _check_splits_cmd(args: argparse.Namespace) -> int:
    from pathlib import Path

    from datamill.core.constants import DATASET_MANIFEST

    cols = columns_of(args.columns)
    texts = args.text_columns.split(",") if args.text_columns is not None else None
    source = None
    if (Path(args.path) / DATASET_MANIFEST).exists():
        from datamill.sources import open_source

        source = open_source(args.path)
    if (
        source is not None and args.split_column not in source.columns
    ):  # no splits: duplicates across UIDs
        from datamill.lineage.splits import duplicate_uids

        found = duplicate_uids(source, columns=cols)
        if args.json:
            print(json.dumps(found, indent=2, sort_keys=True, default=str))
        else:
            print(
                f"{args.path}: {found['groups']:,} groups of UIDs with identical content "
                f"({found['rows']:,} samples)"
                + (f", e.g. {found['examples']}" if found["examples"] else "")
            )
        if args.fail and found["groups"]:
            from datamill.core.errors import DataFileError

            raise DataFileError(
                f"{found['groups']:,} groups of UIDs share their content", path=args.path
            )
        return 0
    from datamill.lineage.splits import report_splits

    report_splits(
        args.path,
        fail=args.fail,
        json_out=args.json,
        columns=cols,
        text_columns=texts,
        split_column=args.split_column,
        threshold=args.threshold,
        num_perm=args.num_perm,
        shingle=args.shingle,
        seed=args.seed,
    )
    return 0


def register_check_splits(sub: Any) -> None:
    """Add ``datamill check-splits``."""
    p = sub.add_parser(
        "check-splits",
        help="validation/test rows that equal (or nearly equal, for text) a "
        "training row; duplicate content across UIDs of a shardset dataset",
    )
    p.add_argument(
        "path", help="a preprocessed .hdf5 (with its meta.json), or a shardset dataset folder"
    )
    add_columns(p, help="comma-separated columns compared exactly (default: the input features)")
    p.add_argument(
        "--text-columns",
        help="comma-separated columns checked for near-duplicates (default: the text "
        "and sequence inputs)",
    )
    p.add_argument(
        "--split-column", default="split", help="the split column (0 train, 1 validation, 2 test)"
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=0.8,
        help="estimated Jaccard similarity of word shingles "
        "that counts as near-duplicate (default 0.8)",
    )
    p.add_argument(
        "--num-perm",
        type=int,
        default=64,
        help="MinHash values per row, a power of two (default 64)",
    )
    p.add_argument("--shingle", type=int, default=3, help="words per shingle (default 3)")
    add_seed(p, what="seeds the MinHash functions")
    p.add_argument(
        "--fail", action="store_true", help="exit with status 2 when leaks or duplicates are found"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_check_splits_cmd)
