"""Config validation: unknown types/parameters/columns, YAML paths and file names in errors."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from datamill.core.errors import ConfigError, SchemaError
from datamill.preprocessing.api import preprocess
from datamill.preprocessing.config import load_config, resolve_features


def _write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_yaml_and_json_configs_are_equivalent(tmp_path: Path) -> None:
    y = _write(
        tmp_path,
        "input_features:\n  - {name: a, type: category, preprocessing: {most_common: 5}}\n",
    )
    j = _write(
        tmp_path,
        '{"input_features": [{"name": "a", "type": "category", '
        '"preprocessing": {"most_common": 5}}]}',
        "cfg.json",
    )
    assert load_config(y)[0] == load_config(j)[0]


def test_unknown_parameter_names_file_and_yaml_path(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "input_features:\n  - {name: a, type: number}\n  - {name: b, type: number}\n"
        "  - {name: c, type: binary}\n"
        "  - {name: d, type: category, preprocessing: {most_comon: 3}}\n",
    )
    cfg, src = load_config(p)
    with pytest.raises(ConfigError) as info:
        resolve_features(cfg, src)
    assert info.value.path == str(p)
    assert info.value.where == "input_features[3].preprocessing.most_comon"  # type: ignore[attr-defined]
    assert "input_features[3].preprocessing.most_comon" in str(info.value)


def test_bad_value_type(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "input_features:\n  - {name: d, type: category, preprocessing: {most_common: lots}}\n",
    )
    with pytest.raises(ConfigError) as info:
        resolve_features(*load_config(p))
    assert info.value.where == "input_features[0].preprocessing.most_common"  # type: ignore[attr-defined]


def test_unknown_type_lists_valid_ones(tmp_path: Path) -> None:
    p = _write(tmp_path, "input_features:\n  - {name: a, type: numbr}\n")
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert info.value.where == "input_features[0].type"  # type: ignore[attr-defined]
    assert "category" in str(info.value) and "number" in str(info.value)


def test_unknown_top_level_key_and_global_defaults(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"input_features": [{"name": "a", "type": "number"}], "preprocesing": {}})
    assert info.value.where == "preprocesing"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError) as info:
        resolve_features(
            load_config(
                {
                    "input_features": [{"name": "a", "type": "category"}],
                    "preprocessing": {"category": {"most_common": -1}},
                }
            )[0]
        )
    assert info.value.where == "input_features[0].preprocessing.most_common"  # type: ignore[attr-defined]


def test_global_type_defaults_apply_and_feature_overrides() -> None:
    cfg, _ = load_config(
        {
            "input_features": [
                {"name": "a", "type": "category"},
                {"name": "b", "type": "category", "preprocessing": {"most_common": 7}},
            ],
            "preprocessing": {"category": {"most_common": 2}},
        }
    )
    a, b = resolve_features(cfg)
    assert a.params.most_common == 2 and b.params.most_common == 7


def test_unparsable_yaml_and_missing_config(tmp_path: Path) -> None:
    p = _write(tmp_path, "input_features: [\n")
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert info.value.path == str(p)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.yaml")
    assert info.value.path == str(tmp_path / "nope.yaml")


def test_bad_strategy_and_duplicates() -> None:
    with pytest.raises(ConfigError, match="missing_value_strategy"):
        resolve_features(
            load_config(
                {
                    "input_features": [
                        {
                            "name": "a",
                            "type": "number",
                            "preprocessing": {"missing_value_strategy": "guess"},
                        }
                    ]
                }
            )[0]
        )
    with pytest.raises(ConfigError, match="duplicate"):
        resolve_features(
            load_config(
                {
                    "input_features": [{"name": "a", "type": "number"}],
                    "output_features": [{"name": "a", "type": "number"}],
                }
            )[0]
        )


def test_bad_split_probabilities() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(
            {
                "input_features": [{"name": "a", "type": "number"}],
                "preprocessing": {"split": {"probabilities": [0.5, 0.5, 0.5]}},
            }
        )
    assert info.value.where == "preprocessing.split.probabilities"  # type: ignore[attr-defined]


def test_unknown_column_is_named() -> None:
    t = pa.table({"price": [1.0, 2.0]})
    with pytest.raises(SchemaError) as info:
        preprocess(t, {"input_features": [{"name": "prices", "type": "number"}]})
    assert info.value.column == "prices"
    assert "price" in str(info.value)  # the available columns are listed


def test_to_dict_is_stable_and_leaves_defaults_out() -> None:
    cfg, _ = load_config({"input_features": [{"name": "a", "type": "number", "preprocessing": {}}]})
    assert cfg.to_dict() == {"input_features": [{"name": "a", "type": "number"}]}


def test_ludwig_defaults_section() -> None:
    cfg, _ = load_config(
        {
            "input_features": [
                {"name": "a", "type": "number"},
                {"name": "b", "type": "number", "preprocessing": {"normalization": "iq"}},
            ],
            "defaults": {"number": {"preprocessing": {"normalization": "zscore"}}},
        }
    )
    a, b = resolve_features(cfg)
    assert a.params.normalization == "zscore" and b.params.normalization == "iq"
    with pytest.raises(ConfigError) as info:
        load_config(
            {"input_features": [{"name": "a", "type": "number"}], "defaults": {"numbr": {}}}
        )
    assert info.value.where == "defaults"  # type: ignore[attr-defined]


def test_strategy_must_fit_the_type(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "input_features:\n  - {name: a, type: number}\n"
        "  - {name: c, type: category, preprocessing: {missing_value_strategy: fill_with_mean}}\n",
    )
    with pytest.raises(ConfigError) as info:
        resolve_features(*load_config(p))
    assert info.value.path == str(
        p
    ) and "input_features[1].preprocessing.missing_value_strategy" in str(info.value)
