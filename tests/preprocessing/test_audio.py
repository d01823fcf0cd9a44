"""audio features: a sine's energy, shapes, cutting and padding, missing and bad files."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

import datamill
from datamill.core.errors import ConfigError, DataFileError
from datamill.core.progress import quiet
from datamill.preprocessing.features._audio_dsp import frame_count, mel_filterbank

NO_SPLIT = {"split": {"type": "none"}}


def _tone(path: Path, freq: float, seconds: float, rate: int = 16_000, **kw: Any) -> None:
    t = np.arange(int(seconds * rate)) / rate
    sf.write(path, 0.5 * np.sin(2 * np.pi * freq * t), rate, **kw)


def _run(table: Path, pre: dict[str, Any], column: str = "audio") -> Any:
    cfg = {
        "input_features": [{"name": "a", "type": "audio", "column": column, "preprocessing": pre}],
        "preprocessing": NO_SPLIT,
    }
    with warnings.catch_warnings(), quiet():
        warnings.simplefilter("ignore")
        return datamill.preprocess(table, cfg, skip_save=True)


def _table(folder: Path, paths: list[str]) -> Path:
    table = folder / "clips.csv"
    table.write_text("audio\n" + "\n".join(paths) + "\n")
    return table


@pytest.mark.parametrize("freq", [500.0, 1250.0, 3000.0])
def test_a_sines_energy_is_in_its_frequency_bin(tmp_path: Path, freq: float) -> None:
    _tone(tmp_path / "tone.wav", freq, 1.0)
    out = _run(
        _table(tmp_path, ["tone.wav"]), {"type": "stft", "audio_file_length_limit_in_s": 1.0}
    )
    x = out.data["a"][0]
    bin_hz = 16_000 / 640  # the window is 0.04 s = 640 samples: 25 Hz a bin
    assert x.shape == (frame_count(16_000, 640, 320), 321)
    assert set(np.argmax(x[:-1], axis=1).tolist()) == {round(freq / bin_hz)}
    # fbank: the loudest band is the mel filter whose peak is nearest the tone
    fb = _run(_table(tmp_path, ["tone.wav"]), {"audio_file_length_limit_in_s": 1.0}).data["a"][0]
    filters = mel_filterbank(80, 640, 16_000)
    assert fb.shape == (49, 80)
    assert int(np.bincount(fb.argmax(axis=1)).argmax()) == int(
        filters[:, round(freq / bin_hz)].argmax()
    )


@pytest.mark.parametrize(
    ("pre", "shape"),
    [
        ({"type": "fbank", "num_filter_bands": 40}, (3, 49, 40)),
        ({"type": "fbank", "window_length_in_s": 0.025, "window_shift_in_s": 0.01}, (3, 99, 80)),
        ({"type": "stft_phase", "num_fft_points": 1024}, (3, 49, 1026)),
        ({"type": "group_delay", "window_type": "hann"}, (3, 49, 321)),
        ({"type": "raw"}, (3, 16_000, 1)),
    ],
)
def test_shapes_and_lengths_cut_and_padded(
    tmp_path: Path, pre: dict[str, Any], shape: tuple[int, ...]
) -> None:
    _tone(tmp_path / "short.wav", 440, 0.25)
    _tone(tmp_path / "long.wav", 440, 3.0)
    _tone(tmp_path / "exact.wav", 440, 1.0)
    table = _table(tmp_path, ["short.wav", "long.wav", "exact.wav"])
    pre = {**pre, "audio_file_length_limit_in_s": 1.0, "padding_value": -9.0}
    out = _run(table, pre)
    x = out.data["a"]
    assert x.shape == shape and x.dtype == np.float32
    meta = out.metadata["a"]
    assert meta["max_length"] == shape[1] and meta["feature_dim"] == shape[2]
    assert meta["sampling_rate_in_hz"] == 16_000 and meta["reshape"] == list(shape[1:])
    # the short file is padded with padding_value after its own frames; the others are cut
    if pre["type"] == "raw":
        used = 4000
    else:
        win, shift = (
            int(pre.get("window_length_in_s", 0.04) * 16_000),
            int(pre.get("window_shift_in_s", 0.02) * 16_000),
        )
        used = frame_count(4000, win, shift)
    assert (x[0, used:] == -9.0).all() and not (x[0, :used] == -9.0).all()
    assert not (x[1] == -9.0).any() and not (x[2] == -9.0).any()


def test_norm_per_file_zscores_each_band(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    sf.write(tmp_path / "noise.wav", rng.normal(0, 0.1, 16_000), 16_000)
    x = _run(
        _table(tmp_path, ["noise.wav"]), {"norm": "per_file", "audio_file_length_limit_in_s": 1.0}
    )
    f = x.data["a"][0].astype(np.float64)
    np.testing.assert_allclose(f.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(f.std(axis=0, ddof=1), 1, atol=1e-4)


def test_formats_channels_relative_paths_and_missing_values(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    _tone(tmp_path / "sub/a.flac", 1000, 0.5)
    _tone(tmp_path / "b.ogg", 1000, 0.5, format="OGG", subtype="VORBIS")
    t = np.arange(8000) / 16_000
    stereo = np.stack([0.5 * np.sin(2 * np.pi * 1000 * t), 0.5 * np.sin(2 * np.pi * 3000 * t)], 1)
    sf.write(tmp_path / "c.wav", stereo, 16_000)
    table = tmp_path / "clips.csv"
    table.write_text("audio,n\nsub/a.flac,1\n,2\nb.ogg,3\nc.wav,4\n")
    out = _run(table, {"type": "stft", "audio_file_length_limit_in_s": 0.5})
    x = out.data["a"]
    assert x.shape == (4, 24, 321)
    peaks = x[:, 5].argmax(axis=1).tolist()
    assert peaks == [40, 40, 40, 40]  # the stereo file's first channel (1000 Hz), not 3000 Hz
    np.testing.assert_array_equal(x[1], x[2])  # the missing path: bfill, Ludwig's default


def test_bad_files_are_located_errors(tmp_path: Path) -> None:
    _tone(tmp_path / "ok.wav", 440, 0.5)
    (tmp_path / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunk")
    data = (tmp_path / "ok.wav").read_bytes()
    (tmp_path / "cut.wav").write_bytes(data[: len(data) // 3])
    for bad, match in (("broken.wav", "cannot read"), ("gone.wav", "not found")):
        with pytest.raises(DataFileError, match=match) as info:
            _run(_table(tmp_path, ["ok.wav", bad]), {"audio_file_length_limit_in_s": 0.5})
        assert (info.value.line, info.value.column) == (3, "audio")
        assert info.value.path == str(tmp_path / "clips.csv")
    out = _run(
        _table(tmp_path, ["ok.wav", "cut.wav"]),
        {"type": "raw", "audio_file_length_limit_in_s": 0.5},
    )
    assert out.data["a"].shape == (2, 8000, 1)  # a truncated WAV: libsndfile reads what is there


def test_limits_checked_before_the_samples_are_read(tmp_path: Path) -> None:
    _tone(tmp_path / "long.wav", 440, 3.0)
    with pytest.raises(DataFileError, match="longer than max_audio_file_length_in_s") as info:
        _run(_table(tmp_path, ["long.wav"]), {"max_audio_file_length_in_s": 2.0})
    assert info.value.line == 2
    _tone(tmp_path / "a.wav", 440, 0.5, rate=16_000)
    _tone(tmp_path / "b.wav", 440, 0.5, rate=8_000)
    with pytest.raises(DataFileError, match="resample") as info:
        _run(_table(tmp_path, ["a.wav", "b.wav"]), {"type": "stft"})
    assert info.value.line == 3
    with pytest.raises(ConfigError, match="whole number of samples"):
        _run(_table(tmp_path, ["a.wav"]), {"audio_file_length_limit_in_s": 0.00001})


def test_a_replaced_audio_file_invalidates_the_cache(tmp_path: Path) -> None:
    _tone(tmp_path / "a.wav", 440, 0.5)
    table = _table(tmp_path, ["a.wav"])
    cfg = {
        "input_features": [{"name": "a", "type": "audio", "column": "audio"}],
        "preprocessing": NO_SPLIT,
    }
    with quiet():
        first = datamill.preprocess(table, cfg, output_dir=tmp_path / "out").data["a"].copy()
        _tone(tmp_path / "a.wav", 3000, 0.7)
        second = datamill.preprocess(table, cfg, output_dir=tmp_path / "out").data["a"]
    assert not np.array_equal(first, second)


def test_audio_bytes_in_a_binary_column(tmp_path: Path) -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    clips = []
    for freq in (1000, 2000):
        buf = io.BytesIO()
        t = np.arange(8000) / 16_000
        sf.write(buf, 0.5 * np.sin(2 * np.pi * freq * t), 16_000, format="WAV")
        clips.append(buf.getvalue())
    table = pa.table({"audio": pa.array([clips[0], None, clips[1]], pa.binary())})
    pq.write_table(table, tmp_path / "clips.parquet")
    cfg = {
        "input_features": [
            {
                "name": "a",
                "column": "audio",
                "type": "audio",
                "preprocessing": {"type": "stft", "audio_file_length_limit_in_s": 0.5},
            }
        ],
        "preprocessing": NO_SPLIT,
    }
    with quiet():
        for data in (table, tmp_path / "clips.parquet"):
            x = datamill.preprocess(data, cfg, skip_save=True).data["a"]
            assert x[:, 5].argmax(axis=1).tolist() == [40, 80, 80]  # the missing row: bfill
    table = pa.table({"audio": pa.array([clips[0], b"not audio"], pa.binary())})
    with pytest.raises(DataFileError, match="cannot read audio") as info, quiet():
        datamill.preprocess(table, cfg, skip_save=True)
    assert info.value.row == 1 and info.value.column == "audio"
