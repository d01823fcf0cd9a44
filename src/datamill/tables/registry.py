"""How the table formats are recognised and opened (imported by the loader's Source registry,
:data:`datamill.loader.sources.PROVIDERS`).

* a folder: a Delta table (``_delta_log/``), a Lance dataset (``_versions/``), an Iceberg table
  location (``metadata/*.metadata.json``): the latest version;
* a version file: ``_delta_log/<N>.json`` (Delta version ``N``), ``_versions/<N>.manifest``
  (Lance version ``N``), ``<...>.metadata.json`` (that Iceberg metadata's current snapshot): a
  pinned version that is a plain path, so ``datamill serve`` can register it;
* a table URL (:func:`~datamill.tables.common.parse_table_url`): ``delta:///path?version=3``,
  ``iceberg+s3://bucket/warehouse/db/table?snapshot_id=5``, ``lance://data/t.lance``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from datamill.core.source import Source, register_source, register_url_source
from datamill.tables.common import TABLE_KINDS, lance_version_of, parse_table_url

__all__ = ["lance_version_of", "open_table", "open_table_url", "pin_table_folder"]


def _is_delta_version(p: Path) -> bool:
    return p.parent.name == "_delta_log" and p.suffix == ".json" and p.stem.isdigit()


def _is_lance_version(p: Path) -> bool:
    return p.parent.name == "_versions" and p.suffix == ".manifest" and p.stem.isdigit()


def _is_iceberg_table(p: Path) -> bool:
    return p.is_dir() and any((p / "metadata").glob("*.metadata.json"))


def open_table(path: Path) -> Source:
    """The table at a local folder or version file (see the module docstring)."""
    if _is_delta_version(path):
        return open_table_url(f"delta://{path.parent.parent}?version={int(path.stem)}")
    if _is_lance_version(path):
        return open_table_url(f"lance://{path.parent.parent}?version={lance_version_of(path)}")
    if path.name.endswith(".metadata.json") or _is_iceberg_table(path):
        return open_table_url(f"iceberg://{path}")
    if (path / "_delta_log").is_dir():
        return open_table_url(f"delta://{path}")
    return open_table_url(f"lance://{path}")


def open_table_url(
    url: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
    filesystem: Any = None,
) -> Source:
    """Open a table URL (:func:`~datamill.tables.common.parse_table_url`) as its Source.

    Examples:
        >>> import tempfile, deltalake, pyarrow as pa
        >>> path = tempfile.mkdtemp()
        >>> deltalake.write_deltalake(path, pa.table({"x": [1, 2, 3]}))
        >>> open_table_url(f"delta://{path}?version=0")  # doctest: +ELLIPSIS
        DeltaSource('...', version=0, shards=1, rows=3)
    """
    t = parse_table_url(os.fspath(url))
    kw: dict[str, Any] = {
        "cache_dir": cache_dir,
        "cache_limit": cache_limit,
        "uid_column": t.uid_column,
    }
    if t.kind == "delta":
        from datamill.tables.delta import DeltaSource

        return DeltaSource(t.location, version=t.version, filesystem=filesystem, **kw)
    if t.kind == "iceberg":
        from datamill.tables.iceberg import IcebergSource

        return IcebergSource(t.location, snapshot_id=t.version, filesystem=filesystem, **kw)
    from datamill.tables.lance import LanceSource

    lance: Source = LanceSource(t.location, version=t.version, **kw)
    return lance


def _marker(p: Path) -> bool:
    if p.is_file():
        return _is_delta_version(p) or _is_lance_version(p) or p.name.endswith(".metadata.json")
    return (p / "_delta_log").is_dir() or (p / "_versions").is_dir() or _is_iceberg_table(p)


register_source("table", marker=_marker, opener=open_table, priority=10)
for _kind in TABLE_KINDS:
    register_url_source(_kind, opener=open_table_url)


def pin_table_folder(path: Path) -> Path | None:
    """The file that pins the current version of the local table folder ``path`` (Delta: its
    newest ``_delta_log/N.json``; Lance: its newest ``_versions/*.manifest``; Iceberg: its newest
    ``metadata/*.metadata.json``), or ``None`` when ``path`` is not a table folder (a version file
    is pinned already). ``datamill serve`` registers this file, so the server, its build workers
    and direct clients all read one version however the table changes after registration.

    Examples:
        >>> import tempfile, deltalake, pyarrow as pa
        >>> path = Path(tempfile.mkdtemp())
        >>> deltalake.write_deltalake(path, pa.table({"x": [1]}))
        >>> deltalake.write_deltalake(path, pa.table({"x": [2]}), mode="append")
        >>> pin_table_folder(path).name
        '00000000000000000001.json'
        >>> pin_table_folder(path / "_delta_log" / "00000000000000000001.json") is None
        True
    """
    if not path.is_dir():
        return None
    if (path / "_delta_log").is_dir():
        logs = [p for p in (path / "_delta_log").glob("*.json") if _is_delta_version(p)]
        return max(logs, key=lambda p: int(p.stem)) if logs else None
    if (path / "_versions").is_dir():
        manifests = [p for p in (path / "_versions").glob("*.manifest") if _is_lance_version(p)]
        return max(manifests, key=lance_version_of) if manifests else None
    if _is_iceberg_table(path):
        from datamill.core.storage import filesystem_for
        from datamill.tables.iceberg import latest_metadata

        fs, root = filesystem_for(os.fspath(path))
        return Path(latest_metadata(os.fspath(path), fs, root))
    return None
