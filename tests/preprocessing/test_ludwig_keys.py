"""Every accepted ``preprocessing:`` key of every feature type is honoured (issue 30): changing it
from its default changes the output (tensors or fitted metadata), or the key is listed in
:data:`NO_OUTPUT_EFFECT` with the reason (model-only or execution-only), and that list is what
``docs/ludwig-differences.md`` states.

A new key without an entry in :data:`ALTERNATIVES` or :data:`NO_OUTPUT_EFFECT` fails the walk, so no
key can be accepted and silently ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from datamill.preprocessing import api
from datamill.preprocessing.features import FEATURE_TYPES, handler_class

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ludwig-differences.md"

#: (type, key) -> why changing it leaves the preprocessed output as it is
NO_OUTPUT_EFFECT: dict[tuple[str, str], str] = {  # the docs page names each of these keys
    (
        "text",
        "cache_encoder_embeddings",
    ): "model-only: Ludwig caches a pretrained encoder's outputs",
    ("image", "num_processes"): "execution-only: worker processes, the same output by design",
    ("audio", "num_processes"): "execution-only: decoding threads, the same output by design",
    ("audio", "in_memory"): "training-only: where Ludwig keeps the tensors while training",
    ("audio", "mode"): "training-only: when Ludwig decodes (eager or per batch)",
    ("audio", "prefetch_size"): "training-only: batches Ludwig prefetches",
    ("audio", "lazy_cache_dir"): "training-only: where Ludwig caches in-memory audio",
    ("audio", "max_audio_file_length_in_s"): "a bound: longer files are refused",
}

#: the column of each type the walk preprocesses (every one has a missing value)
COLUMNS: dict[str, list[Any]] = {
    "binary": ["pos", "neg", None, "pos", "neg", "neg"],
    "number": [1.0, 2.0, None, 4.0, 100.0, 3.0],
    "category": ["Red", "blue", None, "red", "blue", "green"],
    "set": ["A b", "b", None, "c b", "a,b", "b"],
    "bag": ["A a b", "b", None, "c b", "a,b", "b"],
    "sequence": ["x y z", "y", None, "Y x", "x,y", "z z"],
    "text": ["Hi, you there!", "you", None, "Hi HI", "a,b", "you there"],
    "timeseries": ["1 2 3", "4 5", None, "6", "7 8", "9 1 2 3"],
    "date": ["2021-03-04", "2020-12-31", None, "2021-07-01", "04/05/2021", "2019-01-01"],
    "vector": [
        "1 2",
        "3 4",
        None,
        "5 6",
        "7 8",
        "9 1",
    ],  # a change that makes a key refuse the data counts too
    "h3": [
        "622236723497533439",
        "599686042433355775",
        None,
        "622236723497533439",
        "599686042433355775",
        "599686042433355775",
    ],
}


def _alternatives(tmp: Path) -> dict[str, dict[str, Any]]:
    """A value other than the default for every accepted key (chosen so the walk's column shows
    it)."""
    (tmp / "vocab.txt").write_text("you\nthere\nz\n")
    return {
        "binary": {
            "missing_value_strategy": "fill_with_true",
            "fill_value": "pos",
            "true_strings": ["pos", "neg"],
            "false_strings": ["pos", "neg"],
            "fallback_true_label": "pos",  # (neg, the first sorted value, is the automatic one)
        },
        "number": {
            "missing_value_strategy": "fill_with_mean",
            "fill_value": 7.0,
            "normalization": "minmax",
            "outlier_strategy": "fill_with_mean",
            "outlier_threshold": 1.0,
        },
        "category": {
            "missing_value_strategy": "fill_with_mode",
            "fill_value": "blue",
            "most_common": 1,
            "lowercase": True,
            "min_frequency": 2,
        },
        "set": {
            "missing_value_strategy": "fill_with_mode",
            "fill_value": "z",
            "tokenizer": "comma",
            "regex": "[ ,]",
            "lowercase": True,
            "most_common": 1,
            "min_frequency": 2,
            "max_dense_bytes": 0,
            "layout": "ludwig017",
        },
        "bag": {
            "missing_value_strategy": "fill_with_mode",
            "fill_value": "z",
            "tokenizer": "comma",
            "regex": "[ ,]",
            "lowercase": True,
            "most_common": 1,
            "min_frequency": 2,
            "max_dense_bytes": 0,
            "layout": "ludwig017",
        },
        "sequence": {
            "missing_value_strategy": "fill_with_mode",
            "fill_value": "z",
            "tokenizer": "comma",
            "regex": "[ ,]",
            "lowercase": True,
            "most_common": 1,
            "min_frequency": 2,
            "max_sequence_length": 1,
            "padding": "left",
            "vocab_file": str(tmp / "vocab.txt"),
            "sequence_length": 5,
            "padding_symbol": "<P>",
            "unknown_symbol": "<U>",
            "start_stop": True,
            "start_symbol": "<S>",
            "stop_symbol": "<E>",
            "layout": "ludwig017",
        },
        "text": {
            "missing_value_strategy": "fill_with_mode",
            "fill_value": "z",
            "char_tokenizer": "space",
            "char_most_common": 2,
            "char_sequence_length_limit": 2,
            "word_tokenizer": "space",
            "word_regex": "[ ,]",
            "word_most_common": 2,
            "word_sequence_length_limit": 1,
            "lowercase": False,
            "remove_stopwords": True,
            "padding": "left",
            "tokenizer": "space",
            "sequence_length": 7,
            "max_sequence_length": 1,
            "layout": "ludwig017",
            "most_common": 2,
            "vocab_file": str(tmp / "vocab.txt"),
            "padding_symbol": "<P>",
            "unknown_symbol": "<U>",
            "pretrained_model_name_or_path": _hf(tmp),
            "ngram_size": 2,
            "compute_idf": False,
        },
        "timeseries": {
            "missing_value_strategy": "fill_with_mode",
            "fill_value": "5 5",
            "tokenizer": "comma",
            "timeseries_length_limit": 2,
            "padding": "left",
            "padding_value": -1.0,
        },
        "date": {
            "missing_value_strategy": "fill_with_mode",
            "fill_value": "2000-01-01",
            "datetime_format": "%m/%d/%Y",
        },
        "h3": {"missing_value_strategy": "fill_with_mode", "fill_value": 599686042433355775},
        "vector": {
            "missing_value_strategy": "fill_with_mode",
            "fill_value": "5 5",
            "vector_size": 3,
        },
        "audio": {
            "missing_value_strategy": "fill_with_const",
            "fill_value": str(tmp / "clip1.wav"),
            "audio_file_length_limit_in_s": 0.25,
            "padding_value": -1.0,
            "norm": "per_file",
            "type": "stft",
            "window_length_in_s": 0.02,
            "window_shift_in_s": 0.01,
            "num_fft_points": 512,
            "window_type": "hann",
            "num_filter_bands": 20,
        },
        "image": {
            "missing_value_strategy": "fill_with_const",
            "fill_value": str(tmp / "img1.png"),
            "height": 3,
            "width": 3,
            "num_channels": 1,
            "resize_method": "crop_or_pad",
            "infer_image_dimensions": False,
            "infer_image_max_height": 2,
            "infer_image_max_width": 2,
            "infer_image_sample_size": 1,
            "standardize_image": "imagenet1k",
        },
    }


#: keys whose default is the only accepted value (anything else refused); the walk checks the
# refusal
REFUSED_OFF_DEFAULT = {("text", "ngram_size"): 3, ("text", "compute_idf"): True}

#: keys that only make sense with another key set (the walk sets both)
COMPANIONS = {
    ("set", "regex"): {"tokenizer": "regex", "regex": " "},
    ("bag", "regex"): {"tokenizer": "regex", "regex": " "},
    ("sequence", "regex"): {"tokenizer": "regex", "regex": " "},
    ("text", "word_regex"): {"word_tokenizer": "regex", "word_regex": " "},
    ("date", "datetime_format"): {
        "missing_value_strategy": "fill_with_const",
        "fill_value": "01/01/2000",
    },
    ("number", "outlier_threshold"): {"outlier_strategy": "fill_with_mean"},
    ("text", "pretrained_model_name_or_path"): {},
    ("image", "resize_method"): {"height": 5, "width": 5},
    ("image", "fill_value"): {
        "missing_value_strategy": "fill_with_const",
        "fill_value": str(Path("/nonexistent.png")),
    },
    ("binary", "fill_value"): {"missing_value_strategy": "fill_with_const", "fill_value": "neg"},
    ("audio", "fill_value"): {
        "missing_value_strategy": "fill_with_const",
        "fill_value": str(Path("/nonexistent.wav")),
    },
    ("binary", "false_strings"): {"true_strings": ["yes"]},
    ("sequence", "start_symbol"): {"start_stop": True},
    ("sequence", "stop_symbol"): {"start_stop": True},
}


def _hf(tmp: Path) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, "you": 2, "there": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp / "tokenizer.json"))
    return str(tmp / "tokenizer.json")


def _output(kind: str, preprocessing: dict[str, Any], tmp: Path) -> Any:
    """(tensors, fitted metadata) of the walk's column, or the error class when the data is
    refused."""
    from datamill.core.errors import DatamillError

    try:
        return _run(kind, preprocessing, tmp)
    except (
        DatamillError
    ) as exc:  # the data (or the other keys) refused under this value: the key is honoured
        return type(exc).__name__


def _run(
    kind: str, preprocessing: dict[str, Any], tmp: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    column = (
        _images(tmp.parent)
        if kind == "image"
        else _clips(tmp.parent)
        if kind == "audio"
        else COLUMNS[kind]
    )
    if kind == "date" and preprocessing.get("datetime_format"):
        column = ["03/04/2021", "12/31/2020", None, "07/01/2021", "04/05/2021", "01/01/2019"]
    table = pa.table({"f": pa.array(column, pa.float64() if kind == "number" else pa.string())})
    out = api.preprocess(
        table,
        {
            "input_features": [{"name": "f", "type": kind, "preprocessing": preprocessing}],
            "preprocessing": {"split": {"type": "none"}},
        },
        output_dir=tmp,
    )
    data = {
        k: (v.indices.tolist(), v.offsets.tolist())
        if hasattr(v, "indices")
        else np.asarray(v).tolist()
        for k, v in out.data.items()
    }
    meta = {k: v for k, v in out.metadata["f"].items() if k != "preprocessing"}
    return data, json.loads(json.dumps(meta, default=str))


def _images(tmp: Path) -> list[str | None]:
    """Three small images of different sizes and channels (and a missing one), absolute paths."""
    from PIL import Image

    tmp.mkdir(parents=True, exist_ok=True)
    for i, (mode, size) in enumerate([("RGB", (6, 4)), ("L", (8, 8)), ("RGB", (4, 6))]):
        img = Image.new(mode, size)
        img.putdata(
            [
                (7 * j) % 256 if mode == "L" else ((7 * j) % 256, (3 * j) % 256, 99)
                for j in range(size[0] * size[1])
            ]
        )
        img.save(tmp / f"img{i}.png")
    return [str(tmp / "img0.png"), str(tmp / "img1.png"), None, str(tmp / "img2.png")]


def _clips(tmp: Path) -> list[str | None]:
    """Three short WAV files of different tones and lengths (and a missing one), absolute paths."""
    import soundfile as sf

    tmp.mkdir(parents=True, exist_ok=True)
    for i, (freq, seconds) in enumerate([(440, 0.3), (1500, 0.2), (3000, 0.5)]):
        t = np.arange(int(seconds * 8000)) / 8000
        sf.write(tmp / f"clip{i}.wav", 0.4 * np.sin(2 * np.pi * freq * t) + 0.01 * t, 8000)
    return [str(tmp / "clip0.wav"), str(tmp / "clip1.wav"), None, str(tmp / "clip2.wav")]


KEYS = [
    (kind, key) for kind in sorted(FEATURE_TYPES) for key in handler_class(kind).Params.model_fields
]


@pytest.mark.parametrize(("kind", "key"), KEYS, ids=[f"{k}.{x}" for k, x in KEYS])
def test_every_accepted_key_changes_the_output_or_is_documented(
    kind: str, key: str, tmp_path: Path
) -> None:
    if (kind, key) in NO_OUTPUT_EFFECT:
        assert f"`{key}`" in DOCS.read_text(), (
            f"{kind}.{key} has no effect on the output but is not documented"
        )
        return
    if (kind, key) in REFUSED_OFF_DEFAULT:
        from datamill.core.errors import ConfigError

        with pytest.raises(ConfigError, match=key):
            _run(kind, {key: REFUSED_OFF_DEFAULT[(kind, key)]}, tmp_path)
        return
    alternatives = _alternatives(tmp_path)[kind]
    assert key in alternatives, (
        f"{kind}.{key}: accepted, so it needs an alternative value here (or a documented reason)"
    )
    base = {**COMPANIONS.get((kind, key), {})}
    changed = {**base, key: alternatives[key]}
    if base.get(key) == alternatives[key]:
        base.pop(key)
    assert _output(kind, base, tmp_path / "a") != _output(kind, changed, tmp_path / "b"), (
        f"{kind}.{key} changed nothing"
    )
