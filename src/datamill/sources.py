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

from datamill.core.errors import DataFileError, DataFileNotFoundError
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


def open_source(path: str | os.PathLike[str]) -> Source:
    """Open a datamill output as a Source: the first registered format whose marker matches.

    Shardset dataset folders (``dataset.json``), LM corpus folders (``corpus.json``), ``.hdf5``
    files, BERT/word2vec outputs and Parquet files or folders.

    Raises:
        DataFileNotFoundError: nothing there. DataFileError: no registered format matches.

    Examples:
        >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> p = Path(tempfile.mkdtemp()) / "t.parquet"
        >>> pq.write_table(pa.table({"x": [1, 2]}), p)
        >>> type(open_source(p)).__name__
        'ParquetSource'
    """
    p = Path(path)
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
