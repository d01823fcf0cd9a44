"""YAML (and JSON) config text to Python objects, refusing duplicate keys.

YAML's own rule is "the last key wins", so a config with ``input_features:`` twice silently loses
the first list. :func:`load_yaml` uses a PyYAML ``SafeLoader`` whose mapping constructor raises a
:class:`~datamill.core.errors.ConfigError` naming the key and both lines instead; :func:`load_json`
does the same for JSON objects. A config model's validation error is located in that text by
:func:`field_path` (the field as the config spells it) and :func:`line_of` (its line).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import yaml

from datamill.core.errors import ConfigError

__all__ = ["field_path", "line_of", "load_json", "load_yaml"]


class _UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML has no type information here
    """A SafeLoader whose mappings refuse a key given twice (at any depth)."""


def _construct_mapping(
    loader: _UniqueKeyLoader, node: yaml.MappingNode, *, deep: bool = False
) -> dict[Any, Any]:
    loader.flatten_mapping(
        node
    )  # resolves merge keys (<<) first: an override through a merge is allowed
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: the base constructor reports it
            break
        line = key_node.start_mark.line + 1
        if first is not None:
            raise ConfigError(
                f"duplicate key {key!r} on line {line} (first on line {first}); YAML would keep "
                "only "
                "the last one",
                line=line,
                column=str(key),
                hint="merge the two entries into one, or rename one of them",
            )
        seen[key] = line
    mapping: dict[Any, Any] = loader.construct_mapping(node, deep=deep)
    return mapping


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(text: str, *, path: str | os.PathLike[str] | None = None) -> Any:
    """Parse YAML text; a duplicate key or a syntax error is a :class:`ConfigError` naming file and
    line.

    Examples:
        >>> load_yaml("a: 1\\nb: [2, 3]\\n")
        {'a': 1, 'b': [2, 3]}
        >>> load_yaml("x:\\n  a: 1\\n  a: 2\\n", path="c.yaml")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: c.yaml, line 3, column "a": duplicate key 'a' on line 3
        (first on line 2); ...
    """
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except ConfigError as exc:
        raise ConfigError(
            exc.msg, path=path, line=exc.line, column=exc.column, hint=exc.hint
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(
            f"cannot parse the YAML: {' '.join(str(exc).split())}",
            path=path,
            line=None if mark is None else mark.line + 1,
        ) from exc


def load_json(text: str, *, path: str | os.PathLike[str] | None = None) -> Any:
    """Parse JSON text; a key given twice in one object is a :class:`ConfigError`.

    Examples:
        >>> load_json('{"a": 1, "a": 2}', path="c.json")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.ConfigError: c.json, column "a": duplicate key 'a' in one JSON object;
        ...
    """

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise ConfigError(
                    f"duplicate key {k!r} in one JSON object; JSON readers keep only the last one",
                    path=path,
                    column=k,
                    hint="merge the two entries into one",
                )
            out[k] = v
        return out

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(
            f"cannot parse the JSON: {exc}", path=path, line=getattr(exc, "lineno", None)
        ) from exc


def field_path(loc: Sequence[int | str], prefix: str = "") -> str:
    """A field's path (a validation error's ``loc``) as a config spells it, after ``prefix``.

    Examples:
        >>> field_path(["input_features", 0, "name"]), field_path([2], "features")
        ('input_features[0].name', 'features[2]')
    """
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def line_of(text: str, loc: Sequence[int | str]) -> int | None:
    """The 1-based line of a field path in YAML (or JSON) text: the line of the deepest part found
    (a mapping's key, a sequence's item), ``None`` when the text does not parse.

    Examples:
        >>> line_of("roots: [data]\\nlimits:\\n  - 1\\n  - x\\n", ["limits", 1])
        4
        >>> line_of("a: 1\\n", ["b"])
        1
    """
    try:
        node: Any = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        if node is None:
            break
        line, items, mark = node.start_mark.line + 1, getattr(node, "value", None), None
        if not isinstance(items, list):
            node = None
        elif isinstance(part, int) and part < len(items) and not isinstance(items[0], tuple):
            node = mark = items[part]  # an item of a sequence
        else:  # a key of a mapping: the key's line
            mark, node = next(((k, v) for k, v in items if k.value == str(part)), (None, None))
        line = line if mark is None else mark.start_mark.line + 1
    return line
