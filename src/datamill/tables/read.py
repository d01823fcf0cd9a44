"""A table version as one local Parquet file: how preprocessing reads ``delta://``, ``iceberg://``
and ``lance://`` inputs (through the same Sources as the loader).

:func:`local_copy` opens the URL (:func:`~datamill.tables.registry.open_table_url`), reads every
shard in order and writes them to ``<cache>/tables/<fingerprint>/<table name>.parquet`` (a
temporary file renamed when complete), so the preprocessing cache, keyed by the input's content,
is hit again while the version is the same, and a pinned version (``?version=3``) always reads the
same rows.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from datamill.core.objstore import default_cache_dir
from datamill.tables.common import TABLE_KINDS, parse_table_url

__all__ = ["is_table_url", "local_copy"]


def is_table_url(value: Any) -> bool:
    """Whether ``value`` is a table URL (``delta://``, ``iceberg+s3://``...).

    Examples:
        >>> is_table_url("delta:///data/t"), is_table_url("s3://b/k.csv"), is_table_url(3)
        (True, False, False)
    """
    if not isinstance(value, (str, os.PathLike)):
        return False
    text = os.fspath(value)
    head, sep, _ = str(text).partition("://")
    return bool(sep) and head.partition("+")[0] in TABLE_KINDS


def local_copy(url: str, *, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The table version at ``url`` as a local Parquet file (written once per version).

    Args:
        url: a table URL (:func:`~datamill.tables.common.parse_table_url`).
        cache_dir: where copies go. Defaults to ``None``
            (:func:`~datamill.core.objstore.default_cache_dir`).

    Examples:
        >>> import tempfile, deltalake, pyarrow as pa
        >>> path = tempfile.mkdtemp() + "/reviews"
        >>> deltalake.write_deltalake(path, pa.table({"x": [1, 2, 3]}))
        >>> copy = local_copy(f"delta://{path}", cache_dir=tempfile.mkdtemp())
        >>> copy.name, pq.read_table(copy).num_rows
        ('reviews.parquet', 3)
    """
    from datamill.tables.registry import open_table_url

    source = open_table_url(url, cache_dir=cache_dir)
    name = Path(parse_table_url(url).location.rstrip("/")).name.removesuffix(".lance") or "table"
    if name.endswith(".metadata.json"):
        name = Path(parse_table_url(url).location).parent.parent.name
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = root / "tables" / source.fingerprint() / f"{name}.parquet"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".partial")
    os.close(fd)
    try:
        writer = None
        for k in range(source.num_shards):
            table = source.read_shard(k)
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table)
        if writer is None:
            raise_empty(url)
        assert writer is not None
        writer.close()
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def raise_empty(url: str) -> None:
    """A table version without rows cannot be preprocessed."""
    from datamill.core.errors import DataFileError

    raise DataFileError("the table version has no data files (no rows)", path=url)
