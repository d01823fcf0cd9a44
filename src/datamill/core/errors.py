"""The DatamillError family.

Every error a user can cause is a :class:`DatamillError`. Each subclass also inherits the matching
builtin (``ValueError``, ``FileNotFoundError``...) so code that catches builtins keeps working.
Location is kept as attributes (``path``, ``line``, ``row``, ``column``, ``uid``, ``shard``) and is
repeated at the start of the message, e.g. ``train.csv, line 1,205, column "age": expected ...``.
``line`` is 1-based (CSV, JSONL, text: what an editor shows); ``row`` is 0-based (Parquet, HDF5).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "BuildError",
    "CacheError",
    "ConfigError",
    "DataFileError",
    "DataFileNotFoundError",
    "DatamillError",
    "MissingExtraError",
    "NotFoundError",
    "OutputError",
    "ResumeStateError",
    "SchemaError",
    "ShardsetError",
    "format_location",
]


def format_location(
    path: str | os.PathLike[str] | None = None,
    *,
    line: int | None = None,
    row: int | None = None,
    column: str | None = None,
    uid: Any = None,
    shard: str | int | None = None,
) -> str:
    """Return ``'file.csv, line 12, column "age": '`` (empty string when nothing is known)."""
    parts: list[str] = []
    if path is not None:
        parts.append(os.fspath(path))
    if shard is not None and not isinstance(shard, str):
        parts.append(f"shard {shard}")
    elif shard is not None:
        parts.append(shard)
    if line is not None:
        parts.append(f"line {line:,}")
    if row is not None:
        parts.append(f"row {row:,}")
    if column is not None:
        parts.append(f'column "{column}"')
    if uid is not None:
        parts.append(f"uid {uid!r}")
    return ", ".join(parts) + ": " if parts else ""


class DatamillError(Exception):
    """Root of every error datamill raises on purpose.

    Args:
        msg: what went wrong (what was expected, what was found).
        path: the file or folder concerned. Defaults to ``None``.
        line: 1-based line number (text formats). Defaults to ``None``.
        row: 0-based row number (columnar formats). Defaults to ``None``.
        column: the column or feature name. Defaults to ``None``.
        uid: the sample UID. Defaults to ``None``.
        shard: the shard (index or file name). Defaults to ``None``.
        hint: how to fix it; printed on a second line. Defaults to ``None``.

    Examples:
        >>> err = DataFileError(
        ...     "expected a number, got 'n/a'", path="train.csv", line=3, column="age"
        ... )
        >>> str(err)
        'train.csv, line 3, column "age": expected a number, got \\'n/a\\''
        >>> isinstance(err, ValueError), err.line
        (True, 3)
    """

    def __init__(
        self,
        msg: str,
        *,
        path: str | os.PathLike[str] | None = None,
        line: int | None = None,
        row: int | None = None,
        column: str | None = None,
        uid: Any = None,
        shard: str | int | None = None,
        hint: str | None = None,
    ) -> None:
        self.path = os.fspath(path) if path is not None else None
        self.line, self.row, self.column = line, row, column
        self.uid, self.shard, self.hint = uid, shard, hint
        self.msg = msg
        where = format_location(path, line=line, row=row, column=column, uid=uid, shard=shard)
        super().__init__(where + msg + (f"\n  Fix: {hint}" if hint else ""))

    def one_line(self) -> str:
        """The message on a single line, as the CLI prints it."""
        return " ".join(str(self).split())


class ConfigError(DatamillError, ValueError):
    """A configuration (YAML/JSON/keyword arguments) is invalid."""


class SchemaError(DatamillError, ValueError):
    """Data does not match the declared schema (a missing column, a wrong type)."""


class DataFileError(DatamillError, ValueError):
    """A data file cannot be read or has content that cannot be parsed."""


class DataFileNotFoundError(DatamillError, FileNotFoundError):
    """A data file (or a zip member) does not exist."""


class NotFoundError(DatamillError, LookupError):
    """An unknown name, UID or row (a dataset, iteration, key or sample; HTTP 404 on a server)."""


class ShardsetError(DatamillError, ValueError):
    """A shardset dataset violates its constraints (mapping, UIDs, manifest)."""


class ResumeStateError(DatamillError, ValueError):
    """A saved iteration state does not fit the current loader or dataset."""


class BuildError(DatamillError, RuntimeError):
    """Batches could not be built now (their build failed, was stopped or stalled); a server answers
    503, so a client retries."""


class CacheError(DatamillError, RuntimeError):
    """A cache or metadata file is unusable (corrupt, incompatible version)."""


class MissingExtraError(DatamillError, ImportError):
    """An optional dependency (an extra such as ``torch`` or ``ray``) is not installed."""


class OutputError(DatamillError, OSError):
    """An output cannot be written: the disk is full, a file size limit was hit, or no permission.

    The previous output at the path, if any, is left as it was.
    """
