"""``datamill.sources``: the public path of the loader's Source registry,
:mod:`datamill.loader.sources`.

``open_source(path)`` and every Source class, re-exported from there (the classes load on first
use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from datamill.loader.sources import PROVIDERS, open_source

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


def __getattr__(name: str) -> Any:
    """The Source classes, from :mod:`datamill.loader.sources` (loaded on first use)."""
    from datamill.loader import sources

    return getattr(sources, name)
