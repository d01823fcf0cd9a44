"""datamill: raw datasets to training-ready tensors, fast.

The top level re-exports one verb per job; heavy modules are imported lazily on first use so that
``import datamill`` stays fast and never imports torch.
"""

from __future__ import annotations

from typing import Any

from datamill.core.constants import VERSION as __version__
from datamill.core.errors import (
    CacheError,
    ConfigError,
    DataFileError,
    DataFileNotFoundError,
    DatamillError,
    MissingExtraError,
    ResumeStateError,
    SchemaError,
    ShardsetError,
)

__all__ = [
    "CacheError",
    "ConfigError",
    "DataFileError",
    "DataFileNotFoundError",
    "DatamillError",
    "Loader",
    "MissingExtraError",
    "ResumeStateError",
    "SchemaError",
    "ShardsetDataset",
    "ShardsetError",
    "Vocab",
    "__version__",
    "build_bert_samples",
    "build_skipgram",
    "build_vocab",
    "load",
    "preprocess",
]
assert sorted(__all__) == __all__


def __getattr__(name: str) -> Any:
    """The heavier public names, imported on first access (plain imports: the import graph sees
    them)."""
    match name:
        case "Vocab":
            from datamill.vocab import Vocab

            return _keep(Vocab)
        case "preprocess":
            from datamill.preprocessing.api import preprocess

            return _keep(preprocess)
        case "load":
            from datamill.preprocessing.api import load

            return _keep(load)
        case "build_vocab":
            from datamill.text import build_vocab

            return _keep(build_vocab)
        case "build_skipgram":
            from datamill.pretrain.word2vec import build_skipgram

            return _keep(build_skipgram)
        case "build_bert_samples":
            from datamill.pretrain.bert import build_bert_samples

            return _keep(build_bert_samples)
        case "ShardsetDataset":
            from datamill.shards import ShardsetDataset

            return _keep(ShardsetDataset)
        case "Loader":
            from datamill.loader import Loader

            return _keep(Loader)
        case _:
            raise AttributeError(f"module 'datamill' has no attribute {name!r}")


def _keep(value: Any) -> Any:
    globals()[value.__name__] = value  # later accesses skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
