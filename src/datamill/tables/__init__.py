"""Train straight from table formats: Delta Lake, Apache Iceberg and Lance snapshots as Sources.

:class:`DeltaSource`, :class:`IcebergSource` and :class:`LanceSource` each read one version of a
table (the latest when none is given, resolved once when the source opens), so a resume reads the
same rows after the table was appended to, overwritten or compacted; the version is part of the
fingerprint, hence of every resume state, run record and served iteration
(:func:`pinned_version` reads it back). ``open_source`` opens them from a table folder, a version
file (a pinned version: ``_delta_log/00000000000000000003.json``, ``metadata/v3.metadata.json``,
``_versions/3.manifest``) or a table URL (``delta:///path?version=3``, ``iceberg+s3://...``).
See ``docs/tables.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from datamill.tables.common import TABLE_KINDS, parse_table_url, pinned_version

if TYPE_CHECKING:
    from datamill.tables.delta import DeltaSource
    from datamill.tables.iceberg import IcebergSource
    from datamill.tables.lance import LanceSource

__all__ = [
    "TABLE_KINDS",
    "DeltaSource",
    "IcebergSource",
    "LanceSource",
    "parse_table_url",
    "pinned_version",
]


def __getattr__(name: str) -> Any:
    """The Source classes (their format's library loads on first use)."""
    if name == "DeltaSource":
        from datamill.tables.delta import DeltaSource

        return DeltaSource
    if name == "IcebergSource":
        from datamill.tables.iceberg import IcebergSource

        return IcebergSource
    if name == "LanceSource":
        from datamill.tables.lance import LanceSource

        return LanceSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
