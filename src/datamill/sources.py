"""``open_source(path)``: the right :class:`~datamill.core.source.Source` for any datamill output.

Each capability registers how its output is recognised and opened
(:func:`datamill.core.source.register_source`) in its public source module; :data:`PROVIDERS` lists
those modules, imported on the first call, so consumers (the loader, the server) never import a
producer's internals and producers never import consumers.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from datamill.core.checks import check_path
from datamill.core.constants import DATASET_MANIFEST
from datamill.core.errors import DataFileError, DataFileNotFoundError
from datamill.core.objstore import is_remote, s3_filesystem, split_url, store_error
from datamill.core.source import Source, registered_sources

if TYPE_CHECKING:
    from datamill.core.parquet import ParquetSource
    from datamill.core.source import TableSource
    from datamill.preprocessing.hdf5 import HDF5Source
    from datamill.pretrain.sources import BertParquetSource
    from datamill.shards.dataset import ShardsetDataset
    from datamill.text.source import CorpusSource

__all__ = [  # noqa: RUF022 - Python sorted() order, as every module
    "BertParquetSource",
    "CorpusSource",
    "HDF5Source",
    "PROVIDERS",
    "ParquetSource",
    "ShardsetDataset",
    "TableSource",
    "open_source",
]

PROVIDERS = (
    "datamill.core.parquet",
    "datamill.preprocessing.hdf5",
    "datamill.pretrain.sources",
    "datamill.shards.dataset",
    "datamill.text.source",
)
"""Modules that register a source opener when imported."""


def open_source(path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None,
                cache_limit: int | None = None, filesystem: pafs.FileSystem | None = None) -> Source:
    """Open a datamill output as a Source: the first registered format whose marker matches.

    Shardset dataset folders (``dataset.json``), LM corpus folders (``corpus.json``), ``.hdf5``
    files, BERT/word2vec outputs and Parquet files or folders. On object storage (``s3://``): a
    prefix holding ``dataset.json`` is a :class:`ShardsetDataset`, any other prefix or object is read
    as Parquet (:class:`~datamill.loader.remote.RemoteParquetSource`); both download shard files
    into a checked local cache.

    Args:
        path: a local path or ``s3://bucket/prefix``.
        cache_dir: ``s3://`` only: the local shard cache folder. Defaults to ``None``
            (:func:`~datamill.core.objstore.default_cache_dir`).
        cache_limit: ``s3://`` only: bytes the cache keeps at most. Defaults to ``None`` (no limit).
        filesystem: ``s3://`` only: the filesystem. Defaults to ``None``
            (:func:`~datamill.core.objstore.s3_filesystem`, from the ``AWS_*`` variables).

    Raises:
        DataFileNotFoundError: nothing there. DataFileError: no registered format matches, or the
        object store refused (bad credentials, unreachable endpoint).

    Examples:
        >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> p = Path(tempfile.mkdtemp()) / "t.parquet"
        >>> pq.write_table(pa.table({"x": [1, 2]}), p)
        >>> type(open_source(p)).__name__
        'ParquetSource'
    """
    if is_remote(path):
        return _open_remote(os.fspath(path), cache_dir=cache_dir, cache_limit=cache_limit, filesystem=filesystem)
    p = Path(check_path(path, name="the source path"))
    if not p.exists():
        raise DataFileNotFoundError("no such file or folder", path=p)
    for module in PROVIDERS:
        importlib.import_module(module)
    for entry in registered_sources().values():
        if entry.marker(p):
            return entry.opener(p)
    raise DataFileError("not a source datamill reads", path=p,
                        hint="pass a shardset dataset folder, a corpus folder, a .hdf5 file or a Parquet file/folder; "
                             f"registered formats: {', '.join(registered_sources())}")


def _open_remote(url: str, *, cache_dir: str | os.PathLike[str] | None, cache_limit: int | None,
                 filesystem: pafs.FileSystem | None) -> Source:
    """``s3://``: a shardset dataset when ``dataset.json`` is there, else Parquet objects."""
    fs = filesystem if filesystem is not None else s3_filesystem()
    try:
        manifest = fs.get_file_info(f"{split_url(url)}/{DATASET_MANIFEST}")
    except OSError as exc:
        raise store_error(exc, url) from exc
    source: Source
    if manifest.type == pafs.FileType.File:
        dataset = importlib.import_module("datamill.shards.dataset")
        source = dataset.ShardsetDataset(url, cache_dir=cache_dir, cache_limit=cache_limit, filesystem=fs)
    else:
        remote = importlib.import_module("datamill.loader.remote")
        source = remote.RemoteParquetSource(url, cache_dir=cache_dir, cache_limit=cache_limit, filesystem=fs)
    return source


_CLASSES = {
    "BertParquetSource": "datamill.pretrain.sources",
    "CorpusSource": "datamill.text.source",
    "HDF5Source": "datamill.preprocessing.hdf5",
    "ParquetSource": "datamill.core.parquet",
    "ShardsetDataset": "datamill.shards.dataset",
    "TableSource": "datamill.core.source",
}


def __getattr__(name: str) -> Any:
    """Every Source class, importable from here (loaded on first use)."""
    if name in _CLASSES:
        return getattr(importlib.import_module(_CLASSES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
