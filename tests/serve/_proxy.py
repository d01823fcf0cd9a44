"""A TCP proxy on loopback that can black-hole its connections: while ``holed``, it stops forwarding
bytes either way without closing anything (a network partition as a client sees it: requests are
sent and never answered); once opened again it forwards what the kernel buffered meanwhile."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Iterator


class BlackHoleProxy:
    """Forward ``127.0.0.1:<port>`` to ``127.0.0.1:<target>``; :attr:`holed` stops the traffic."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.holed = threading.Event()
        self._stop = threading.Event()
        self._listen = socket.create_server(("127.0.0.1", 0))
        self._listen.settimeout(0.1)
        self.port = int(self._listen.getsockname()[1])
        self._socks: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def url(self) -> str:
        """The proxy's ``http://`` url."""
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stop forwarding and close every socket."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self._listen.close()
        for s in self._socks:
            s.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listen.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            self._socks += [client, server]
            t = threading.Thread(target=self._pump, args=(client, server), daemon=True)
            t.start()
            self._threads.append(t)

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        other = {a: b, b: a}
        with contextlib.suppress(OSError):
            while not self._stop.is_set():
                if self.holed.is_set():  # read nothing, send nothing, close nothing
                    self._stop.wait(0.02)
                    continue
                readable, _, _ = select.select([a, b], [], [], 0.05)
                for s in readable:
                    data = s.recv(1 << 16)
                    if not data:
                        a.close()
                        b.close()
                        return
                    other[s].sendall(data)


@contextlib.contextmanager
def black_hole_proxy(target: int) -> Iterator[BlackHoleProxy]:
    """A :class:`BlackHoleProxy` to ``target`` for the block."""
    proxy = BlackHoleProxy(target)
    try:
        yield proxy
    finally:
        proxy.close()
