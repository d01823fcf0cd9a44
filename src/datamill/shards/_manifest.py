"""``dataset.json`` validated with pydantic: every problem is a :class:`ShardsetError` naming its
field.

:func:`manifest_problems` returns the problems (``check`` lists them all); :func:`validate_manifest`
raises the first one (opening a dataset). Structure problems (not an object, a missing key, a wrong
type, a bad shardset name) come first; consistency problems (shard counts, ``shard_rows`` lengths,
columns of the recorded schema, repeated names) are only looked for in a well-formed manifest.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import pyarrow as pa
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from datamill.core.constants import DATASET_MANIFEST, SAMPLES_FILE, SHARDS_FORMAT
from datamill.core.errors import ShardsetError
from datamill.shards._mapping import schema_from_b64

__all__ = ["Manifest", "ShardsetEntry", "is_generation", "manifest_problems", "validate_manifest"]

_HINT = (
    "restore dataset.json from a backup, or rebuild the dataset; run `datamill shards check` "
    "for every problem"
)
Count = Annotated[StrictInt, Field(ge=0)]


class ShardsetEntry(BaseModel):
    """One shardset in the manifest."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    name: StrictStr
    format: StrictStr
    columns: list[StrictStr]
    schema_b64: StrictStr = Field(alias="schema")
    num_shards: Count
    shard_rows: list[Count]
    source_metadata: StrictStr | None = None

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        if (
            not v
            or "/" in v
            or "\\" in v
            or v.startswith(".")
            or v in (DATASET_MANIFEST, SAMPLES_FILE)
        ):
            raise ValueError(f"a shardset name must be a plain folder name, got {v!r}")
        return v

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        if v not in ("parquet", "csv"):
            raise ValueError(f"expected 'parquet' or 'csv', got {v!r}")
        return v


class Manifest(BaseModel):
    """The whole ``dataset.json``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    format: StrictStr
    name: StrictStr = ""
    uid_column: Annotated[StrictStr, Field(min_length=1)]
    num_shards: Count
    num_samples: Count | None = None
    shardsets: Annotated[list[ShardsetEntry], Field(min_length=1)]
    data_dir: StrictStr | None = None
    """Where the mapping and the shardset folders are, relative to ``dataset.json``'s folder
    (absent:
    beside it). Only an overwrite on an object store writes one: the new dataset goes to a fresh
    ``.gen-<hex>`` prefix beside the old, and the manifest, put last, switches to it."""

    @field_validator("data_dir")
    @classmethod
    def _generation(cls, v: str | None) -> str | None:
        if v is not None and not is_generation(v):
            raise ValueError(f"expected a '.gen-<hex>' folder name, got {v!r}")
        return v


def is_generation(name: str) -> bool:
    """Whether ``name`` is a data folder name datamill writes (``.gen-`` and 8-32 hex digits).

    Examples:
        >>> is_generation(".gen-0a1b2c3d4e5f"), is_generation("../x"), is_generation(".gen-zz")
        (True, False, False)
    """
    return re.fullmatch(r"\.gen-[0-9a-f]{8,32}", name) is not None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def manifest_problems(raw: Any, *, path: str) -> tuple[Manifest | None, list[ShardsetError]]:
    """``(manifest, problems)``; ``manifest`` is ``None`` when the structure is invalid.

    Examples:
        >>> m, problems = manifest_problems(
        ...     {"format": "datamill.shards/1", "num_shards": "five"}, path="d.json"
        ... )
        >>> m is None
        True
        >>> for p in problems:
        ...     print(str(p).splitlines()[0])
        d.json: uid_column: Field required
        d.json: num_shards: Input should be a valid integer, got 'five'
        d.json: shardsets: Field required
    """

    def err(field: str, msg: str) -> ShardsetError:
        return ShardsetError(f"{field}: {msg}", path=path, hint=_HINT)

    if not isinstance(raw, dict):
        return None, [err("(top level)", f"expected a JSON object, got {type(raw).__name__}")]
    if raw.get("format") != SHARDS_FORMAT:
        return None, [
            ShardsetError(
                f"expected format {SHARDS_FORMAT!r}, got {raw.get('format')!r}", path=path
            )
        ]
    try:
        m = Manifest.model_validate(raw)
    except ValidationError as exc:
        from datamill.core.yamlconfig import field_path

        out = []
        for e in exc.errors():
            missing = e["type"] == "missing"
            msg = str(e["msg"]).removeprefix("Value error, ")
            out.append(
                err(
                    field_path(e["loc"]) or "(top level)",
                    msg if missing else f"{msg}, got {_short(e['input'])}",
                )
            )
        return None, out
    problems: list[ShardsetError] = []
    seen: dict[str, str] = {}
    names: set[str] = set()
    for i, ss in enumerate(m.shardsets):
        at = f"shardsets[{i}]"
        if ss.name in names:
            problems.append(err(f"{at}.name", f"the shardset {ss.name!r} is listed twice"))
        names.add(ss.name)
        problems += [err(f"{at}.{field}", msg) for field, msg in _shardset_problems(m, ss, seen)]
    return m, problems


def _shardset_problems(m: Manifest, ss: Any, seen: dict[str, str]) -> list[tuple[str, str]]:
    """``(field, message)`` of one shardset's problems; records its columns in ``seen``."""
    out: list[tuple[str, str]] = []
    if ss.num_shards != m.num_shards:
        out.append(
            (
                "num_shards",
                f"the manifest says {ss.num_shards} shards, the dataset has {m.num_shards}",
            )
        )
    if len(ss.shard_rows) != m.num_shards:
        out.append(("shard_rows", f"{len(ss.shard_rows)} row counts for {m.num_shards} shards"))
    try:
        schema = schema_from_b64(ss.schema_b64)
    except (pa.ArrowException, ValueError) as exc:
        return [*out, ("schema", f"not a serialized Arrow schema ({exc})")]
    out += [
        ("columns", f"column {c!r} is not in the shardset's schema {schema.names}")
        for c in [m.uid_column, *ss.columns]
        if c not in schema.names
    ]
    for c in ss.columns:
        if c == m.uid_column or c in seen:
            other = "the UID column" if c == m.uid_column else seen[c]
            out.append(("columns", f"column {c!r} is also in {other}"))
        seen.setdefault(c, ss.name)
    return out


def validate_manifest(raw: Any, *, path: str) -> Manifest:
    """The validated manifest, or the first problem raised (a :class:`ShardsetError` naming the
    field)."""
    m, problems = manifest_problems(raw, path=path)
    if problems:
        if len(problems) > 1:
            problems[0].add_note(
                f"{len(problems) - 1} more problems in {path}: run `datamill shards check`"
            )
        raise problems[0]
    assert m is not None
    return m
