"""Checking a ``meta.json`` being applied (``preprocess(..., metadata=...)``) against the config.

A metadata file from another config, or one edited by hand, must fail before anything is
transformed, naming the metadata file and the feature: a feature missing from the metadata, a
different type, or statistics/vocabularies of the wrong shape (a string ``mean``, non-integer ids,
a ``vocab_size`` that is not the vocabulary's length).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from datamill.core.errors import ConfigError, DataFileError
from datamill.preprocessing.config import ResolvedFeature

__all__ = ["check_applied"]

_NUMBER_STATS = ("mean", "std", "min", "max", "count", "q1", "q3", "median", "iqr")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_applied(
    applied: dict[str, Any], features: Sequence[ResolvedFeature], *, path: str
) -> None:
    """Raise unless every configured feature is in ``applied`` with the same type and well-formed
    values.

    Raises:
        ConfigError: a feature is missing or has another type (``path`` and ``column`` set).
        DataFileError: a statistic or vocabulary of the wrong shape (``path`` and ``column`` set).

    Examples:
        >>> from datamill.preprocessing.config import load_config, resolve_features
        >>> cfg, _ = load_config({"input_features": [{"name": "x", "type": "number"}]})
        >>> check_applied({"x": {"type": "category"}}, resolve_features(cfg), path="m.meta.json")
        ... # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: m.meta.json, column "x": the config says type number, the
        metadata says category...
    """
    for f in features:
        if f.name not in applied:
            raise ConfigError(
                f"feature {f.name!r} is not in the metadata being applied",
                path=path,
                column=f.name,
                hint="use the config the metadata was made with",
            )
        m = applied[f.name]
        if not isinstance(m, dict):
            raise DataFileError(
                f"expected an object for feature {f.name!r}, got {type(m).__name__}",
                path=path,
                column=f.name,
                hint="re-create the metadata with `datamill preprocess`",
            )
        if m.get("type") != f.type:
            raise ConfigError(
                f"the config says type {f.type}, the metadata says {m.get('type')}",
                path=path,
                column=f.name,
                hint="use the config the metadata was made with",
            )
        _check_values(m, f.name, path)


def _check_values(m: dict[str, Any], name: str, path: str) -> None:
    bad = partial(_damaged, path=path, name=name)
    for key in _NUMBER_STATS:
        if (
            key in m
            and m[key] is not None
            and not (_is_number(m[key]) and not math.isnan(float(m[key])))
        ):
            raise bad(f"{key!r} must be a number, got {m[key]!r}")
    for key, value in m.items():
        if key.endswith("idx2str") and key != "str2idx":
            _check_vocab(m, key, value, bad)


def _damaged(what: str, *, path: str, name: str) -> DataFileError:
    return DataFileError(
        what,
        path=path,
        column=name,
        hint="the metadata was edited or damaged; re-create it with `datamill preprocess`",
    )


def _check_vocab(
    m: dict[str, Any], key: str, value: Any, bad: Callable[[str], DataFileError]
) -> None:
    """The vocabulary ``m[key]`` (an ``idx2str``) is a list of strings that agrees with its
    ``vocab_size`` and ``str2idx``."""
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise bad(f"{key!r} must be a list of strings")
    prefix = key[: -len("idx2str")]
    size = m.get(prefix + "vocab_size")
    if size is not None and (not _is_number(size) or int(size) != len(value)):
        raise bad(f"{prefix}vocab_size is {size!r} but {key!r} has {len(value)} entries")
    ids = m.get(prefix + "str2idx")
    if ids is None:
        return
    if not isinstance(ids, dict) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids.values()
    ):
        raise bad(f"{prefix}str2idx must map tokens to integer ids")
    if any(not 0 <= i < len(value) or value[i] != t for t, i in ids.items()):
        raise bad(f"{prefix}str2idx does not match {key!r} (ids out of range or swapped)")
