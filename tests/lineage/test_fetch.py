"""``datamill.lineage.fetch``: run records over plain HTTP (no server client), pages followed,
errors as one DataFileError naming the URL."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from datamill.core.errors import ConfigError, DataFileError
from datamill.lineage.fetch import RECORDS_FORMAT, fetch_records

PAGES = {
    "": {"format": RECORDS_FORMAT, "records": [{"epoch": 0}], "next_epoch": 1},
    "1": {"format": RECORDS_FORMAT, "records": [{"epoch": 1}], "next_epoch": None},
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.headers.get("Authorization") != "Bearer k":
            self._send(401, {"error": "a key is needed"})
        elif self.path.startswith("/one"):
            self._send(200, {"format": "datamill.run-record/1", "epoch": 0})
        else:
            page = self.path.partition("from_epoch=")[2]
            self._send(200, PAGES[page])

    def _send(self, status: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_pages_are_followed_and_one_record_is_a_list(url: str) -> None:
    assert fetch_records(f"{url}/runs/r/trace", key="k") == [{"epoch": 0}, {"epoch": 1}]
    assert fetch_records(f"{url}/one", key="k") == [{"format": "datamill.run-record/1", "epoch": 0}]


def test_errors_name_the_url(url: str) -> None:
    with pytest.raises(DataFileError, match="HTTP 401: a key is needed") as err:
        fetch_records(f"{url}/one", key=None)
    assert err.value.path == f"{url}/one"
    with pytest.raises(DataFileError, match="cannot reach"):
        fetch_records("http://127.0.0.1:9/x", key="k", timeout=5)
    with pytest.raises(ConfigError):
        fetch_records("file:///etc/passwd")
