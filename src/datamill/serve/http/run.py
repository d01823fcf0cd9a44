"""``serve()``: run the server (uvicorn, uvloop + httptools when installed) until interrupted,
from a config file (:class:`ServeConfig`) with command-line overrides; SIGTERM drains (no new
leases, acks of leases in flight accepted for ``drain_timeout`` seconds, then exit 0).
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from datamill.core.errors import ConfigError
from datamill.core.optional import require
from datamill.serve.http.guard import default_hosts

__all__ = [
    "DEFAULT_PORT",
    "HOST_PATTERN",
    "INITIAL_KEY_FILE",
    "ServeConfig",
    "is_loopback",
    "load_config",
    "serve",
]

DEFAULT_PORT = 8470
HOST_PATTERN = r"^(\*|[A-Za-z0-9.\-]+(:\d{1,5})?|\[[0-9A-Fa-f:.]+\](:\d{1,5})?)$"
"""A ``Host`` name the server may answer: ``name``, ``name:port``, ``[v6]:port`` or ``*``."""


class ServeConfig(BaseModel):
    """A server config file (YAML or JSON): every setting of ``datamill serve``; a command-line
    option given overrides the file's value. ``docs/running.md`` has an example with every key.

    Attributes:
        roots: folders datasets may be registered from (relative to the file). At least one.
        datasets: ``name: path`` registered at start (paths under a root).
        state: the state folder (journal). Defaults to ``.datamill-serve`` in the current folder.
        host: address to bind. Defaults to ``"127.0.0.1"``.
        port: port to bind. Defaults to ``8470``.
        auth: require API keys (``false`` only on a loopback address). Defaults to ``true``.
        allowed_hosts: ``Host`` names answered (``name`` or ``name:port``; ``*`` any). Defaults to
            the loopback names with the port and the bound address.
        lease_timeout: seconds a lease lives without a heartbeat. Defaults to ``60``.
        cache_shards: released shards each batch service keeps. Defaults to two shuffle windows per
            rank.
        log_format: ``text`` or ``json`` (one line per event). Defaults to ``text``.
        log_level: ``debug``, ``info`` (with the access log), ``warning`` or ``error``. Defaults to
            ``info``.
        ssl_certfile: PEM certificate (chain) to serve HTTPS directly. Defaults to none (HTTP).
        ssl_keyfile: its PEM private key. Defaults to none.
        forwarded_allow_ips: proxy addresses whose ``X-Forwarded-For``/``-Proto`` are trusted (``*``
            any). Defaults to none (headers ignored).
        drain_timeout: seconds SIGTERM waits for leases in flight to be acknowledged. Defaults to
            ``30``.
        metrics_no_auth: ``GET /metrics`` without a key (loopback addresses only). Defaults to
            ``false``.
        build_workers: processes building server-built leases (``0``: in the HTTP process). Defaults
            to the usable cores, at most 4.

    Examples:
        >>> ServeConfig(roots=["/data"], datasets={"cifar": "cifar10_shards"}).datasets
        {'cifar': 'cifar10_shards'}
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    roots: list[str] = Field(min_length=1)
    datasets: dict[str, str] = Field(default_factory=dict)
    state: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(DEFAULT_PORT, ge=1, le=65535)
    auth: bool = True
    allowed_hosts: list[Annotated[str, StringConstraints(pattern=HOST_PATTERN)]] | None = None
    lease_timeout: float = Field(60.0, ge=1, le=86_400, allow_inf_nan=False)
    cache_shards: int | None = Field(None, ge=1)
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    forwarded_allow_ips: list[str] | None = None

    drain_timeout: float = Field(30.0, ge=0, le=3600, allow_inf_nan=False)
    metrics_no_auth: bool = False
    build_workers: int | None = Field(None, ge=0, le=64)

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _addresses(cls, value: list[str] | None) -> list[str] | None:
        for v in value or ():
            try:
                if v != "*":
                    ipaddress.ip_network(v, strict=False)
            except ValueError as exc:
                msg = f"expected an IP address, a network like 10.0.0.0/8, or *, got {v!r}"
                raise ValueError(msg) from exc
        return value


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

    Relative ``roots``, ``state``, ``ssl_certfile`` and ``ssl_keyfile`` are taken from the file's
    folder.

    Raises:
        ConfigError: a missing path or an invalid config, naming the file, the line and the field.

    Examples:
        >>> import tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "serve.yaml"
        >>> _ = f.write_text("roots: [data]\\nlease_timeout: 0\\n")
        >>> load_config(f)  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: ...serve.yaml, line 2, column "lease_timeout": ... greater
        than or equal to 1...
    """
    p = Path(root_or_config)
    if p.is_dir():
        return ServeConfig.model_validate({"roots": [str(p)]})
    if not p.is_file():
        raise ConfigError("no such dataset root or config file", path=p)
    from datamill.core.yamlconfig import field_path, line_of, load_yaml

    text = p.read_text(encoding="utf-8")
    raw = load_yaml(text, path=p)  # a duplicate key is refused with its line
    if not isinstance(raw, dict):
        raise ConfigError(
            f"expected a mapping of settings (roots: [...], ...), got {type(raw).__name__}",
            path=p,
            hint="see docs/running.md for an example serve.yaml",
        )
    try:
        cfg = ServeConfig.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [x for x in err["loc"] if isinstance(x, (int, str))]
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        hint = (
            "remove it or check its spelling; the keys are " + ", ".join(ServeConfig.model_fields)
            if err["type"] == "extra_forbidden"
            else "see docs/running.md for every key and its range"
        )
        raise ConfigError(
            f"{err['msg']}, got {err.get('input')!r}{more}",
            path=p,
            line=line_of(text, loc),
            column=field_path(loc),
            hint=hint,
        ) from exc
    base = p.parent
    update: dict[str, Any] = {"roots": [str((base / r).resolve()) for r in cfg.roots]}
    for f in ("state", "ssl_certfile", "ssl_keyfile"):
        if getattr(cfg, f) is not None:
            update[f] = str(base / getattr(cfg, f))
    return cfg.model_copy(update=update)


# long (68 lines): the public entry: the checked config, logging, the app, uvicorn with
# TLS/proxy options and uvloop/httptools, the drain
def serve(
    root_or_config: str | os.PathLike[str],
    *,
    echo: Callable[[str], Any] = print,
    **options: Any,
) -> None:
    """Serve the datasets under a root (or a config's roots) until interrupted or drained by
    SIGTERM.

    Args:
        root_or_config: a dataset root folder or a server config file.
        echo: where start-up lines (and the one-time admin key) go. Defaults to ``print``.
        **options: any :class:`ServeConfig` field but ``roots`` and ``datasets`` (``host``,
            ``port``, ``state``, ``auth``, ``lease_timeout``, ``allowed_hosts``, ``log_format``,
            ``log_level``, ``ssl_certfile``, ``ssl_keyfile``, ``forwarded_allow_ips``,
            ``drain_timeout``, ``metrics_no_auth``, ``cache_shards``, ``build_workers``): one left
            ``None`` takes the config file's value, which defaults as the field says.

    Raises:
        ConfigError: ``auth=False`` or ``metrics_no_auth`` on a non-loopback address, a bad
            root/config/option.

    Examples:
        >>> serve("/nonexistent-root")
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: /nonexistent-root: no such dataset root or config file
    """
    base = load_config(root_or_config)
    paths_as_text = {
        k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in options.items()
    }
    cfg = _checked_config(base, paths_as_text)
    uvicorn = require("uvicorn", extra="serve")
    import logging.config

    from datamill.serve.data.workers import default_build_workers
    from datamill.serve.http.app import create_app
    from datamill.serve.observe.logs import event, log_config

    logging_cfg = log_config(fmt=cfg.log_format, level=cfg.log_level)
    logging.config.dictConfig(logging_cfg)
    state_dir = Path(cfg.state or ".datamill-serve")
    hosts = _allowed_hosts(cfg)
    app = create_app(
        state_dir,
        roots=cfg.roots,
        auth=cfg.auth,
        lease_timeout=cfg.lease_timeout,
        cache_shards=cfg.cache_shards,
        allowed_hosts=hosts,
        metrics_no_auth=cfg.metrics_no_auth,
        build_workers=default_build_workers() if cfg.build_workers is None else cfg.build_workers,
    )
    st = app.state.serve
    st.drain_timeout = float(cfg.drain_timeout)  # leases sized so that a SIGTERM's drain ends
    for name, path in cfg.datasets.items():
        st.register(path, name=name)
    key = app.state.initial_admin_key
    url = f"{'https' if cfg.ssl_certfile else 'http'}://{cfg.host}:{cfg.port}"
    echo(
        f"datamill serve: {url} (state {state_dir}, roots {', '.join(cfg.roots)}, "
        f"auth {'on' if cfg.auth else 'off'}, hosts {', '.join(hosts)})"
    )
    if key:
        _show_initial_key(key, state_dir, echo)
    _recovery_summary(st, url=url)
    # uvloop and httptools where installed (httptools behind the bounds of http.limits, telling the
    # state of client sessions whose connections were all closed)
    fast: dict[str, Any] = {"loop": "uvloop"} if importlib.util.find_spec("uvloop") else {}
    if importlib.util.find_spec("httptools"):
        from datamill.serve.http.limits import guarded_http

        closed, opened = st.session_closed, st.session_opened
        fast["http"] = guarded_http(
            cfg.forwarded_allow_ips, session_closed=closed, session_opened=opened
        )
    proxies = ",".join(cfg.forwarded_allow_ips or ())  # X-Forwarded-* trusted from these only
    config = uvicorn.Config(
        app,
        host=cfg.host,
        port=int(cfg.port),
        log_config=logging_cfg,
        log_level=cfg.log_level,
        access_log=cfg.log_level in ("debug", "info"),
        ssl_certfile=cfg.ssl_certfile,
        ssl_keyfile=cfg.ssl_keyfile,
        timeout_graceful_shutdown=5,
        proxy_headers=bool(proxies),
        forwarded_allow_ips=proxies or None,
        **fast,
        timeout_keep_alive=75,
    )  # above a proxy's or client's idle time: no close/send race
    server = _draining_server(config, state=st, drain_timeout=cfg.drain_timeout)
    server.run()
    event("stopped", drained=server.drained, leases_left=server.leases_left)


def _checked_config(base: ServeConfig, given: dict[str, Any]) -> ServeConfig:
    """``base`` with the ``given`` options that are not ``None`` over it, validated and checked
    (auth off or open metrics only on loopback, TLS files both given, present and a pair)."""
    from datamill.core.yamlconfig import field_path

    try:
        cfg = ServeConfig.model_validate(
            {**base.model_dump(), **{k: v for k, v in given.items() if v is not None}}
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        where = field_path([x for x in err["loc"] if isinstance(x, (int, str))])
        raise ConfigError(f"option {where}: {err['msg']}, got {err.get('input')!r}") from exc
    for flag, on in (("--no-auth", not cfg.auth), ("--metrics-no-auth", cfg.metrics_no_auth)):
        if on and not is_loopback(cfg.host):
            raise ConfigError(
                f"{flag} is allowed only on a loopback address, not {cfg.host!r}",
                hint="bind 127.0.0.1, or create keys with `datamill serve keys create`",
            )
    if (cfg.ssl_certfile is None) != (cfg.ssl_keyfile is None):
        raise ConfigError(
            "TLS needs both ssl_certfile and ssl_keyfile (--ssl-certfile, --ssl-keyfile)"
        )
    for f in (cfg.ssl_certfile, cfg.ssl_keyfile):
        if f is not None and not Path(f).is_file():
            raise ConfigError("no such TLS certificate or key file", path=f)
    if cfg.ssl_certfile is not None and cfg.ssl_keyfile is not None:
        _check_tls(cfg.ssl_certfile, cfg.ssl_keyfile)  # before anything is printed or created
    return cfg


def _allowed_hosts(cfg: ServeConfig) -> list[str]:
    """The ``Host`` names answered: the configured ones, else the loopback names and the bound
    address (plus this machine's names when bound to all interfaces)."""
    if cfg.allowed_hosts is not None:
        return list(cfg.allowed_hosts)
    hosts = default_hosts(cfg.host, cfg.port)
    if cfg.host in ("0.0.0.0", "::"):
        hosts += [f"{n}:{cfg.port}" for n in {socket.gethostname(), socket.getfqdn()} if n]
    return hosts


INITIAL_KEY_FILE = "initial-admin-key"
"""Where a first start not on a terminal (systemd, a log file) leaves its admin key, in the state
folder (mode 0600), instead of printing it to a log that keeps it for good."""


def _show_initial_key(key: str, state_dir: Path, echo: Callable[[str], Any]) -> None:
    """The first start's admin key: printed on a terminal; otherwise written to
    :data:`INITIAL_KEY_FILE` in the state folder and only that file's path printed."""
    if sys.stdout.isatty():
        echo(f"admin key (shown once, store it now): {key}")
        return
    path = state_dir / INITIAL_KEY_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(key + "\n")
    echo(
        f"no key existed: an admin key was written to {path} (mode 0600, not to this log); "
        "store it and delete the file, or create keys with `datamill serve keys create` before "
        "the first start"
    )


def _check_tls(certfile: str, keyfile: str) -> None:
    """Load the certificate and key as the server will; a bad or mismatched pair is a
    :class:`ConfigError` (one line at the command line), never an ``ssl.SSLError`` traceback."""
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(certfile, keyfile, password=lambda: b"")
    except (ssl.SSLError, OSError, ValueError) as exc:
        what = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
        raise ConfigError(
            f"cannot load the TLS certificate and key ({what}): expected a PEM certificate "
            f"(chain) and the unencrypted PEM private key that matches it (key {keyfile})",
            path=certfile,
            hint="check --ssl-certfile/--ssl-keyfile (openssl x509 -in CERT -noout; openssl pkey "
            "-in KEY -noout)",
        ) from exc


def _recovery_summary(st: Any, *, url: str) -> None:
    """Log the start line with what the journal holds (iterations by status, leases held for their
    holders)."""
    from datamill.serve.observe import lifecycle
    from datamill.serve.observe.logs import event

    by = lifecycle.counts(st.journal)
    held = st.journal._exec("SELECT COUNT(*) FROM leases")[0][0]  # the schema always has it
    event(
        "start",
        url=url,
        state=str(st.journal.dir),
        datasets=len(st.journal.datasets()),
        iterations=sum(by.values()),
        **{s: by[s] for s in ("running", "stale", "finished", "cancelled")},
        journaled_leases=int(held),
    )


def _draining_server(config: Any, *, state: Any, drain_timeout: float) -> Any:
    """uvicorn's server whose SIGTERM drains first: no new leases (503), acks and heartbeats
    answered until every live lease is acknowledged or ``drain_timeout`` passes; then a normal
    shutdown (exit 0). A second SIGTERM, or SIGINT, stops at once."""
    import uvicorn

    from datamill.serve.observe.logs import event

    def live() -> int:
        with state._lock:
            its = list(state._iterations.values())
        return sum(len(it.leases) for it in its)

    class DrainingServer(uvicorn.Server):
        draining_started, drained, leases_left = False, False, 0

        def handle_exit(self, sig: int, frame: Any) -> None:
            if sig == signal.SIGTERM and not self.draining_started:
                self.draining_started = True
                threading.Thread(target=self._drain, name="datamill-drain", daemon=True).start()
                return
            super().handle_exit(sig, frame)

        def _drain(self) -> None:
            state.draining = True
            left = live()
            event("draining", leases_live=left, timeout_s=float(drain_timeout))
            deadline = time.monotonic() + drain_timeout
            while left and time.monotonic() < deadline:
                time.sleep(0.05)
                left = live()
            self.drained, self.leases_left = left == 0, left
            note = "their holders reclaim them from the next server (grace period)"
            end = "drained" if left == 0 else "drain timeout"
            event(end, leases_left=left, note=note if left else "")
            self.should_exit = True

    return DrainingServer(config)
