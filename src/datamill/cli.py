"""``datamill <command>``: thin argument parsing over the public API.

Each capability registers its own subcommands from its own ``cli`` module (see ``COMMAND_MODULES``),
so the parsers live beside the code they call. Every :class:`DatamillError` is printed as one line
on stderr (``error: file, line, column: what was expected``) with exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Sequence

from datamill import __version__
from datamill.core.errors import DatamillError

__all__ = ["COMMAND_MODULES", "build_parser", "main"]

# module -> it defines ``register(subparsers)``; order is the order shown by --help
COMMAND_MODULES = (
    "datamill.demo",
    "datamill.preprocessing.cli",
    "datamill.text.cli",
    "datamill.pretrain.word2vec_cli",
    "datamill.pretrain.bert_cli",
    "datamill.shards.cli",
    "datamill.loader.cli",
    "datamill.serve.cli",
)


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every available capability's subcommands."""
    parser = argparse.ArgumentParser(
        prog="datamill",
        description="Turn raw datasets into training-ready tensors.",
    )
    parser.add_argument("--version", action="version", version=f"datamill {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name.startswith(exc.name):
                continue  # capability not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    from datamill.core.progress import set_quiet

    set_quiet(bool(args.quiet))
    start = time.perf_counter()
    try:
        status = args.func(args)
    except DatamillError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    if getattr(args, "timing", False):
        print(f"done in {time.perf_counter() - start:.2f} s")
    return int(status or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
