"""The loader's Source registry: ``open_source(path)``, the right
:class:`~datamill.core.source.Source` for any output.

Each capability registers how its output is recognised and opened
(:func:`datamill.core.source.register_source`) in its public source module; :data:`PROVIDERS` lists
those modules, imported on the first call, so consumers (the loader, the server) never import a
producer's internals and producers never import consumers. :data:`PROVIDERS` is one of the
registries whose module paths the architecture test follows as import edges. ``datamill.sources``
re-exports this module (its public path).
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from datamill.core.checks import check_path
from datamill.core.constants import DATASET_MANIFEST
from datamill.core.errors import DataFileError, DataFileNotFoundError
from datamill.core.source import Source, registered_sources, url_source
from datamill.core.storage import SCHEMES, filesystem_for, is_remote, local_path, storage_error

if TYPE_CHECKING:
    from datamill.core.parquet import ParquetSource
    from datamill.core.source import TableSource
    from datamill.loader.loader import Loader
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
    "read_batches",
]

PROVIDERS = (
    "datamill.core.parquet",
    "datamill.preprocessing.hdf5",
    "datamill.pretrain.sources",
    "datamill.shards.dataset",
    "datamill.tables.registry",
    "datamill.text.source",
)
"""Modules that register a source opener when imported."""


def open_source(
    path: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
    filesystem: pafs.FileSystem | None = None,
) -> Source:
    """Open a datamill output as a Source: the first registered format whose marker matches.

    Shardset dataset folders (``dataset.json``), LM corpus folders (``corpus.json``), ``.hdf5``
    files, BERT/word2vec outputs and Parquet files or folders. On object storage (``s3://``): a
    prefix holding ``dataset.json`` is a :class:`ShardsetDataset`, any other prefix or object is
    read as Parquet (:class:`~datamill.loader.remote.RemoteParquetSource`); both download shard
    files into a checked local cache.

    Args:
        path: a local path, ``file://`` or a remote URL (``s3://bucket/prefix``; any remote scheme
            of :mod:`datamill.core.storage`).
        cache_dir: remote only: the local shard cache folder. Defaults to ``None``
            (:func:`~datamill.core.objstore.default_cache_dir`).
        cache_limit: remote only: bytes the cache keeps at most. Defaults to ``None`` (no limit).
        filesystem: remote only: the filesystem. Defaults to ``None`` (the scheme's,
            :func:`~datamill.core.storage.filesystem_for`; S3 from the ``AWS_*`` variables).

    Raises:
        DataFileNotFoundError: nothing there. DataFileError: no registered format matches, or the
        object store refused (bad credentials, unreachable endpoint).

    Examples:
        >>> import pathlib, tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.parquet"
        >>> pq.write_table(pa.table({"x": [1, 2]}), p)
        >>> type(open_source(p)).__name__
        'ParquetSource'
    """
    for_url = _url_opener(path)
    if for_url is not None:
        opened: Source = for_url(
            path, cache_dir=cache_dir, cache_limit=cache_limit, filesystem=filesystem
        )
        return opened
    if is_remote(path):
        return _open_remote(
            os.fspath(path), cache_dir=cache_dir, cache_limit=cache_limit, filesystem=filesystem
        )
    p = local_path(check_path(path, name="the source path"))
    if not p.exists():
        raise DataFileNotFoundError("no such file or folder", path=p)
    for module in PROVIDERS:
        importlib.import_module(module)
    for entry in registered_sources().values():
        if entry.marker(p):
            return entry.opener(p)
    raise DataFileError(
        "not a source datamill reads",
        path=p,
        hint="pass a shardset dataset folder, a corpus folder, a .hdf5 file or a Parquet "
        "file/folder; "
        f"registered formats: {', '.join(registered_sources())}",
    )


def _url_opener(path: str | os.PathLike[str]) -> Any:
    """The registered opener of a source URL that is not a storage URL (``delta://...``), or
    ``None``."""
    text = os.fspath(path)
    if not isinstance(text, str) or text.partition("://")[0] in SCHEMES or "://" not in text:
        return None
    for module in PROVIDERS:
        importlib.import_module(module)
    return url_source(text)


def _open_remote(
    url: str,
    *,
    cache_dir: str | os.PathLike[str] | None,
    cache_limit: int | None,
    filesystem: pafs.FileSystem | None,
) -> Source:
    """``s3://``: a shardset dataset when ``dataset.json`` is there, else Parquet objects."""
    fs, root = filesystem_for(url, filesystem=filesystem)
    try:
        manifest = fs.get_file_info(f"{root}/{DATASET_MANIFEST}")
    except OSError as exc:
        raise storage_error(exc, url) from exc
    source: Source
    if manifest.type == pafs.FileType.File:
        from datamill.shards.dataset import ShardsetDataset

        source = ShardsetDataset(url, cache_dir=cache_dir, cache_limit=cache_limit, filesystem=fs)
    else:
        from datamill.loader.remote import RemoteParquetSource

        source = RemoteParquetSource(
            url, cache_dir=cache_dir, cache_limit=cache_limit, filesystem=fs
        )
    return source


def read_batches(
    source: str | os.PathLike[str] | Source,
    batch_size: int,
    /,
    *,
    as_torch: bool = False,
    **loader_kwargs: Any,
) -> Loader:
    """A :class:`~datamill.loader.Loader` yielding the source's own padded batches when it has them.

    ``source`` is a Source or a path (opened with :func:`open_source`). A source with a
    ``padded_collate(as_torch=...)`` method (BERT Parquet: ``tokens``, ``segment_ids``,
    ``attention_mask``...; word2vec skip-gram: ``centers``, ``contexts_negatives``, ``masks``,
    ``labels``) gives its padded arrays; any other gets the loader's ``"numpy"``/``"torch"``
    collate. Other keyword arguments (``seed``, ``epoch``, ``rank``, ``world_size``,
    ``batching``...)
    go to the Loader.

    Examples:
        >>> from datamill.pretrain.word2vec import build_skipgram
        >>> s = build_skipgram([["a", "b", "c"]] * 20, min_freq=1, subsample_t=1.0, progress=False)
        >>> b = next(iter(read_batches(s.source(), 4, seed=0)))
        >>> (
        ...     b["centers"].shape,
        ...     b["contexts_negatives"].shape == b["masks"].shape == b["labels"].shape,
        ... )
        ((4, 1), True)
    """
    from datamill.loader.loader import Loader

    src = source if isinstance(source, Source) else open_source(source)
    padded = getattr(src, "padded_collate", None)
    collate = padded(as_torch=as_torch) if callable(padded) else ("torch" if as_torch else "numpy")
    return Loader(src, batch_size, collate=collate, **loader_kwargs)


def __getattr__(name: str) -> Any:
    """Every Source class, importable from here (loaded on first use)."""
    if name == "BertParquetSource":
        from datamill.pretrain.sources import BertParquetSource

        return BertParquetSource
    if name == "CorpusSource":
        from datamill.text.source import CorpusSource

        return CorpusSource
    if name == "HDF5Source":
        from datamill.preprocessing.hdf5 import HDF5Source

        return HDF5Source
    if name == "ParquetSource":
        from datamill.core.parquet import ParquetSource

        return ParquetSource
    if name == "ShardsetDataset":
        from datamill.shards.dataset import ShardsetDataset

        return ShardsetDataset
    if name == "TableSource":
        from datamill.core.source import TableSource

        return TableSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
