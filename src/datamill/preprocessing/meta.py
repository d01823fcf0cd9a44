"""The ``<stem>.meta.json`` document and the :class:`Metadata` object that decodes ids back to
strings.

Shape (Ludwig-like: one entry per feature at the top level, plus a ``datamill`` header)::

    {"datamill": {"format": "datamill.preprocess/1", "version": ..., "fingerprint": ...,
                  "input_fingerprint": ..., "config_fingerprint": ..., "config": {...},
                  "num_rows": n, "hdf5": {"size": ..., "mtime_ns": ..., "run_id": ...},
                  "split": {...}},
     "MSZoning": {"type": "category", "column": "MSZoning", "hdf5_keys": ["MSZoning"],
                  "idx2str": [...], "str2idx": {...}, "str2freq": {...}, "vocab_size": 6,
                  "preprocessing": {"most_common": 10000,
                                    "missing_value_strategy": "fill_with_const",
                                    "computed_fill_value": "<UNK>", ...}},
     "LotArea": {"type": "number", "mean": ..., "std": ..., "normalization": "zscore", ...}}
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from datamill.core.constants import META_FORMAT
from datamill.core.errors import CacheError, ConfigError
from datamill.vocab import Vocab

__all__ = ["HEADER", "Metadata", "read_meta"]

HEADER = "datamill"


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a meta.json (CacheError when unreadable or not ours)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError as exc:
        raise CacheError("metadata file not found", path=path) from exc
    except (OSError, ValueError) as exc:
        raise CacheError(f"cannot read metadata: {exc}", path=path) from exc
    if (
        not isinstance(data, dict)
        or not isinstance(data.get(HEADER), dict)
        or data[HEADER].get("format") != META_FORMAT
    ):
        raise CacheError(
            f"not a datamill preprocessing metadata file (expected format {META_FORMAT})", path=path
        )
    return data


class Metadata(Mapping[str, dict[str, Any]]):
    """Per-feature metadata (``meta["MSZoning"]["idx2str"]``) with decoding helpers.

    Examples:
        >>> m = Metadata({"datamill": {"format": "datamill.preprocess/1"},
        ...               "color": {"type": "category", "idx2str": ["<UNK>", "red", "blue"]}})
        >>> m.features, m.decode("color", [1, 2, 0]).tolist()
        (['color'], ['red', 'blue', '<UNK>'])
    """

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self._vocabs: dict[tuple[str, str | None], Vocab] = {}

    @property
    def header(self) -> dict[str, Any]:
        """The ``datamill`` section (format, version, fingerprints, config, row count)."""
        header: dict[str, Any] = self.data.get(HEADER, {})
        return header

    @property
    def features(self) -> list[str]:
        """Feature names in config order."""
        return [k for k in self.data if k != HEADER]

    def __getitem__(self, name: str) -> dict[str, Any]:
        if name == HEADER or name not in self.data:
            raise KeyError(name)
        value: dict[str, Any] = self.data[name]
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self.features)

    def __len__(self) -> int:
        return len(self.features)

    def __repr__(self) -> str:
        return f"Metadata(features={self.features})"

    def _locate(self, key: str) -> tuple[str, str | None]:
        """(feature, sub-representation) of a feature name or HDF5 key such as ``review_word``."""
        if key in self.features:
            return key, None
        for name in self.features:
            if key in self.data[name].get("hdf5_keys", ()):
                return name, key[len(name) + 1 :] if key.startswith(name + "_") else key
        raise KeyError(f"no feature or HDF5 key {key!r}; features: {self.features}")

    def vocab(self, key: str) -> Vocab:
        """The :class:`~datamill.vocab.Vocab` of a feature (or of a text key like
        ``review_word``)."""
        name, sub = self._locate(key)
        if (name, sub) not in self._vocabs:
            m = self.data[name]
            if sub is not None and isinstance(m.get(sub), dict) and "idx2str" in m[sub]:
                m = m[sub]
            elif sub is not None and f"{sub}_idx2str" in m:
                m = {"idx2str": m[f"{sub}_idx2str"], "unk_token": m.get(f"{sub}_unk_token")}
            if "idx2str" not in m:
                raise ConfigError(
                    f"feature {name!r} ({self.data[name].get('type')}) has no vocabulary"
                )
            self._vocabs[(name, sub)] = Vocab.from_dict(m)
        return self._vocabs[(name, sub)]

    def decode(self, key: str, ids: Any) -> np.ndarray[Any, Any]:
        """Strings for ids (any shape); binary features decode bools to their labels."""
        name, _ = self._locate(key)
        m = self.data[name]
        if m.get("type") == "binary":
            labels = np.asarray(m.get("bool2str", ["false", "true"]), dtype=object)
            return labels[np.asarray(ids).astype(np.int64)]
        return self.vocab(key).decode(ids)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document."""
        return self.data
