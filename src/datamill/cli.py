"""``datamill <command>``: thin argument parsing over the public API.

Each capability registers its own subcommands from its own ``cli`` module (see ``COMMAND_MODULES``),
so the parsers live beside the code they call. Every :class:`DatamillError` is printed as one line
on stderr (``error: file, line, column: what was expected``) with exit status 2, never a traceback.
``-q``/``--quiet`` works before or after any subcommand: :func:`main` takes it out of the argument
list before parsing (up to a ``--`` separator), so no subcommand needs to declare it.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from datamill.core.constants import VERSION as __version__
from datamill.core.errors import DatamillError

__all__ = [
    "COMMAND_MODULES",
    "QUIET_FLAGS",
    "OneLineParser",
    "build_parser",
    "main",
    "run",
    "split_quiet",
]

QUIET_FLAGS = ("-q", "--quiet")
"""The spellings of the global quiet flag, accepted anywhere on the command line."""

# module -> it defines ``register(subparsers)``; order is the order shown by --help
COMMAND_MODULES = (
    "datamill.demo",
    "datamill.preprocessing.cli",
    "datamill.text.cli",
    "datamill.text.tok_cli",
    "datamill.pretrain.word2vec.cli",
    "datamill.pretrain.bert.cli",
    "datamill.shards.cli",
    "datamill.loader.cli",
    "datamill.lineage.cli",
    "datamill.serve.cli",
)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one ``error:`` line (exit 2), like every other
    error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every available capability's subcommands."""
    parser = OneLineParser(
        prog="datamill",
        description="Turn raw datasets into training-ready tensors.",
    )
    parser.add_argument("--version", action="version", version=f"datamill {__version__}")
    parser.add_argument(
        *QUIET_FLAGS, action="store_true", help="no progress bars (before or after the command)"
    )
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


def split_quiet(argv: Sequence[str]) -> tuple[list[str], bool]:
    """Remove ``-q``/``--quiet`` from anywhere before a ``--`` separator; return the rest and
    whether it was there.

    Examples:
        >>> split_quiet(["word2vec", "c.txt", "--quiet", "--out", "o"])
        (['word2vec', 'c.txt', '--out', 'o'], True)
        >>> split_quiet(["bert", "--", "-q"])
        (['bert', '--', '-q'], False)
    """
    rest: list[str] = []
    quiet = False
    for i, arg in enumerate(argv):
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg in QUIET_FLAGS:
            quiet = True
        else:
            rest.append(arg)
    return rest, quiet


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    parser = build_parser()
    argv, quiet = split_quiet(sys.argv[1:] if argv is None else argv)
    args = _parse(parser, argv)
    if args is None:
        return 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    from datamill.core.progress import set_quiet

    set_quiet(quiet or bool(getattr(args, "quiet", False)))
    start = time.perf_counter()
    previous = _on_sigterm()
    try:
        status = args.func(args)
        if getattr(args, "timing", False):
            print(f"done in {time.perf_counter() - start:.2f} s")
        sys.stdout.flush()
    except DatamillError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _closed_stdout()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print("terminated", file=sys.stderr)
        return 143
    except (
        OSError
    ) as exc:  # a full disk, an unwritable folder or an unusable path met outside the writers
        err = _located_os_error(exc)
        if err is None:
            raise
        print(f"error: {err.one_line()}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return int(status or 0)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | None:
    """The parsed arguments; None after a usage error (its one error line is printed)."""
    try:
        bad = next((a for a in argv if "\x00" in a), None)
        if bad is not None:  # only possible in-process (a process argument cannot hold NUL)
            parser.error(f"argument {bad[:40]!r} contains a NUL byte")
        return parser.parse_args(argv)
    except SystemExit as exc:  # a usage error is a status; --help still exits
        if exc.code == 2:
            return None
        raise


def _located_os_error(exc: OSError) -> DatamillError | None:
    """A full disk, an unwritable folder, an unusable path or an object store's failure met
    outside the writers, as a located error (None: not one of those)."""
    from datamill.core.io import as_output_error
    from datamill.core.output import as_path_error

    err: DatamillError | None = as_output_error(exc, exc.filename or "output") or as_path_error(exc)
    if err is None:  # an object store's failure not located further in
        from datamill.core.storage import recognised_error, storage_error

        scheme = recognised_error(exc)
        err = None if scheme is None else storage_error(exc, exc.filename or scheme.prefix)
    return err


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so the writers' cleanup runs (temporary files removed)."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated


def _on_sigterm() -> Any:
    """Turn SIGTERM into an exception while a command runs (main thread only); returns the old
    handler."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


def _closed_stdout() -> int:
    """stdout was closed by the reader (``datamill ... | head``): stop quietly, like a killed
    ``cat``."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
    except (OSError, ValueError):  # stdout is not a real file (in-process use)
        pass
    return 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader went away


def run() -> NoReturn:
    """The ``datamill`` console script: :func:`main`, then the end of the process without native
    teardown.

    pyarrow can abort in C++ static destructors at exit when one of its threads is still joinable
    ("terminate called without an active exception", exit 134; apache/arrow#34314). It was seen
    about once in a few hundred runs of ``datamill shards add``'s error path, after the error line
    had been printed. Python's own shutdown still happens here, in the interpreter's order:
    non-daemon threads are joined (which also drains ``concurrent.futures`` pools), ``atexit``
    handlers run (temporary folders, Ray, multiprocessing, S3 finalisation), streams are flushed;
    only the native library teardown after that is skipped. An unexpected exception still ends with
    its traceback (status 1).
    """
    status = main()
    shutdown = getattr(threading, "_shutdown", None)  # what Py_FinalizeEx runs first
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass
    os._exit(status)


if __name__ == "__main__":  # pragma: no cover
    run()
