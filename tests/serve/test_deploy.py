"""Deployment: deploy/nginx.conf in front of the server on a real nginx terminating TLS (a CA and a
certificate made here with trustme), the server's own TLS, the config file (every key, located
errors) and the systemd unit.

nginx is Debian's package (scripts/test.sh installs it when absent), run unprivileged-style with its
own prefix, config and pid file on loopback, and stopped by pid.
"""

from __future__ import annotations

import http.cookiejar
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from datamill.client import Client, Leases, RemoteLoader, Transport
from datamill.client.http import RemoteError
from datamill.core.errors import ConfigError
from datamill.serve.http.run import ServeConfig, load_config
from datamill.shards.dataset import ShardsetDataset
from tests.serve._proc import env, free_port, make_key, start_server, stop

pytestmark = pytest.mark.server

REPO = Path(__file__).resolve().parents[2]
N = 1500


def _certs(d: Path) -> dict[str, Path]:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    out = {"ca": d / "ca.pem", "cert": d / "cert.pem", "key": d / "key.pem"}
    ca.cert_pem.write_to_path(str(out["ca"]))
    cert.private_key_pem.write_to_path(str(out["key"]))
    for k, blob in enumerate(cert.cert_chain_pems):
        blob.write_to_path(str(out["cert"]), append=k > 0)
    return out


def _nginx_conf(prefix: Path, *, port: int, upstream: int, certs: dict[str, Path]) -> Path:
    """deploy/nginx.conf's server block with this test's ports and files, inside a minimal
    nginx.conf."""
    block = (REPO / "deploy" / "nginx.conf").read_text()
    for old, new in (
        ("listen 443 ssl;", f"listen 127.0.0.1:{port} ssl;"),
        ("server_name data.example.org;", "server_name 127.0.0.1;"),
        ("/etc/ssl/datamill/fullchain.pem", str(certs["cert"])),
        ("/etc/ssl/datamill/privkey.pem", str(certs["key"])),
        ("http://127.0.0.1:8470", f"http://127.0.0.1:{upstream}"),
    ):
        assert block.count(old) == 1, f"deploy/nginx.conf no longer has {old!r}"
        block = block.replace(old, new)
    temps = "\n".join(
        f"    {k}_temp_path {prefix / k};"
        for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    conf = prefix / "nginx.conf"
    conf.write_text(f"""{"user root;" if os.geteuid() == 0 else ""}
worker_processes 1;
error_log {prefix / "error.log"} warn;
events {{ worker_connections 128; }}
http {{
    access_log {prefix / "access.log"};
{temps}
{block}
}}
""")
    return conf


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    import socket

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-2000:] if log.exists() else "nginx exited"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError("nginx did not listen within 20 s")


def _login(base: str, key: str, ca: Path) -> tuple[str, http.cookiejar.CookieJar]:
    import ssl

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(
        urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=ca)),
        urllib.request.HTTPCookieProcessor(jar),
    )
    with opener.open(base + "/ui/login", timeout=30) as res:
        page = res.read().decode()
    token = re.search(r'name="csrf" value="([^"]+)"', page)
    assert token, page[:500]
    form = urllib.parse.urlencode(
        {"key": key, "csrf": token.group(1), "next": "/ui/datasets"}
    ).encode()
    req = urllib.request.Request(base + "/ui/login", data=form, headers={"Origin": base})
    with opener.open(
        req, timeout=30
    ) as res:  # follows the 303 to /ui/datasets with the session cookie
        assert res.status == 200 and res.url.endswith("/ui/datasets")
        return res.read().decode(), jar


@pytest.mark.skipif(
    shutil.which("nginx") is None, reason="Debian's nginx (scripts/test.sh installs it)"
)
def test_clients_and_the_ui_through_nginx_terminating_tls(tmp_path: Path) -> None:
    ShardsetDataset.create(
        tmp_path / "root" / "ds",
        pa.table({"uid": np.arange(N, dtype=np.int64), "x": np.arange(N, dtype=np.float32)}),
        uid="uid",
        shardset="main",
        shard_size=300,
    )
    certs = _certs(tmp_path)
    state = tmp_path / "state"
    admin, read = make_key(state, "admin"), make_key(state, "read")
    sport, nport = free_port(), free_port()
    server = start_server(
        tmp_path / "root",
        state,
        sport,
        "--forwarded-allow-ips",
        "127.0.0.1",
        "--allowed-hosts",
        "127.0.0.1",
    )
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    conf = _nginx_conf(prefix, port=nport, upstream=sport, certs=certs)
    with open(prefix / "stdout.log", "wb") as log:
        nginx = subprocess.Popen(
            [
                "nginx",
                "-p",
                str(prefix),
                "-c",
                str(conf),
                "-g",
                f"daemon off; pid {prefix / 'nginx.pid'};",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_port(nport, nginx, prefix / "error.log")
        url = f"https://127.0.0.1:{nport}"
        with Client(url, admin, verify=certs["ca"]) as c:
            c.register("ds", name="ds")
            assert [d["name"] for d in c.datasets()] == ["ds"]
        with Client(url, admin) as c, pytest.raises(RemoteError, match="CERTIFICATE_VERIFY_FAILED"):
            c.datasets()  # the system's CAs do not know the test CA
        loader = RemoteLoader(
            url,
            read,
            "ds",
            batch_size=64,
            collate="arrow",
            leases=Leases(name="tls"),
            transport=Transport(verify=certs["ca"]),
        )
        batches = list(loader)
        assert len(batches) == -(-N // 64)
        np.testing.assert_array_equal(
            np.sort(np.concatenate([b.column("uid").to_numpy() for b in batches])), np.arange(N)
        )
        page, jar = _login(url, admin, certs["ca"])
        assert "ds" in page
        session = [ck for ck in jar if ck.name == "datamill_session"]
        assert session and session[0].secure  # X-Forwarded-Proto: https from the trusted proxy
        access = (prefix / "access.log").read_text()
        assert (
            "/api/v1/iterations/" in access and "/ui/login" in access
        )  # it really went through nginx
    finally:
        if nginx.poll() is None:
            os.kill(nginx.pid, signal.SIGTERM)
            try:
                nginx.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(nginx.pid, signal.SIGKILL)
                nginx.wait(timeout=10)
        stop(server)


def test_the_server_serves_https_itself(tmp_path: Path) -> None:
    ShardsetDataset.create(
        tmp_path / "root" / "ds",
        pa.table({"uid": np.arange(100, dtype=np.int64)}),
        uid="uid",
        shardset="main",
        shard_size=50,
    )
    certs = _certs(tmp_path)
    state = tmp_path / "state"
    admin = make_key(state, "admin")
    port = free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "datamill.cli",
                "serve",
                str(tmp_path / "root"),
                "--port",
                str(port),
                "--state",
                str(state),
                "--ssl-certfile",
                str(certs["cert"]),
                "--ssl-keyfile",
                str(certs["key"]),
            ],
            env=env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with Client(f"https://127.0.0.1:{port}", admin, verify=certs["ca"]) as c:
                    assert c.health()["ok"]
                    break
            except RemoteError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.2)
        _, jar = _login(f"https://127.0.0.1:{port}", admin, certs["ca"])
        assert [ck.secure for ck in jar if ck.name == "datamill_session"] == [True]
    finally:
        stop(proc)
    assert "https://127.0.0.1" in log.read_text()
    only_cert = subprocess.run(
        [
            sys.executable,
            "-m",
            "datamill.cli",
            "serve",
            str(tmp_path / "root"),
            "--state",
            str(state),
            "--ssl-certfile",
            str(certs["cert"]),
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert only_cert.returncode == 2 and "ssl_keyfile" in only_cert.stderr


def _example_config() -> str:
    text = (REPO / "docs" / "running.md").read_text()
    m = re.search(r"<!-- docs-test: file=serve\.yaml -->\n```yaml\n(.*?)```", text, re.DOTALL)
    assert m, "docs/running.md has no serve.yaml example"
    return m.group(1)


def test_the_documented_serve_yaml_sets_every_key_and_loads(tmp_path: Path) -> None:
    example = _example_config()
    keys = {line.split(":", 1)[0] for line in example.splitlines() if re.match(r"^[a-z_]+:", line)}
    assert keys == set(ServeConfig.model_fields), "the example must show every key of ServeConfig"
    (tmp_path / "datasets").mkdir()
    (tmp_path / "serve.yaml").write_text(example)
    cfg = load_config(tmp_path / "serve.yaml")
    assert cfg.roots == [str((tmp_path / "datasets").resolve())]
    doc = ServeConfig.__doc__ or ""
    assert all(f"{k}:" in doc for k in ServeConfig.model_fields), (
        "every field is documented in the docstring"
    )


@pytest.mark.parametrize(
    ("text", "line", "column", "what"),
    [
        ("roots: [data]\nport: 8470\nlease_timout: 5\n", 3, "lease_timout", "Extra inputs"),
        ("roots: [data]\nlog_format: xml\n", 2, "log_format", "'text' or 'json'"),
        ("roots: [data]\ndatasets:\n  cifar: [1, 2]\n", 3, "datasets.cifar", "valid string"),
        (
            "roots: [data]\nforwarded_allow_ips:\n  - 127.0.0.1\n  - 5\n",
            4,
            "forwarded_allow_ips[1]",
            "valid string",
        ),
        (
            "roots: [data]\nforwarded_allow_ips: [10.0.0.0/8, proxy]\n",
            2,
            "forwarded_allow_ips",
            "an IP address",
        ),
        (
            "roots: [data]\nallowed_hosts: [ok.example.org, 'bad host']\n",
            2,
            "allowed_hosts[1]",
            "should match",
        ),
        ("roots: [data\n", 2, None, "cannot parse the YAML"),
        ("auth: true\nroots: [data]\nauth: false\n", 3, "auth", "duplicate key 'auth' on line 3"),
    ],
)
def test_config_errors_name_the_file_line_and_key(
    tmp_path: Path, text: str, line: int, column: str | None, what: str
) -> None:
    (tmp_path / "serve.yaml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "serve.yaml")
    assert err.value.line == line and err.value.column == column and what in str(err.value)
    assert str(err.value.path).endswith("serve.yaml")
    out = subprocess.run(
        [sys.executable, "-m", "datamill.cli", "serve", str(tmp_path / "serve.yaml")],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (
        out.returncode == 2
        and f"line {line}" in out.stderr
        and len(out.stderr.strip().splitlines()) <= 2
    )


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="no systemd-analyze on this machine (scripts/test.sh installs Debian's systemd)",
)
def test_the_systemd_unit_verifies_as_shipped(tmp_path: Path) -> None:
    """The guide's install steps laid out under a temporary root, then `systemd-analyze verify
    --root` on the unit file byte for byte as shipped (its ExecStart, config and dataset paths
    must exist there)."""
    shipped = (REPO / "deploy" / "datamill-serve.service").read_bytes()
    unit = shipped.decode()
    for need in (
        "DynamicUser=yes",
        "StateDirectory=datamill-serve",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "KillSignal=SIGTERM",
    ):
        assert need in unit, need
    guide = (REPO / "docs" / "running.md").read_text()
    for path in ("/opt/datamill/.venv", "/etc/datamill/serve.yaml", "/srv/datasets"):
        assert path in unit and f"`{path}`" in guide, path  # the guide makes what the unit uses
    assert "systemd-run --pty" in guide and "keys create --state /var/lib/datamill-serve" in guide
    root = tmp_path / "root"
    system = next(
        p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if p.is_dir()
    )
    shutil.copytree(system, root / "usr/lib/systemd/system", symlinks=True)
    exe = root / "opt/datamill/.venv/bin/datamill"
    exe.parent.mkdir(parents=True)
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} -m datamill.cli "$@"\n')
    exe.chmod(0o755)
    (root / "etc/datamill").mkdir(parents=True)
    (root / "etc/datamill/serve.yaml").write_text("roots: [/srv/datasets]\nhost: 127.0.0.1\n")
    (root / "srv/datasets").mkdir(parents=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "etc/systemd/system/datamill-serve.service").write_bytes(shipped)
    out = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            f"--root={root}",
            "/etc/systemd/system/datamill-serve.service",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    # and it does fail when the guide's paths are missing (the check is real)
    exe.unlink()
    out = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            f"--root={root}",
            "/etc/systemd/system/datamill-serve.service",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode != 0 and "/opt/datamill/.venv/bin/datamill" in out.stderr
