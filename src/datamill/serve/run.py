"""``serve()``: run the server (uvicorn, uvloop + httptools when installed) until interrupted."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from datamill.core.errors import ConfigError
from datamill.core.optional import require
from datamill.serve.guard import default_hosts

__all__ = ["DEFAULT_PORT", "ServeConfig", "is_loopback", "load_config", "serve"]

DEFAULT_PORT = 8470


class ServeConfig(BaseModel):
    """A server config file (YAML or JSON): roots, datasets registered at start, defaults.

    Examples:
        >>> ServeConfig(roots=["/data"], datasets={"cifar": "cifar10_shards"}).datasets
        {'cifar': 'cifar10_shards'}
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    roots: list[str] = Field(min_length=1)
    datasets: dict[str, str] = Field(default_factory=dict)
    state: str | None = None
    lease_timeout: float = Field(60.0, ge=1, le=86_400, allow_inf_nan=False)
    cache_shards: int | None = Field(None, ge=1)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``--no-auth`` is allowed only there).

    Examples:
        >>> is_loopback("127.0.0.1"), is_loopback("localhost"), is_loopback("0.0.0.0")
        (True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_config(root_or_config: str | os.PathLike[str]) -> ServeConfig:
    """A folder is one root; a ``.yaml``/``.yml``/``.json`` file is a :class:`ServeConfig`.

    Raises:
        ConfigError: a missing path or an invalid config (naming the file and field).
    """
    p = Path(root_or_config)
    if p.is_dir():
        return ServeConfig.model_validate({"roots": [str(p)]})
    if not p.is_file():
        raise ConfigError("no such dataset root or config file", path=p)
    import yaml

    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
        cfg = ServeConfig.model_validate(raw)
    except (yaml.YAMLError, ValidationError) as exc:
        raise ConfigError(f"invalid server config: {' '.join(str(exc).split())}", path=p) from exc
    base = p.parent
    return cfg.model_copy(update={"roots": [str((base / r).resolve()) for r in cfg.roots]})


def serve(root_or_config: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          state: str | os.PathLike[str] | None = None, auth: bool = True, lease_timeout: float | None = None,
          allowed_hosts: Sequence[str] | None = None, echo: Callable[[str], Any] = print) -> None:
    """Serve the datasets under a root (or a config's roots) until interrupted.

    Args:
        root_or_config: a dataset root folder or a server config file.
        host: address to bind. Defaults to ``"127.0.0.1"``.
        port: port to bind. Defaults to ``8470``.
        state: state folder (journal). Defaults to the config's, else ``.datamill-serve`` here.
        auth: require API keys; ``False`` only on a loopback address. Defaults to ``True``.
        lease_timeout: lease lifetime without heartbeats. Defaults to the config's (``60`` s).
        allowed_hosts: ``Host`` names answered (``name`` or ``name:port``, ``*`` any). Defaults to the loopback
            names with ``port``, the bound address, and this machine's names when bound to all interfaces.
        echo: where start-up lines (and the one-time admin key) go. Defaults to ``print``.

    Raises:
        ConfigError: ``auth=False`` on a non-loopback address, or a bad root/config.

    Examples:
        >>> serve("/nonexistent-root")
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: /nonexistent-root: no such dataset root or config file
    """
    if not 1 <= int(port) <= 65535:
        raise ConfigError(f"expected a port in 1..65535, got {port}")
    cfg = load_config(root_or_config)
    if not auth and not is_loopback(host):
        raise ConfigError(f"--no-auth is allowed only on a loopback address, not {host!r}",
                          hint="bind 127.0.0.1, or create keys with `datamill serve keys create`")
    uvicorn = require("uvicorn", extra="serve")
    from datamill.serve.app import create_app

    state_dir = Path(state or cfg.state or ".datamill-serve")
    hosts = list(allowed_hosts) if allowed_hosts is not None else default_hosts(host, port)
    if allowed_hosts is None and host in ("0.0.0.0", "::"):
        hosts += [f"{n}:{port}" for n in {socket.gethostname(), socket.getfqdn()} if n]
    app = create_app(state_dir, roots=cfg.roots, auth=auth, lease_timeout=lease_timeout or cfg.lease_timeout,
                     cache_shards=cfg.cache_shards, allowed_hosts=hosts)
    for name, path in cfg.datasets.items():
        app.state.serve.register(path, name=name)
    key = app.state.initial_admin_key
    echo(f"datamill serve: http://{host}:{port} (state {state_dir}, roots {', '.join(cfg.roots)}, "
         f"auth {'on' if auth else 'off'}, hosts {', '.join(hosts)})")
    if key:
        echo(f"admin key (shown once, store it now): {key}")
    fast = {}
    for mod, opt, val in (("uvloop", "loop", "uvloop"), ("httptools", "http", "httptools")):
        try:
            __import__(mod)
            fast[opt] = val
        except ImportError:
            pass
    uvicorn.run(app, host=host, port=int(port), log_level="warning", access_log=False, **fast)
