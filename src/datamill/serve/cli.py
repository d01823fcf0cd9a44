"""``datamill serve``: run the server, manage its keys, read its audit log, back it up, iterate from
it.

* ``datamill serve ROOT_OR_CONFIG [--host 127.0.0.1] [--port 8470] [--state DIR] [--no-auth]
  [--allowed-hosts H,...] [--log-format text|json] [--log-level info] [--ssl-certfile F
  --ssl-keyfile F] [--forwarded-allow-ips IPS] [--drain-timeout 30] [--metrics-no-auth]``
  (docs/running.md)
* ``datamill serve keys create|list|revoke --state DIR ...`` (``create --role admin --datasets a,b
  --expires 30d``)
* ``datamill serve audit --state DIR`` | ``datamill serve backup --state DIR OUT``
* ``datamill serve gc --state DIR --older-than 30d`` (iterations that ended before, from the
  journal)
* ``datamill serve iterate DATASET --url URL [--key K] [--batch-size 256] [--rank R --world-size W]
  [--transport built|direct] ...``
"""

from __future__ import annotations

import argparse
import contextlib
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datamill.client.cli import add_iterate_options, run_iterate
from datamill.core.checks import Limit

if TYPE_CHECKING:
    from datamill.serve.journal.store import Journal

__all__ = ["host_list", "register"]


def _ranged(name: str) -> Callable[[str], Any]:
    """An argparse type: a number in the range :class:`~datamill.serve.http.run.ServeConfig`
    declares for its field ``name``, checked by that range's :class:`~datamill.core.checks.Limit`
    (the API's words)."""
    from datamill.serve.http.run import ServeConfig

    field = ServeConfig.model_fields[name]
    bound = {k: getattr(m, k) for m in field.metadata for k in ("ge", "le") if hasattr(m, k)}
    kind = "float" if field.annotation is float else "int"
    return Limit(name, low=bound["ge"], high=bound["le"], kind=kind).arg


def host_list(text: str) -> list[str]:
    """An argparse type: comma-separated host names (``name``, ``name:port``, ``[::1]:port`` or
    ``*``).

    Examples:
        >>> host_list("example.org, 10.0.0.5:8470")
        ['example.org', '10.0.0.5:8470']
    """
    from datamill.serve.http.run import HOST_PATTERN

    hosts = [h.strip() for h in text.split(",") if h.strip()]
    if not hosts or not all(re.match(HOST_PATTERN, h) for h in hosts):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated host names such as example.org,10.0.0.5:8470, got {text!r}"
        )
    return hosts


# ----------------------------------------------------------------------------------------- commands
def _server(args: argparse.Namespace) -> int:
    from datamill.serve.http.run import serve

    if args.target is None:
        from datamill.core.errors import ConfigError

        raise ConfigError(
            "expected a dataset root folder or a server config file: datamill serve ROOT_OR_CONFIG "
            "(or a command: keys, audit, backup, iterate; see datamill serve --help)"
        )
    options = {name: getattr(args, name) for name in _SERVER_OPTIONS}
    serve(
        args.target,
        auth=False if args.no_auth else None,
        metrics_no_auth=True if args.metrics_no_auth else None,
        echo=lambda line: print(line, flush=True),
        **options,
    )
    return 0


def _need_journal(state: str) -> None:
    """Refuse a ``--state`` folder that holds no journal (a mistyped path) instead of creating one;
    only ``keys create`` (the first step) and the server create a journal."""
    from datamill.serve.journal import DB_NAME, StateError

    if not (Path(state) / DB_NAME).is_file():
        raise StateError(
            f"no journal here ({DB_NAME} missing): nothing to read",
            path=state,
            hint="check --state: pass the state folder of an existing server",
        )


@contextlib.contextmanager
def _journal(state: str, lock: str | None = None, *, existing: bool = True) -> Iterator[Journal]:
    """The journal of ``state`` (which must hold one when ``existing``), closed afterwards."""
    from datamill.serve.journal.store import Journal

    if existing:
        _need_journal(state)
    with contextlib.closing(Journal(state, lock=lock, beside=lock is not None)) as journal:
        yield journal


def _gc(args: argparse.Namespace) -> int:
    from datamill.serve.http.auth import parse_duration
    from datamill.serve.observe.lifecycle import gc

    older = parse_duration(args.older_than)
    with _journal(args.state, "gc") as journal:
        removed = gc(journal, older_than=older)
        if removed:
            what = f"{len(removed)} iterations ended more than {args.older_than} ago (command line)"
            journal.add_audit(None, "gc", what)
    print(f"removed {len(removed)} iteration(s) that ended more than {args.older_than} ago")
    return 0


def _keys_create(args: argparse.Namespace) -> int:
    from datamill.serve.http.auth import create_key, parse_duration

    expires_in = parse_duration(args.expires) if args.expires else None
    datasets = [d.strip() for d in args.datasets.split(",")] if args.datasets is not None else None
    with _journal(args.state, "keys", existing=False) as journal:
        key_id, key = create_key(
            journal, role=args.role, note=args.note, datasets=datasets, expires_in=expires_in
        )
        what = (
            f"{key_id} role={args.role} datasets={datasets} expires={args.expires} (command line)"
        )
        journal.add_audit(None, "create key", what)
    print(key)
    return 0


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))


def _keys_list(args: argparse.Namespace) -> int:
    with _journal(args.state) as journal:
        now = time.time()
        for k in journal.list_keys():
            expired = k["expires"] is not None and k["expires"] <= now
            status = "revoked" if k["revoked"] else "expired" if expired else "active"
            scope = ",".join(k["datasets"]) if k["datasets"] else "*"
            print(
                f"{k['id']}\t{k['role']}\t{status}\t{_when(k['created'])}\texpires "
                f"{_when(k['expires'])}\tdatasets {scope}\t{k['note']}"
            )
    return 0


def _keys_revoke(args: argparse.Namespace) -> int:
    with _journal(args.state, "keys") as journal:
        if not journal.revoke_key(args.key_id):
            print(f"no active key {args.key_id!r}")
            return 1
        journal.add_audit(None, "revoke key", f"{args.key_id} (command line)")
    print(f"revoked {args.key_id}")
    return 0


def _audit(args: argparse.Namespace) -> int:
    with _journal(args.state) as journal:
        for row in journal.audit():
            at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(row["at"]))
            print(f"{at}\t{row['key'] or '-'}\t{row['action']}\t{row['detail']}")
    return 0


def _backup(args: argparse.Namespace) -> int:
    from datamill.serve.journal.store import backup

    _need_journal(args.state)
    out = backup(args.state, args.out)
    print(f"backed up the journal of {args.state} to {out}")
    return 0


# ------------------------------------------------------------------------------------------ parsers
class _TargetOrCommand(argparse._SubParsersAction):  # type: ignore[type-arg]
    """``datamill serve ROOT [options]`` runs the server; ``datamill serve COMMAND ...`` runs a
    command."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if values and values[0] in self._name_parser_map:
            super().__call__(parser, namespace, values, option_string)
            return
        namespace.target = values[0]
        parser.parse_args(values[1:], namespace)  # the server's options after ROOT_OR_CONFIG


_CONFIGS = "(default: the config's, else"
_SERVER_OPTIONS: dict[str, tuple[Any, str]] = {  # the options of `datamill serve ROOT_OR_CONFIG`
    "host": (str, f"address to bind {_CONFIGS} 127.0.0.1)"),
    "port": (_ranged("port"), f"port to bind, 1..65535 {_CONFIGS} 8470)"),
    "state": (str, f"state folder {_CONFIGS} ./.datamill-serve)"),
    "lease_timeout": (
        _ranged("lease_timeout"),
        f"seconds a lease lives without a heartbeat, 1..86400 {_CONFIGS} 60)",
    ),
    "allowed_hosts": (
        host_list,
        "comma-separated Host names the server answers (name or name:port; * for any); default: "
        + "127.0.0.1, localhost and [::1] with the port, and the bound address",
    ),
    "log_format": (["text", "json"], f"one line per event as text or JSON {_CONFIGS} text)"),
    "log_level": (
        ["debug", "info", "warning", "error"],
        f"log level; info and debug include the access log {_CONFIGS} info)",
    ),
    "ssl_certfile": (str, "PEM certificate (chain): serve HTTPS directly"),
    "ssl_keyfile": (str, "PEM private key of --ssl-certfile"),
    "forwarded_allow_ips": (
        lambda s: [h.strip() for h in s.split(",") if h.strip()],
        "comma-separated proxy addresses whose X-Forwarded-For/-Proto are trusted (* any); "
        + "default none",
    ),
    "drain_timeout": (
        _ranged("drain_timeout"),
        f"seconds SIGTERM waits for leases in flight to be acknowledged, 0..3600 {_CONFIGS} 30)",
    ),
    "build_workers": (
        _ranged("build_workers"),
        "processes building server-built leases, 0..64 (0: in the HTTP process; default: the "
        + "config's, else the cores, at most 4)",
    ),
}
_SWITCHES = {
    "--no-auth": "no API keys (loopback addresses only)",
    "--metrics-no-auth": "GET /metrics without a key (loopback addresses only)",
}


def _command(cmds: Any, name: str, func: Callable[..., int], help_: str) -> Any:
    """A command on the server's state folder (``--state``, required)."""
    p = cmds.add_parser(name, help=help_)
    p.add_argument("--state", required=True, help="the server's state folder")
    p.set_defaults(func=func)
    return p


def register(sub: Any) -> None:
    """Add ``datamill serve`` (the server, ``keys``, ``audit``, ``backup``, ``iterate``)."""
    from datamill.core.commands import register_handler

    register_handler("serve iterate", run_iterate)  # `datamill iterate DATASET --url URL` calls it
    p = sub.add_parser(
        "serve",
        help="serve datasets to training processes over HTTP (exactly once)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for name, (kind, help_) in _SERVER_OPTIONS.items():
        how = {"choices": kind} if isinstance(kind, list) else {"type": kind}
        p.add_argument("--" + name.replace("_", "-"), default=None, help=help_, **how)
    for flag in ("--no-auth", "--metrics-no-auth"):
        p.add_argument(flag, action="store_true", help=_SWITCHES[flag])
    p.set_defaults(func=_server, target=None)
    cmds = p.add_subparsers(
        title="commands (instead of ROOT_OR_CONFIG)",
        dest="serve_command",
        metavar="ROOT_OR_CONFIG | COMMAND",
        action=_TargetOrCommand,
    )
    cmds.choices = None  # any first word: a dataset root or config unless it names a command
    keys = cmds.add_parser("keys", help="create, list and revoke API keys")
    key_cmds = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    create = _command(key_cmds, "create", _keys_create, "create a key (printed once)")
    create.add_argument(
        "--role",
        choices=["read", "admin", "metrics"],
        default="read",
        help="read, admin, or metrics (GET /metrics only) (default read)",
    )
    create.add_argument(
        "--datasets",
        default=None,
        help="comma-separated dataset names the key may use (default all)",
    )
    create.add_argument(
        "--expires", default=None, help="lifetime such as 12h, 30d, 2w (default never)"
    )
    create.add_argument("--note", default="", help="a note shown by `keys list`")
    _command(key_cmds, "list", _keys_list, "list keys (never their secrets)")
    revoke = _command(key_cmds, "revoke", _keys_revoke, "revoke a key and its UI sessions")
    revoke.add_argument("key_id", help="the key id (the part after dmk_ and before the dot)")
    what = "print the audit log: admin actions and each key's first use per day"
    _command(cmds, "audit", _audit, what)
    what = "copy the journal of a (running) server with SQLite's online backup"
    _command(cmds, "backup", _backup, what).add_argument(
        "out", help="the backup file to write (must not exist)"
    )
    what = "remove iterations that ended (finished or cancelled) long ago from the journal"
    _command(cmds, "gc", _gc, what).add_argument(
        "--older-than", required=True, help="age such as 30d, 12h, 2w: iterations that ended before"
    )
    iterate = cmds.add_parser("iterate", help="iterate a served dataset once and print throughput")
    add_iterate_options(iterate)
    iterate.set_defaults(func=run_iterate)
