"""The server's structured log: one line per event, as ``text`` or ``json`` (``--log-format``), for
its events (:func:`event`, logger ``datamill.serve``) and uvicorn's alike; ``docs/running.md``
shows both.

Examples:
    >>> import logging
    >>> rec = logging.LogRecord(
    ...     "datamill.serve.events", logging.INFO, __file__, 1, "client gone", None, None
    ... )
    >>> rec.fields = {"client": "c1"}
    >>> JsonFormatter().format(rec).endswith('"event": "client gone", "client": "c1"}')
    True
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "WAIT_NOTE",
    "JsonFormatter",
    "TextFormatter",
    "event",
    "log_config",
    "logger",
]

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
logger = logging.getLogger(__name__.rpartition(".")[0])
"""The server's event logger, named after its package (``datamill.serve``)."""


WAIT_NOTE = "wait: other clients hold the rest for now (normal; the client asks again)"
"""What the access log adds to a ``409`` of ``GET .../next``."""


def event(name: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event ``name`` with ``fields`` (values made JSON-safe by ``str`` when needed)."""
    if logger.isEnabledFor(level):
        logger.log(level, name, extra={"fields": fields})


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields: dict[str, Any] = dict(getattr(record, "fields", None) or {})
    if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
        client, method, path, http, status = record.args
        fields = {"client": client, "method": method, "path": path, "http": http, "status": status}
        if status == 409 and str(path).split("?")[0].endswith("/next"):
            fields["note"] = WAIT_NOTE  # the normal wait of a client, not an error
    return fields


def _message(record: logging.LogRecord) -> str:
    if record.name == "uvicorn.access" and "fields" not in record.__dict__:
        return "request"
    return record.getMessage()


def _stamp(record: logging.LogRecord) -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{record.msecs:03.0f}Z"
    )


class TextFormatter(logging.Formatter):
    """``TIME LEVEL event key=value ...`` (values with spaces quoted)."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [_stamp(record), record.levelname, _message(record)]
        for k, v in _fields(record).items():
            text = str(v)
            parts.append(f"{k}={json.dumps(text) if (' ' in text or not text) else text}")
        if record.exc_info:
            parts.append("\n" + self.formatException(record.exc_info))
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time``, ``level``, ``event``, then the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"time": _stamp(record), "level": record.levelname}
        out["event"] = _message(record)
        for k, v in _fields(record).items():
            out.setdefault(
                k, v if isinstance(v, (str, int, float, bool, type(None), list, dict)) else str(v)
            )
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def log_config(*, fmt: str = "text", level: str = "info") -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` for the server and uvicorn (pass it as uvicorn's
    ``log_config``).

    Raises:
        ValueError: an unknown format or level.
    """
    if fmt not in LOG_FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; expected one of {', '.join(LOG_FORMATS)}")
    if level not in LOG_LEVELS:
        raise ValueError(f"unknown log level {level!r}; expected one of {', '.join(LOG_LEVELS)}")
    cls = JsonFormatter if fmt == "json" else TextFormatter
    lvl = level.upper()
    handler = {"class": "logging.StreamHandler", "formatter": "line", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"line": {"()": cls}},
        "handlers": {"line": handler},
        "loggers": {
            name: {"handlers": ["line"], "level": lvl, "propagate": False}
            for name in (logger.name, "uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }
