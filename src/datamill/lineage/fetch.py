"""Run records fetched over HTTP from a ``datamill serve`` server (``datamill trace URL``).

Plain ``urllib`` (standard library), so lineage never imports the server's client: a server's
``/api/v1/iterations/{id}/trace`` answers one record, its ``/api/v1/runs/{name}/trace`` pages of
records (``datamill.run-records/1``), followed here page by page.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from datamill.core.errors import DataFileError

__all__ = ["RECORDS_FORMAT", "fetch_records"]

RECORDS_FORMAT = "datamill.run-records/1"
"""The format of a page of run records (a run's ``/trace`` route)."""


def _get(url: str, key: str | None, timeout: float) -> Any:
    """``GET url`` as JSON; one :class:`DataFileError` for an HTTP error or an unreachable host."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(url, headers=headers, method="GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as res:
            return json.loads(res.read() or b"null")
    except urllib.error.HTTPError as exc:
        body = exc.read()[:500]
        try:
            detail = json.loads(body).get("error", body)
        except (ValueError, AttributeError):
            detail = body.decode("utf-8", "replace")
        raise DataFileError(
            f"GET: HTTP {exc.code}: {detail}",
            path=url,
            hint="give the read key of the server (--key or DATAMILL_KEY)"
            if exc.code in (401, 403)
            else None,
        ) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise DataFileError(
            f"cannot reach the server: {exc}", path=url, hint="is `datamill serve` running there?"
        ) from exc


def fetch_records(
    url: str, *, key: str | None = None, timeout: float = 60.0
) -> list[dict[str, Any]]:
    """The run records a server's trace route answers (every page of a run's).

    Args:
        url: ``http(s)://host:port/api/v1/iterations/ID/trace`` or ``.../runs/NAME/trace``.
        key: the API key. Defaults to ``None`` (a ``--no-auth`` server).
        timeout: socket timeout in seconds. Defaults to ``60.0``.

    Returns:
        The records, in the server's order.

    Raises:
        ConfigError: ``url`` is not ``http(s)://``.
        DataFileError: the server answers an error or cannot be reached.

    Examples:
        >>> fetch_records("ftp://host/trace")
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: a trace URL must be http(s)://host:port/..., got 'ftp://host/trace'
    """
    from datamill.core.errors import ConfigError

    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"a trace URL must be http(s)://host:port/..., got {url!r}")
    query = dict(urllib.parse.parse_qsl(parts.query))
    out: list[dict[str, Any]] = []
    while True:
        page = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
        doc: dict[str, Any] = _get(page, key, timeout)
        if doc.get("format") != RECORDS_FORMAT:
            return [doc]
        out += doc["records"]
        if doc.get("next_epoch") is None:
            return out
        query["from_epoch"] = str(doc["next_epoch"])
