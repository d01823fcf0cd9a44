"""datamill: raw datasets to training-ready tensors, fast.

The top level re-exports one verb per job; heavy modules are imported lazily on first use so that
``import datamill`` stays fast and never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

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

# public name -> module that defines it (imported on first access)
_LAZY = {
    "Vocab": "datamill.vocab",
    "preprocess": "datamill.preprocessing.api",
    "load": "datamill.preprocessing.api",
    "build_vocab": "datamill.text",
    "build_skipgram": "datamill.pretrain.word2vec",
    "build_bert_samples": "datamill.pretrain.bert",
    "ShardsetDataset": "datamill.shards",
    "Loader": "datamill.loader",
}

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
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'datamill' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
