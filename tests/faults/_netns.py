"""Linux network namespaces for the multi-host test: one namespace per host, each joined by a veth
pair to a bridge in a hub namespace, addresses in 10.37.0.0/24 only inside the namespaces made here.

:func:`hosts` creates them and removes every one at the end (on failure too); :func:`run` and
:func:`popen` run a command in one. Needs root and ``ip`` (iproute2); :func:`unavailable` says why
not.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

SUBNET = "10.37.0"


def unavailable() -> str | None:
    """Why the namespaces cannot be made here (``None``: they can)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "ip netns needs root (CI runs as root)"
    if shutil.which("ip") is None:
        return "no `ip` (apt-get install iproute2; scripts/test.sh does)"
    return None


def cannot_create() -> str | None:
    """Why a namespace cannot be created (root without CAP_SYS_ADMIN, in an unprivileged
    container), found by creating and deleting one; ``None`` when it can."""
    probe = f"dmprobe{os.getpid() % 100000}"
    made = subprocess.run(
        ["ip", "netns", "add", probe], check=False, capture_output=True, text=True
    )
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False, capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Hosts:
    """Namespaces by host name, with their addresses; the hub namespace holds the bridge."""

    def __init__(self, prefix: str, names: Sequence[str]) -> None:
        self.prefix = prefix
        self.hub = f"{prefix}hub"
        self.ns = {name: f"{prefix}{name}" for name in names}
        self.addr = {name: f"{SUBNET}.{10 + i}" for i, name in enumerate(names)}
        self.port = {name: f"p{i}" for i, name in enumerate(names)}  # the hub's end of each link

    def exec_args(self, host: str, cmd: Sequence[str]) -> list[str]:
        """``cmd`` run in ``host``'s namespace."""
        return ["ip", "netns", "exec", self.ns[host], *cmd]

    def link(self, host: str, *, up: bool) -> None:
        """Bring ``host``'s link to the bridge down (a partition of that host) or up again."""
        _ip("-n", self.hub, "link", "set", self.port[host], "up" if up else "down")

    def unreachable(self, host: str, target: str, *, on: bool) -> None:
        """Drop (silently) every packet ``host`` sends to ``target``, or stop dropping them."""
        _ip("-n", self.ns[host], "route", "add" if on else "del", "blackhole", self.addr[target])


@contextlib.contextmanager
def hosts(names: Sequence[str]) -> Iterator[Hosts]:
    """Namespaces for ``names`` on one bridge; all removed at the end."""
    h = Hosts(f"dm{os.getpid() % 100000}", names)
    made: list[str] = []
    try:
        for ns in (h.hub, *h.ns.values()):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("-n", h.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", h.hub, "link", "set", "br0", "up")
        for name, ns in h.ns.items():
            inner = "eth0"
            port = h.port[name]
            _ip(
                "-n", h.hub, "link", "add", port, "type", "veth", "peer", "name", inner, "netns", ns
            )
            _ip("-n", h.hub, "link", "set", port, "master", "br0")
            _ip("-n", h.hub, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{h.addr[name]}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield h
    finally:
        for ns in reversed(made):  # deleting a namespace deletes its links (and their peers)
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True, timeout=30)


def run(h: Hosts, host: str, cmd: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in ``host``'s namespace to its end (checked, text output)."""
    out = subprocess.run(
        h.exec_args(host, cmd), check=False, capture_output=True, text=True, timeout=120, **kw
    )
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed ({out.returncode}): {out.stderr[-2000:]}")
    return out


def popen(h: Hosts, host: str, cmd: Sequence[str], log: Path, **kw: Any) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in ``host``'s namespace, its output to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(h.exec_args(host, cmd), stdout=out, stderr=subprocess.STDOUT, **kw)
