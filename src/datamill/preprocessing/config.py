"""The preprocessing config: Ludwig-shaped, validated with pydantic (unknown keys rejected).

Example (YAML)::

    input_features:
      - {name: LotArea, type: number, preprocessing: {normalization: zscore}}
      - {name: MSZoning, type: category, preprocessing: {most_common: 10}}
    output_features:
      - {name: CentralAir, type: binary}
    preprocessing:
      split: {type: random, probabilities: [0.7, 0.1, 0.2]}
      seed: 42
      category: {most_common: 100}        # defaults for every category feature
    defaults:                             # Ludwig >= 0.6 spelling of the same (wins over the above)
      number: {preprocessing: {normalization: zscore}}

Errors name the config file and the YAML path (``input_features[3].preprocessing.most_common``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from datamill.core.errors import ConfigError
from datamill.preprocessing.features import FEATURE_TYPES, handler_class, handler_classes
from datamill.preprocessing.missing import STRATEGIES

__all__ = [
    "FeatureConfig",
    "PreprocessConfig",
    "ResolvedFeature",
    "SplitConfig",
    "load_config",
]

_Strict = ConfigDict(extra="forbid", frozen=True)


class FeatureConfig(BaseModel):
    """One feature: ``{name, type, column?, preprocessing?}``."""

    model_config = _Strict
    name: str = Field(min_length=1)
    type: str
    column: str | None = None
    preprocessing: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _storable_name(cls, v: str) -> str:
        # the name is an HDF5 key and a key of meta.json beside the "datamill" header
        if "/" in v or "\0" in v or v in (".", "..", "datamill"):
            raise ValueError(f"feature name {v!r} cannot be stored: names may not contain '/' or be "
                             "'.', '..' or 'datamill' (the metadata header); rename it and set `column` "
                             "to keep reading the same column")
        return v

    @field_validator("type")
    @classmethod
    def _known_type(cls, v: str) -> str:
        if v not in FEATURE_TYPES:
            raise ValueError(f"unknown feature type {v!r}; valid types: {', '.join(sorted(FEATURE_TYPES))}")
        return v


class SplitConfig(BaseModel):
    """Train/validation/test split: ``random`` (seeded) or ``fixed`` (from a column with 0/1/2 or names)."""

    model_config = _Strict
    type: Literal["random", "fixed"] = "random"
    probabilities: tuple[float, float, float] = (0.7, 0.1, 0.2)
    column: str | None = None

    @field_validator("probabilities")
    @classmethod
    def _sum_to_one(cls, v: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(p < 0 for p in v) or abs(sum(v) - 1.0) > 1e-6:
            raise ValueError(f"probabilities must be >= 0 and sum to 1, got {list(v)}")
        return v


def defaults_keys() -> dict[str, str]:
    """Global-defaults key (``preprocessing.<key>``) → feature type, as the handler classes declare them."""
    return {cls.defaults_key: name for name, cls in handler_classes().items()}


class GlobalPreprocessing(BaseModel):
    """The top-level ``preprocessing:`` section: split, seed and per-type defaults.

    A type's defaults live under the key its handler class declares (``defaults_key``, the type
    name for every built-in type), e.g. ``preprocessing: {category: {most_common: 100}}``; any
    other key is rejected.
    """

    model_config = ConfigDict(extra="allow", frozen=True)
    split: SplitConfig | None = None
    seed: int = 42

    @model_validator(mode="after")
    def _type_defaults(self) -> GlobalPreprocessing:
        keys = defaults_keys()
        for key, value in (self.model_extra or {}).items():
            if key not in keys:
                raise ValueError(f"unknown key {key!r}; valid keys: split, seed, {', '.join(sorted(keys))}")
            if not isinstance(value, dict):
                raise ValueError(  # noqa: TRY004 - pydantic turns ValueError (not TypeError) into a located error
                    f"{key}: expected a mapping of {keys[key]} preprocessing parameters, got {type(value).__name__}")
        return self

    def type_defaults(self, type_name: str) -> dict[str, Any]:
        """The global defaults of feature type ``type_name`` (empty when none are given)."""
        value: dict[str, Any] = (self.model_extra or {}).get(handler_class(type_name).defaults_key, {})
        return value


class TypeDefaults(BaseModel):
    """Ludwig >= 0.6 style ``defaults: {category: {preprocessing: {...}}}``."""

    model_config = _Strict
    preprocessing: dict[str, Any] = Field(default_factory=dict)


class PreprocessConfig(BaseModel):
    """The whole config."""

    model_config = _Strict
    input_features: list[FeatureConfig] = Field(min_length=1)
    output_features: list[FeatureConfig] = Field(default_factory=list)
    preprocessing: GlobalPreprocessing = Field(default_factory=GlobalPreprocessing)
    defaults: dict[str, TypeDefaults] = Field(default_factory=dict)

    @field_validator("defaults")
    @classmethod
    def _known_types(cls, v: dict[str, TypeDefaults]) -> dict[str, TypeDefaults]:
        for name in v:
            if name not in FEATURE_TYPES:
                raise ValueError(f"unknown feature type {name!r}; valid types: {', '.join(sorted(FEATURE_TYPES))}")
        return v

    def to_dict(self) -> dict[str, Any]:
        """Stable dict with defaults left out (what the cache fingerprint is computed from)."""
        return self.model_dump(mode="json", exclude_defaults=True)


@dataclass(frozen=True)
class ResolvedFeature:
    """A feature with its validated params (type defaults < global defaults < feature section)."""

    name: str
    type: str
    column: str
    params: Any  # the handler's Params instance
    missing_value_strategy: str
    fill_value: Any
    role: str  # "input" | "output"
    where: str  # YAML path, for error messages


def _yaml_path(prefix: str, loc: tuple[Any, ...]) -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _from_validation(exc: ValidationError, source: str | None, prefix: str = "") -> ConfigError:
    err = exc.errors()[0]
    where = _yaml_path(prefix, tuple(err["loc"]))
    msg = err["msg"].removeprefix("Value error, ")
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    error = ConfigError(f"{where}: {msg}{more}", path=source)
    error.where = where  # type: ignore[attr-defined]  # extra location attribute for config errors
    return error


def load_config(config: PreprocessConfig | dict[str, Any] | str | os.PathLike[str]) -> tuple[PreprocessConfig, str | None]:
    """Parse a config (model, dict, or YAML/JSON file path) → (model, file name or None)."""
    if isinstance(config, PreprocessConfig):
        return config, None
    source: str | None = None
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        source = str(config)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise ConfigError("config file not found", path=source) from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config: {exc}", path=source) from exc
        try:
            if path.suffix.lower() == ".json":
                data = json.loads(text)
            else:
                import yaml

                data = yaml.safe_load(text)
        except Exception as exc:
            raise ConfigError(f"cannot parse config: {' '.join(str(exc).split())}", path=source) from exc
        if not isinstance(data, dict):
            raise ConfigError(f"expected a mapping with input_features, got {type(data).__name__}", path=source)
        config = data
    try:
        return PreprocessConfig.model_validate(config), source
    except ValidationError as exc:
        raise _from_validation(exc, source) from exc


def resolve_features(cfg: PreprocessConfig, source: str | None = None) -> list[ResolvedFeature]:
    """Validate every feature's ``preprocessing`` against its type's Params model."""
    out: list[ResolvedFeature] = []
    seen: set[str] = set()
    glob = cfg.preprocessing
    for role, feats in (("input", cfg.input_features), ("output", cfg.output_features)):
        for i, f in enumerate(feats):
            where = f"{role}_features[{i}]"
            if f.name in seen:
                raise ConfigError(f"{where}.name: duplicate feature name {f.name!r}", path=source)
            seen.add(f.name)
            cls = handler_class(f.type)
            typed = cfg.defaults.get(f.type)
            merged = {**glob.type_defaults(f.type), **(typed.preprocessing if typed else {}), **f.preprocessing}
            strategy, fill = cls.missing_value_strategy, cls.fill_value
            fields = cls.Params.model_fields
            if "missing_value_strategy" in merged:
                strategy = merged["missing_value_strategy"] if "missing_value_strategy" in fields \
                    else merged.pop("missing_value_strategy")
            if "fill_value" in merged:
                fill = merged["fill_value"] if "fill_value" in fields else merged.pop("fill_value")
            if strategy not in STRATEGIES:
                raise ConfigError(f"{where}.preprocessing.missing_value_strategy: unknown strategy {strategy!r}; "
                                  f"valid: {', '.join(STRATEGIES)}", path=source)
            if strategy not in cls.strategies:
                raise ConfigError(f"{where}.preprocessing.missing_value_strategy: {strategy} does not apply to "
                                  f"{f.type} features; valid: {', '.join(cls.strategies)}", path=source)
            try:
                params = cls.Params.model_validate(merged)
            except ValidationError as exc:
                raise _from_validation(exc, source, f"{where}.preprocessing") from exc
            out.append(ResolvedFeature(f.name, f.type, f.column or f.name, params, strategy, fill, role, where))
    return out
