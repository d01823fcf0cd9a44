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

import os
import typing
import warnings
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from datamill.core.errors import ConfigError
from datamill.preprocessing.features import (
    FEATURE_TYPES,
    FeatureHandler,
    handler_class,
    handler_classes,
)
from datamill.preprocessing.missing import STRATEGIES

__all__ = [  # noqa: RUF022 - Python sorted() order (house rule)
    "FeatureConfig",
    "LUDWIG_MODEL_KEYS",
    "LudwigKeysIgnored",
    "PreprocessConfig",
    "ResolvedFeature",
    "SplitConfig",
    "load_config",
    "strip_model_keys",
]

_Strict = ConfigDict(extra="forbid", frozen=True)

#: keys a Ludwig model config defines outside preprocessing, accepted and ignored (with one notice):
#: at the top level, in a feature, and in a ``defaults.<type>`` section
LUDWIG_MODEL_KEYS: dict[str, frozenset[str]] = {
    "top": frozenset(
        {
            "adapter",
            "adapters",
            "backend",
            "base_model",
            "combiner",
            "generation",
            "hyperopt",
            "is_multimodal",
            "ludwig_version",
            "model_parameters",
            "model_type",
            "preset",
            "prompt",
            "quantization",
            "trainer",
            "trust_remote_code",
        }
    ),
    "feature": frozenset(
        {
            "active",
            "augmentation",
            "calibration",
            "clip",
            "decoder",
            "default_validation_metric",
            "dependencies",
            "encoder",
            "input_size",
            "loss",
            "num_classes",
            "proc_column",
            "reduce_dependencies",
            "reduce_input",
            "threshold",
            "tied",
            "top_k",
        }
    ),
    "defaults": frozenset({"decoder", "encoder", "loss"}),
}


class LudwigKeysIgnored(UserWarning):
    """A Ludwig model config's keys outside preprocessing (encoder, trainer, ...) were ignored."""


def strip_model_keys(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``data`` without the keys of :data:`LUDWIG_MODEL_KEYS`, and the YAML paths of the keys
    removed.

    Examples:
        >>> strip_model_keys(
        ...     {
        ...         "input_features": [
        ...             {"name": "x", "type": "number", "encoder": {"type": "dense"}}
        ...         ],
        ...         "trainer": {"epochs": 3},
        ...         "defaults": {"number": {"encoder": {}}},
        ...     }
        ... )[1]
        ['trainer', 'input_features[0].encoder', 'defaults.number.encoder']
    """
    ignored = [k for k in data if k in LUDWIG_MODEL_KEYS["top"]]
    out = {k: v for k, v in data.items() if k not in LUDWIG_MODEL_KEYS["top"]}
    for section in ("input_features", "output_features"):
        feats = out.get(section)
        if isinstance(feats, list):
            out[section] = [
                _without(f, LUDWIG_MODEL_KEYS["feature"], f"{section}[{i}]", ignored)
                for i, f in enumerate(feats)
            ]
    defaults = out.get("defaults")
    if isinstance(defaults, dict):
        out["defaults"] = {
            t: _without(d, LUDWIG_MODEL_KEYS["defaults"], f"defaults.{t}", ignored)
            for t, d in defaults.items()
        }
    return out, ignored


def _without(d: Any, keys: Collection[str], where: str, ignored: list[str]) -> Any:
    """``d`` without ``keys`` (anything but a dict as it is); the paths ``where.<key>`` of the keys
    removed are appended to ``ignored``."""
    if not isinstance(d, dict):
        return d
    ignored += [f"{where}.{k}" for k in d if k in keys]
    return {k: v for k, v in d.items() if k not in keys}


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
        # a key of meta.json beside the "datamill" header; in the HDF5 file '/' and '%' are escaped
        # (hdf5_name)
        if "\0" in v or v == "datamill":
            raise ValueError(
                f"feature name {v!r} cannot be stored: names may not contain a NUL character or be "
                "'datamill' (the metadata header); rename it and set `column` "
                "to keep reading the same column"
            )
        return v

    @field_validator("type")
    @classmethod
    def _known_type(cls, v: str) -> str:
        if v not in FEATURE_TYPES:
            raise ValueError(
                f"unknown feature type {v!r}; valid types: {', '.join(sorted(FEATURE_TYPES))}"
            )
        return v


class SplitConfig(BaseModel):
    """Train/validation/test split (Ludwig's split types; see :mod:`datamill.preprocessing.split`).

    ``random`` (the default, also when the config has no ``split``): seeded, exact sizes;
    ``fixed``: from a column (``column`` defaults to ``split``) holding 0/1/2 or
    train/validation/test; ``stratify``: random with exact sizes within each value of ``column``;
    ``hash``: from a stable hash of ``column`` (a row keeps its split as the data grows);
    ``datetime``: the earliest rows of ``column`` train, the latest test; ``none``: no split (every
    row is fitted on).
    """

    model_config = _Strict
    type: Literal["random", "fixed", "stratify", "hash", "datetime", "none"] = "random"
    probabilities: tuple[float, float, float] = (0.7, 0.1, 0.2)
    column: str | None = None
    datetime_format: str | None = None

    @field_validator("probabilities")
    @classmethod
    def _sum_to_one(cls, v: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(p < 0 for p in v) or abs(sum(v) - 1.0) > 1e-6:
            raise ValueError(f"probabilities must be >= 0 and sum to 1, got {list(v)}")
        return v

    @model_validator(mode="after")
    def _column(self) -> SplitConfig:
        if self.type in ("stratify", "hash", "datetime") and self.column is None:
            raise ValueError(f"split type {self.type!r} needs a column")
        return self

    @property
    def split_column(self) -> str | None:
        """The input column this split reads (``fixed`` defaults to ``split``), None for
        random/none."""
        if self.type == "fixed":
            return self.column or "split"
        return self.column if self.type in ("stratify", "hash", "datetime") else None


def defaults_keys() -> dict[str, str]:
    """Global-defaults key (``preprocessing.<key>``) → feature type, as the handler classes declare
    them."""
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
    #: keep this fraction of the rows (Ludwig's ``sample_ratio``; exact count ``round(ratio * n)``,
    # seeded)
    sample_ratio: float = Field(default=1.0, gt=0, le=1)
    #: keep exactly this many rows (Ludwig's ``sample_size``); not with ``sample_ratio``
    sample_size: int | None = Field(default=None, ge=1)
    #: training rows of the first output feature's minority class: ``r`` times the majority's
    # (Ludwig's)
    oversample_minority: float | None = Field(default=None, gt=0)
    #: training rows of its majority class: the minority's divided by ``r`` (Ludwig's)
    undersample_majority: float | None = Field(default=None, gt=0, le=1)
    #: caps ``max_sequence_length`` of every feature that has one (Ludwig's
    # ``global_max_sequence_length``)
    global_max_sequence_length: int | None = Field(default=None, ge=1)
    #: ``ludwig017``: every feature type with a ``layout`` option writes Ludwig 0.17's layout
    # (unless it sets its own)
    layout: Literal["ludwig017"] | None = None
    #: the input file's format (see :mod:`datamill.preprocessing.formats`); None: from its
    # extension
    format: (
        Literal["csv", "excel", "feather", "fwf", "hdf5", "json", "jsonl", "orc", "parquet", "tsv"]
        | None
    ) = None

    @model_validator(mode="after")
    def _type_defaults(self) -> GlobalPreprocessing:
        keys = defaults_keys()
        if self.sample_size is not None and self.sample_ratio < 1:
            raise ValueError("set sample_ratio or sample_size, not both")
        if self.oversample_minority is not None and self.undersample_majority is not None:
            raise ValueError("set oversample_minority or undersample_majority, not both")
        for key, value in (self.model_extra or {}).items():
            if key not in keys:
                raise ValueError(
                    f"unknown key {key!r}; valid keys: split, seed, sample_ratio, sample_size, "
                    "oversample_minority, undersample_majority, global_max_sequence_length, "
                    "layout, format, "
                    f"{', '.join(sorted(keys))}"
                )
            if not isinstance(value, dict):
                raise ValueError(  # noqa: TRY004 - pydantic turns ValueError (not TypeError) into a located error
                    f"{key}: expected a mapping of {keys[key]} preprocessing parameters, got "
                    f"{type(value).__name__}"
                )
        return self

    def type_defaults(self, type_name: str) -> dict[str, Any]:
        """The global defaults of feature type ``type_name`` (empty when none are given)."""
        value: dict[str, Any] = (self.model_extra or {}).get(
            handler_class(type_name).defaults_key, {}
        )
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
                raise ValueError(
                    f"unknown feature type {name!r}; valid types: "
                    f"{', '.join(sorted(FEATURE_TYPES))}"
                )
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


def _layouts(annotation: Any) -> tuple[Any, ...]:
    """The values of a ``Literal`` annotation (the layouts a type offers)."""
    return typing.get_args(annotation)


def _from_validation(
    exc: ValidationError, source: str | None, prefix: str = "", *, text: str | None = None
) -> ConfigError:
    """The first validation error, located by its field path (and by its line in ``text``, the
    config file's)."""
    from datamill.core.yamlconfig import field_path, line_of

    err = exc.errors()[0]
    where = field_path(tuple(err["loc"]), prefix)
    msg = err["msg"].removeprefix("Value error, ")
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    line = None if text is None else line_of(text, tuple(err["loc"]))
    error = ConfigError(f"{where}: {msg}{more}", path=source, line=line)
    error.where = where  # type: ignore[attr-defined]  # extra location attribute for config errors
    return error


def load_config(
    config: PreprocessConfig | dict[str, Any] | str | os.PathLike[str],
) -> tuple[PreprocessConfig, str | None]:
    """Parse a config (model, dict, or YAML/JSON file path) → (model, file name or None)."""
    if isinstance(config, PreprocessConfig):
        return config, None
    source: str | None = None
    text: str | None = None
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        source = str(config)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise ConfigError("config file not found", path=source) from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config: {exc}", path=source) from exc
        from datamill.core.yamlconfig import load_json, load_yaml

        try:
            data = (
                load_json(text, path=source)
                if path.suffix.lower() == ".json"
                else load_yaml(text, path=source)
            )
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(
                f"cannot parse config: {' '.join(str(exc).split())}", path=source
            ) from exc
        if not isinstance(data, dict):
            raise ConfigError(
                f"expected a mapping with input_features, got {type(data).__name__}", path=source
            )
        config = data
    config, ignored = strip_model_keys(config)
    if ignored:
        shown = ", ".join(ignored[:6]) + (
            f" and {len(ignored) - 6} more" if len(ignored) > 6 else ""
        )
        # one line, located at the config file (warn_explicit: no source line is printed under it)
        warnings.warn_explicit(
            LudwigKeysIgnored(
                f"ignored {len(ignored)} Ludwig model key(s) outside preprocessing ({shown})"
            ),
            LudwigKeysIgnored,
            filename=source or "<config>",
            lineno=0,
            module=__name__,
        )
    try:
        return PreprocessConfig.model_validate(config), source
    except ValidationError as exc:
        raise _from_validation(exc, source, text=text) from exc


def _missing_values(
    cls: type[FeatureHandler], role: str, merged: dict[str, Any], where: str, source: str | None
) -> tuple[str, Any]:
    """A feature's missing-value strategy and fill value: the configured ones, else its type's
    defaults for ``role``. A key the type's Params do not have is taken out of ``merged``.

    Raises:
        ConfigError: an unknown strategy, or one that does not apply to the type.
    """
    fields = cls.Params.model_fields
    strategy = cls.missing_value_strategy if role == "input" else cls.output_missing_value_strategy
    fill = cls.default_fill(merged)
    if "missing_value_strategy" in merged:
        strategy = (
            merged["missing_value_strategy"]
            if "missing_value_strategy" in fields
            else merged.pop("missing_value_strategy")
        )
    if "fill_value" in merged:
        fill = merged["fill_value"] if "fill_value" in fields else merged.pop("fill_value")
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"{where}.preprocessing.missing_value_strategy: unknown strategy {strategy!r}; "
            f"valid: {', '.join(STRATEGIES)}",
            path=source,
        )
    if strategy not in cls.strategies:
        raise ConfigError(
            f"{where}.preprocessing.missing_value_strategy: {strategy} does not apply to "
            f"{cls.type_name} features; valid: {', '.join(cls.strategies)}",
            path=source,
        )
    return strategy, fill


# one pass over the features, its checks in the order a user's config is read, each raising a
# located error
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
            merged = {
                **cls.role_defaults(role),
                **glob.type_defaults(f.type),
                **(typed.preprocessing if typed else {}),
                **f.preprocessing,
            }
            fields = cls.Params.model_fields
            if (
                glob.layout is not None
                and "layout" in fields
                and "layout" not in merged
                and glob.layout in _layouts(fields["layout"].annotation)
            ):
                merged["layout"] = glob.layout
            strategy, fill = _missing_values(cls, role, merged, where, source)
            cap = glob.global_max_sequence_length
            if cap is not None and "max_sequence_length" in fields:
                merged["max_sequence_length"] = min(
                    int(
                        merged.get("max_sequence_length", fields["max_sequence_length"].default)
                        or cap
                    ),
                    cap,
                )
            try:
                params = cls.Params.model_validate(merged)
            except ValidationError as exc:
                raise _from_validation(exc, source, f"{where}.preprocessing") from exc
            out.append(
                ResolvedFeature(
                    f.name, f.type, f.column or f.name, params, strategy, fill, role, where
                )
            )
    return out
