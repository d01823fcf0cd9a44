"""Hypothesis strategies for ``datamill`` command lines, built from the real argparse parsers.

:func:`leaf_commands` walks :func:`datamill.cli.build_parser` down through every sub-parser; for
each leaf command :func:`command_lines` draws, per argparse action, whether to pass it, which of its
option strings to use and its values. A value comes either from a *seed* (a working command line for
that command, parsed by the same parser: so the fuzzer reaches past the first check) or from the
hostile menus of :mod:`tests.fuzz.workspace`, chosen by what the action declares:
``type=int``/``float`` and :class:`~datamill.core.checks.Limit` types get numbers, ``choices`` get
their choices plus junk, everything else gets paths and strings. No flag is listed here by hand.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from hypothesis import strategies as st

from tests.fuzz.workspace import NUMBERS, STRINGS, Workspace

__all__ = ["EXCLUDED", "command_lines", "leaf_commands", "seeds"]

EXCLUDED: dict[tuple[str, ...], str] = {}
"""Leaf commands not fuzzed, with the reason. ``datamill serve ROOT`` (the server itself) is not a
leaf of the walk: it would block; it is fuzzed in child processes by tests/fuzz/test_serve_fuzz.py,
its sub-commands (keys, audit, backup, gc, iterate) here."""

WAITS = {"reconnect_timeout": "0"}
"""Options that ask the command to wait (seconds): always this value, or a run would take as long as
asked."""

NEVER_CHOSEN = {
    "ray": "starts or joins a Ray cluster (covered by tests/test_bad_inputs.py, marked ray)"
}
"""Choices the in-process fuzzer never passes (their value is replaced by a hostile string)."""


HOSTILITY = (5, 10, 20, 40, 70)
"""How hostile one command line is (percent of its values from the menus): most lines hold one or
two bad values among good ones, so each check is reached with the others passing."""


def leaf_commands(
    parser: argparse.ArgumentParser | None = None, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``(("shards", "create"), parser)`` for every leaf command, in --help order (aliases once)."""
    if parser is None:
        from datamill.cli import build_parser

        parser = build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        if prefix:
            yield prefix, parser
        return
    seen: set[int] = set()
    for action in subs:
        for (
            name,
            sub,
        ) in action._name_parser_map.items():  # (choices may be None: serve takes any first word)
            if id(sub) in seen:
                continue
            seen.add(id(sub))
            yield from leaf_commands(sub, (*prefix, name))


def seeds(ws: Workspace) -> dict[tuple[str, ...], list[list[str]]]:
    """Working command lines per leaf command (values only matter: flags are re-drawn from the
    parser)."""
    p = ws.p
    return {
        ("demo",): [
            ["--data", p("fakedata"), "--work-dir", p("fresh_dir"), "--only", "nothing-matches"]
        ],
        ("preprocess",): [
            [p("inputs/table.csv"), "-c", p("inputs/table.yaml"), "-o", p("fresh_dir")],
            [p("inputs/images.csv"), "-c", p("inputs/images.yaml"), "-o", p("fresh_dir")],
            [p("inputs/images_bomb.csv"), "-c", p("inputs/images.yaml"), "--skip-save"],
            [
                p("inputs/table.parquet"),
                "-m",
                p("outputs/prep/table.meta.json"),
                "-o",
                p("fresh_dir"),
            ],
        ],
        ("corpus",): [
            [
                p("inputs/text.txt"),
                "--level",
                "word",
                "--out",
                p("fresh_dir"),
                "--min-freq",
                "1",
                "--max-size",
                "50",
                "--reserved-tokens",
                "<pad>",
                "--unk-token",
                "<unk>",
            ],
            [
                p("zip_member"),
                "--level",
                "bpe",
                "--vocab-size",
                "120",
                "--out",
                p("fresh_dir"),
                "--tokenizer",
                p("inputs/tokenizer.json"),
            ],
        ],
        ("word2vec",): [
            [
                p("zip_member"),
                "--out",
                p("fresh_dir"),
                "--window",
                "2",
                "--num-negatives",
                "2",
                "--min-freq",
                "1",
                "--subsample-t",
                "0.001",
                "--seed",
                "1",
            ]
        ],
        ("bert",): [
            [
                p("inputs/raw.txt"),
                "--out",
                p("fresh_file"),
                "--vocab-size",
                "200",
                "--max-seq-length",
                "24",
                "--dupe-factor",
                "1",
                "--mask-prob",
                "0.2",
                "--max-predictions-per-seq",
                "3",
                "--short-seq-prob",
                "0.1",
                "--seed",
                "1",
                "--workers",
                "1",
            ],
            [
                p("inputs/raw.txt"),
                "--out",
                p("fresh_file"),
                "--tokenizer",
                p("inputs/tokenizer.json"),
                "--max-seq-length",
                "16",
                "--dupe-factor",
                "1",
                "--workers",
                "1",
            ],
        ],
        ("shards", "create"): [
            [
                p("fresh_dir"),
                "--uid",
                "Id",
                "--shardset",
                "main",
                p("inputs/table.csv"),
                "--shard-size",
                "10",
            ],
            [
                p("fresh_dir"),
                "--uid",
                "Id",
                "--shardset",
                "main",
                p("inputs/table.parquet"),
                "--add-uid",
            ],
        ],
        ("shards", "add"): [
            [p("outputs/ds"), "--shardset", "extra", p("inputs/table.parquet"), "--route"]
        ],
        ("shards", "check"): [[p("outputs/ds")]],
        ("shards", "info"): [[p("outputs/ds"), "--json"]],
        ("describe",): [
            [p("outputs/ds"), "--column", "LotArea", "--column", "Id", "--json"],
            [p("outputs/prep/table.hdf5"), "--no-check"],
        ],
        ("shards", "get"): [[p("outputs/ds"), "3", "--columns", "Id,LotArea"]],
        ("shards", "export"): [
            [p("outputs/ds"), p("fresh_file"), "--columns", "Id", "--join", "inner"]
        ],
        ("iterate",): [
            [
                p("outputs/ds"),
                "--batch-size",
                "4",
                "--epochs",
                "1",
                "--limit",
                "3",
                "--seed",
                "1",
                "--columns",
                "Id",
                "--rank",
                "0",
                "--world-size",
                "1",
                "--num-workers",
                "1",
                "--resume",
                p("outputs/state.json"),
                "--save-state",
                p("fresh_file"),
            ],
            [p("outputs/prep/table.hdf5"), "--split", "train", "--batch-size", "3"],
            [p("outputs/corpus"), "--batch-size", "5", "--limit", "2"],
        ],
        ("serve", "keys", "create"): [
            [
                "--state",
                p("fresh_dir"),
                "--role",
                "admin",
                "--datasets",
                "a,b",
                "--expires",
                "12h",
                "--note",
                "n",
            ],
            ["--state", p("outputs/serve")],
        ],
        ("serve", "keys", "list"): [["--state", p("outputs/serve")]],
        ("serve", "keys", "revoke"): [["0123456789ab", "--state", p("outputs/serve")]],
        ("serve", "audit"): [["--state", p("outputs/serve")]],
        ("serve", "gc"): [["--state", p("outputs/serve"), "--older-than", "30d"]],
        ("serve", "backup"): [["--state", p("outputs/serve"), p("fresh_file")]],
        ("serve", "iterate"): [
            [
                "ds",
                "--url",
                "http://127.0.0.1:1",
                "--key",
                "dmk_x.y",
                "--batch-size",
                "4",
                "--seed",
                "1",
                "--epoch",
                "0",
                "--columns",
                "Id",
                "--rank",
                "0",
                "--world-size",
                "1",
                "--mode",
                "static",
                "--name",
                "n",
                "--limit",
                "2",
                "--save-state",
                p("fresh_file"),
                "--reconnect-timeout",
                "0",
            ]
        ],
        ("trace",): [
            [
                p("outputs/record.json"),
                "--uid",
                "3",
                "--sample",
                "2",
                "--step",
                "1",
                "--rank",
                "0",
                "--epoch",
                "0",
                "--source",
                p("outputs/ds"),
                "--show",
                "--columns",
                "Id",
                "--width",
                "20",
            ]
        ],
        ("diff",): [
            [
                p("outputs/prep/table.hdf5"),
                p("outputs/prep/table.hdf5"),
                "--json",
                "--mean-shift",
                "0.1",
                "--quantile-shift",
                "0.1",
                "--tvd",
                "0.1",
                "--all-stats",
                "--no-cache",
            ],
            [p("outputs/ds"), p("outputs/ds")],
        ],
        ("check-splits",): [
            [
                p("outputs/prep/table.hdf5"),
                "--columns",
                "LotArea",
                "--split-column",
                "split",
                "--threshold",
                "0.8",
                "--num-perm",
                "64",
                "--shingle",
                "3",
                "--seed",
                "1",
                "--json",
            ],
            [p("outputs/ds"), "--fail"],
        ],
        ("tokenize",): [
            [
                p("inputs/raw.txt"),
                "--train-vocab",
                "300",
                "--out",
                p("fresh_dir"),
                "--workers",
                "1",
                "--eos",
                "</s>",
            ],
        ],
        ("plan",): [
            [
                p("outputs/ds"),
                "--batch-size",
                "4",
                "--world-size",
                "2",
                "--ranks-per-node",
                "1",
                "--num-workers",
                "1",
                "--prefetch",
                "1",
                "--window",
                "2",
                "--cache-limit",
                "1",
                "--epochs",
                "2",
                "--seed",
                "3",
                "--read-speed",
                "100",
                "--show",
                "2",
            ],
            [p("outputs/prep/table.hdf5"), "--batch-size", "3", "--read-speed", "50", "--json"],
        ],
    }


def _numeric(action: argparse.Action) -> bool:
    """The option's ``type`` turns "1" (or "1.5") into a number: int, float, a Limit, serve's
    count()..."""
    t = action.type
    if t is None or t is str or not callable(t):
        return False
    for text in ("1", "1.5"):
        try:
            value = t(text)
        except Exception:  # noqa: BLE001, S112 - any refusal: try the next spelling
            continue
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return False


def _seed_values(parser: argparse.ArgumentParser, lines: list[list[str]]) -> dict[str, list[str]]:
    """dest -> the values the seed command lines give it (as strings)."""
    out: dict[str, list[str]] = {}
    for line in lines:
        tokens = iter(line)
        # map option string -> action, then read values by nargs (seeds are simple: no clustering)
        by_flag = {s: a for a in parser._actions for s in a.option_strings}
        positionals = [a for a in parser._actions if not a.option_strings]
        pos_values: list[str] = []
        for tok in tokens:
            action = by_flag.get(tok)
            if action is None:
                pos_values.append(tok)
                continue
            if action.nargs == 0:
                continue
            out.setdefault(action.dest, []).append(next(tokens))
        for action, value in zip(positionals, pos_values, strict=False):
            out.setdefault(action.dest, []).append(value)
        if len(pos_values) > len(positionals) and positionals:  # nargs="+" takes the rest
            out.setdefault(positionals[-1].dest, []).extend(pos_values[len(positionals) :])
    return out


def _value(
    action: argparse.Action, good: list[str], paths: list[str], hostility: int
) -> st.SearchStrategy[str]:
    if action.choices is not None:
        choices = [str(c) for c in action.choices if str(c) not in NEVER_CHOSEN]
        hostile: st.SearchStrategy[str] = st.sampled_from(choices + STRINGS[:4] + ["not-a-choice"])
    elif _numeric(action):
        hostile = st.sampled_from(NUMBERS)
    else:
        hostile = st.sampled_from(paths)
    if not good:
        return hostile
    return st.integers(0, 99).flatmap(
        lambda k: st.sampled_from(good) if k >= hostility else hostile
    )


def _nargs_count(action: argparse.Action) -> st.SearchStrategy[int]:
    n = action.nargs
    if n is None:
        return st.just(1)
    if isinstance(n, int):
        return st.just(n)
    return {"?": st.integers(0, 1), "*": st.integers(0, 2), "+": st.integers(1, 3)}.get(
        str(n), st.integers(0, 2)
    )


@st.composite
def command_lines(
    draw: st.DrawFn,
    path: tuple[str, ...],
    parser: argparse.ArgumentParser,
    ws: Workspace,
    seed_lines: list[list[str]],
) -> list[str]:
    """One command line for the leaf command ``path``."""
    good = _seed_values(parser, seed_lines)
    paths = ws.path_menu()
    hostility = draw(st.sampled_from(HOSTILITY))  # percent of values drawn from the hostile menus
    optionals: list[list[str]] = []
    positionals: list[str] = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        values = good.get(action.dest, [])
        value = (
            st.just(WAITS[action.dest])
            if action.dest in WAITS
            else _value(action, values, paths, hostility)
        )
        if not action.option_strings:
            for _ in range(draw(_nargs_count(action))):
                positionals.append(draw(value))
            continue
        in_seed = action.dest in good or (
            action.nargs == 0
            and any(s in line for line in seed_lines for s in action.option_strings)
        )
        if not draw(
            st.integers(0, 9).map(
                lambda k, s=in_seed, r=action.required: k < (6 if s else 3) or (r and k < 9)
            )
        ):
            continue
        flag = draw(st.sampled_from(list(action.option_strings)))
        if action.nargs == 0:
            optionals.append([flag])
            continue
        count = draw(_nargs_count(action))
        if draw(st.integers(0, 19)) == 0 and count == 1:  # --flag=value spelling
            optionals.append(
                [f"{flag}={draw(value)}"] if flag.startswith("--") else [flag, draw(value)]
            )
        else:
            optionals.append([flag, *[draw(value) for _ in range(count)]])
    order = draw(st.permutations(optionals)) if len(optionals) > 1 else optionals
    argv = [*path]
    where = draw(st.sampled_from(["end", "start"]))
    tail = [tok for group in order for tok in group]
    argv += (positionals + tail) if where == "start" else (tail + positionals)
    extra = draw(st.integers(0, 29))
    if extra == 0:
        argv.append("--no-such-flag")
    elif extra == 1:
        argv.insert(draw(st.integers(0, len(argv))), "-q")
    elif extra == 2:
        argv.append("--help")
    return argv


def argv_repr(argv: list[str]) -> str:
    """The command as a shell would take it (long values shortened)."""
    import shlex

    return "datamill " + " ".join(
        shlex.quote(a if len(a) < 200 else a[:20] + f"...<{len(a)} chars>") for a in argv
    )
