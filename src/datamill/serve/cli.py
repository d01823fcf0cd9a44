"""``datamill serve``: run the server, manage its keys, iterate from it.

* ``datamill serve ROOT_OR_CONFIG [--host 127.0.0.1] [--port 8470] [--state DIR] [--no-auth]``
* ``datamill serve keys create|list|revoke --state DIR [--role read|admin] [KEY_ID]``
* ``datamill serve iterate --url URL --key K DATASET [--batch-size 256] [--rank R --world-size W] ...``
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

__all__ = ["iterate", "register"]

USAGE = """datamill serve ROOT_OR_CONFIG [--host H] [--port P] [--state DIR] [--no-auth] [--lease-timeout S]
       datamill serve keys create|list|revoke --state DIR [--role read|admin] [KEY_ID]
       datamill serve iterate --url URL [--key K] DATASET [--batch-size N] [--rank R] [--world-size W] ..."""


def _server_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="datamill serve", usage=USAGE)
    p.add_argument("target", help="a dataset root folder, or a server config (YAML/JSON: roots, datasets)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8470)
    p.add_argument("--state", default=None, help="state folder (default: the config's, else ./.datamill-serve)")
    p.add_argument("--no-auth", action="store_true", help="no API keys (loopback addresses only)")
    p.add_argument("--lease-timeout", type=float, default=None, help="seconds a lease lives without heartbeat")
    return p


def _keys(argv: list[str]) -> int:
    from datamill.serve.auth import create_key
    from datamill.serve.journal import Journal

    p = argparse.ArgumentParser(prog="datamill serve keys")
    p.add_argument("action", choices=["create", "list", "revoke"])
    p.add_argument("key_id", nargs="?", help="the key id to revoke (the part after dmk_ and before the dot)")
    p.add_argument("--state", required=True, help="the server's state folder")
    p.add_argument("--role", choices=["read", "admin"], default="read")
    p.add_argument("--note", default="")
    args = p.parse_args(argv)
    journal = Journal(args.state)
    try:
        if args.action == "create":
            _, key = create_key(journal, role=args.role, note=args.note)
            print(key)
        elif args.action == "list":
            for k in journal.list_keys():
                status = "revoked" if k["revoked"] else "active"
                print(f"{k['id']}\t{k['role']}\t{status}\t{time.strftime('%Y-%m-%d %H:%M', time.gmtime(k['created']))}"
                      f"\t{k['note']}")
        else:
            if not args.key_id:
                p.error("revoke needs KEY_ID")
            if not journal.revoke_key(args.key_id):
                print(f"no active key {args.key_id!r}")
                return 1
            print(f"revoked {args.key_id}")
    finally:
        journal.close()
    return 0


def iterate(argv: list[str]) -> int:
    """``datamill serve iterate DATASET --url URL ...`` (also ``datamill iterate DATASET --url URL``)."""
    from datamill.serve.remote import RemoteLoader

    p = argparse.ArgumentParser(prog="datamill serve iterate")
    p.add_argument("dataset", help="registered dataset id or name")
    p.add_argument("--url", required=True)
    p.add_argument("--key", default=os.environ.get("DATAMILL_KEY"), help="API key (default $DATAMILL_KEY)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--columns", default=None, help="comma-separated")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--mode", choices=["static", "dynamic"], default="static")
    p.add_argument("--name", default=None, help="iteration name (processes with one name share an iteration)")
    p.add_argument("--limit", type=int, default=0, help="stop after this many batches")
    p.add_argument("--save-state", default=None, help="write the RemoteLoader state JSON here at the end")
    args = p.parse_args(argv)
    loader = RemoteLoader(args.url, args.key, args.dataset, batch_size=args.batch_size, seed=args.seed,
                          epoch=args.epoch, columns=args.columns.split(",") if args.columns else None,
                          rank=args.rank, world_size=args.world_size, mode=args.mode, name=args.name,
                          collate="arrow")
    start = time.perf_counter()
    rows = batches = 0
    for batch in loader:
        rows += batch.num_rows
        batches += 1
        if args.limit and batches >= args.limit:
            break
    dt = time.perf_counter() - start
    print(f"iteration {loader.iteration_id}: {batches:,} batches, {rows:,} samples in {dt:.2f} s "
          f"({rows / max(dt, 1e-9):,.0f} samples/s; waited {loader.stall_s:.2f} s for data)")
    if args.save_state:
        from datamill.core.io import atomic_write

        with atomic_write(args.save_state, "w") as f:
            json.dump(loader.state_dict(), f, indent=2, sort_keys=True)
    return 0


def _cmd(args: argparse.Namespace) -> int:
    argv: list[str] = list(args.args)
    if argv and argv[0] == "keys":
        return _keys(argv[1:])
    if argv and argv[0] == "iterate":
        return iterate(argv[1:])
    from datamill.serve.run import serve

    opts = _server_parser().parse_args(argv)
    serve(opts.target, host=opts.host, port=opts.port, state=opts.state, auth=not opts.no_auth,
          lease_timeout=opts.lease_timeout, echo=lambda line: print(line, flush=True))
    return 0


def register(sub: Any) -> None:
    """Add ``datamill serve`` (server, ``keys``, ``iterate``); ``datamill iterate --url`` calls ``iterate``."""
    from datamill.core.commands import register_handler

    register_handler("serve iterate", iterate)
    p = sub.add_parser("serve", help="serve datasets to training processes over HTTP (exactly once)",
                       usage=USAGE, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("args", nargs=argparse.REMAINDER, help="ROOT_OR_CONFIG [options] | keys ... | iterate ...")
    p.set_defaults(func=_cmd)
