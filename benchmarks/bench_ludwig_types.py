"""datamill's audio and h3 features beside real Ludwig 0.17.10's on the same generated files.

Ludwig runs in its own venv through ``bench_ludwig_side.py`` (see ``bench_ludwig.py`` for how the
venv is made; ``soundfile`` is in its package list, for the side script's ``torchaudio.load``).

* **audio** (:func:`make_audio`): 16 kHz WAV sines of known frequency and different lengths,
  silence, low noise and a FLAC file (no stereo file: Ludwig 0.17.10 fails on a mix of mono and
  stereo files, stacking them for its default audio); one feature per Ludwig audio ``type``
  (``raw``, ``stft``, ``stft_phase``, ``group_delay``, ``fbank``) plus ``fbank`` with ``norm:
  per_file``, a Hann window and 1024 FFT points, all in one config (Ludwig's ``mode: eager``, so its
  tensors are computed while preprocessing); a second table adds an 8 kHz file for ``raw`` and
  ``fbank`` (each file is transformed at its own rate, as Ludwig does).
* **h3** (:func:`make_h3`): 300 cells of resolutions 0-15 from the ``h3`` library.

Every tensor is compared row by row (rows matched by ``Id``): the largest difference where the
values are above float32 noise (see :func:`compare`: both tools compute float32 FFTs whose rounding
noise differs; a phase, a group delay or a per-file normalisation of that noise is noise). Times:
Ludwig's cold preprocess against datamill's (load average printed beside them).

Usage::

    .venv/bin/python benchmarks/bench_ludwig_types.py
        [--ludwig-python /work/.cache/ludwig-venv/bin/python] [--write-fixture]

``--write-fixture`` stores Ludwig's tensors (``tests/fixtures/ludwig/types_ludwig_tensors.npz``;
every 8th raw sample) and metadata (``types_ludwig_meta.json``);
``tests/preprocessing/test_ludwig_types.py`` regenerates the same files with :func:`make_audio` /
:func:`make_h3` and compares datamill with them.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from bench_ludwig import (  # Ludwig's venv runs bench_ludwig_side.py (one runner)
    ludwig_parser,
    ludwig_side,
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests/fixtures/ludwig"

#: name → Ludwig preprocessing of one audio feature (every feature reads the column ``audio``)
AUDIO_FEATURES: dict[str, dict[str, Any]] = {
    "araw": {"type": "raw"},
    "astft": {"type": "stft"},
    "aphase": {"type": "stft_phase"},
    "agd": {"type": "group_delay"},
    "afbank": {"type": "fbank"},
    "afbank2": {
        "type": "fbank",
        "norm": "per_file",
        "window_type": "hann",
        "num_fft_points": 1024,
        "num_filter_bands": 40,
    },
}
#: Ludwig 0.17.10's ModelConfig leaves an audio feature's unset preprocessing keys out of its
#: dict and preprocessing then fails (KeyError 'missing_value_strategy'), so every key is written
#: out: Ludwig's defaults, a 1.5 s limit (a float: Ludwig fails on an int limit) and eager mode
LUDWIG_AUDIO_DEFAULTS: dict[str, Any] = {
    "audio_file_length_limit_in_s": 1.5,
    "missing_value_strategy": "bfill",
    "fill_value": None,
    "in_memory": True,
    "padding_value": 0.0,
    "norm": None,
    "type": "fbank",
    "window_length_in_s": 0.04,
    "window_shift_in_s": 0.02,
    "num_fft_points": None,
    "window_type": "hamming",
    "num_filter_bands": 80,
    "mode": "eager",
}
#: the features the mixed-rate table is run with (stft widths depend on the rate: Ludwig fails)
MIXED_FEATURES = ("araw", "afbank")


def _audio_config(names: tuple[str, ...]) -> dict[str, Any]:
    feats = [{"name": "Id", "type": "number", "preprocessing": {"normalization": None}}]
    for name in names:
        pre = {**LUDWIG_AUDIO_DEFAULTS, **AUDIO_FEATURES[name]}
        feats.append({"name": name, "type": "audio", "column": "audio", "preprocessing": pre})
    return {
        "input_features": feats,
        "output_features": [{"name": "y", "type": "binary"}],
        "preprocessing": {"split": {"type": "fixed", "column": "split"}},
    }


CONFIGS: dict[str, dict[str, Any]] = {
    "audio": _audio_config(tuple(AUDIO_FEATURES)),
    "audio_mixed": _audio_config(MIXED_FEATURES),
    "h3": {
        "input_features": [{"name": "Id", "type": "number"}, {"name": "loc", "type": "h3"}],
        "output_features": [{"name": "y", "type": "binary"}],
        "preprocessing": {"split": {"type": "fixed", "column": "split"}},
    },
}


def make_audio(folder: Path, *, mixed: bool = False) -> Path:
    """The audio files and their table (``audio.csv``, or ``audio_mixed.csv`` with an 8 kHz file).

    The table holds absolute paths: Ludwig reads the first file's sample rate from the path as
    written, relative to its working folder (it resolves paths against the dataset's folder only
    for the tensors).
    """
    import soundfile as sf

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    sr = 16_000

    def tone(freq: float, seconds: float, rate: int = sr) -> np.ndarray:
        t = np.arange(int(seconds * rate)) / rate
        return 0.5 * np.sin(2 * np.pi * freq * t)

    files: list[tuple[str, np.ndarray, int]] = [
        ("sine440.wav", tone(440, 0.3), sr),
        ("sine1000.wav", tone(1000, 1.2), sr),
        ("sine3000.wav", tone(3000, 2.5), sr),
        ("silence.wav", np.zeros(sr), sr),
        ("noise.wav", rng.normal(0, 0.05, int(0.7 * sr)), sr),
        ("chord.flac", tone(700, 1.0) * 0.5 + tone(1900, 1.0) * 0.5, sr),
    ]
    if mixed:
        files.append(("sine1000_8k.wav", tone(1000, 1.5, 8000), 8000))
    for name, data, rate in files:
        sf.write(folder / name, data, rate, subtype="PCM_16")
    table = folder / ("audio_mixed.csv" if mixed else "audio.csv")
    lines = ["Id,audio,y,split"] + [
        f"{i},{folder.resolve() / name},{'1' if i % 2 else '0'},0"
        for i, (name, _, _) in enumerate(files)
    ]
    table.write_text("\n".join(lines) + "\n")
    return table


def make_h3(folder: Path, rows: int = 300) -> Path:
    """Cells of every resolution (the ``h3`` library), as decimal integers."""
    import h3.api.basic_int as h3i

    rng = np.random.default_rng(9)
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["Id,loc,y,split"]
    for i in range(rows):
        cell = h3i.latlng_to_cell(
            float(rng.uniform(-89, 89)), float(rng.uniform(-179, 179)), int(i % 16)
        )
        lines.append(f"{i},{cell},{i % 2},0")
    table = folder / "h3.csv"
    table.write_text("\n".join(lines) + "\n")
    return table


def run_ludwig(ludwig_python: Path, config: dict[str, Any], data: Path) -> dict[str, Any]:
    """Ludwig's tensors (training rows, ordered by ``Id``), metadata and times for one config."""
    work = Path(tempfile.mkdtemp(prefix="bench_ludwig_types_"))
    proc = ludwig_side(ludwig_python, config, data, work / "out")
    if proc.returncode != 0:
        raise SystemExit(f"Ludwig failed:\n{proc.stderr[-3000:]}")
    meta = json.loads((work / "out/ludwig_meta.json").read_text())
    npz = np.load(work / "out/ludwig_tensors.npz")
    order = np.argsort(npz["training/Id"])
    tensors = {
        f["name"]: np.asarray(npz[f"training/{f['name']}"])[order]
        for f in config["input_features"]
        if f"training/{f['name']}" in npz
    }
    times = json.loads((work / "out/ludwig_times.json").read_text())
    return {"tensors": tensors, "meta": meta, "times": times}


def run_datamill(config: dict[str, Any], data: Path) -> tuple[dict[str, np.ndarray], Any, float]:
    """datamill's tensors (rows in file order), metadata and best cold time of three."""
    import datamill
    from datamill.core.progress import set_quiet

    set_quiet(True)
    best = float("inf")
    out = None
    for _ in range(3):
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = datamill.preprocess(data, config, skip_save=True)
        best = min(best, time.perf_counter() - t)
    assert out is not None
    return out.data, out.metadata, best


def signal_bands(paths: list[str], pre: dict[str, Any], length: int) -> np.ndarray:
    """``files × frames × bands``: where an ``fbank`` band holds signal (energy above 1e-6 of the
    file's peak in some frame) that changes over the frames (its log spread is above 1e-3);
    elsewhere ``norm: per_file`` divides float32 noise by its own spread (a band of a steady sine is
    the same in every frame), which gives noise up to 1e4 in Ludwig."""
    import soundfile as sf

    from datamill.preprocessing.features._audio_dsp import file_feature

    out = np.zeros((len(paths), length, pre["num_filter_bands"]), bool)
    for i, path in enumerate(paths):
        x, rate = sf.read(path, dtype="float32", always_2d=True)
        kw = {"wl": pre["window_length_in_s"], "ws": pre["window_shift_in_s"]}
        e = np.exp(
            file_feature(
                x[:, 0],
                rate,
                kind="fbank",
                n_fft=pre["num_fft_points"],
                window_type=pre["window_type"],
                bands=pre["num_filter_bands"],
                **kw,
            ).astype(np.float64)
        )
        logs = np.log(e)
        spread = logs.std(axis=0, ddof=1) if len(logs) > 1 else np.zeros(logs.shape[1])
        band = ((e - 1e-10).max(axis=0) > 1e-6 * e.max()) & (spread > 1e-3)
        n = min(len(e), length)
        out[i, :n] = band
    return out


def compare(name: str, lw: dict[str, np.ndarray], dm: dict[str, np.ndarray], **ref: Any) -> str:
    """One line: shapes and the largest difference, where the values are above float32 noise.

    ``stft_phase``: the phase of bins whose magnitude is above 1e-3 of the frame's peak (the angle
    of float32 noise is noise); ``group_delay``: bins whose power is above 1e-6 of the frame's peak
    (it divides by that power), relative to ``max(|value|, 1)``; ``fbank``: the energies
    (``exp``), relative to the frame's peak; ``fbank`` with ``norm: per_file``: the bands holding
    signal (:func:`signal_bands`).
    """
    a, b = lw[name].astype(np.float64), dm[name].astype(np.float64)
    if a.shape != b.shape:
        return f"{name}: shapes differ, Ludwig {a.shape} datamill {b.shape}"
    line = f"{name}: {a.shape} max |diff| {np.abs(a - b).max():.3g}"
    if name == "aphase":
        half = a.shape[-1] // 2
        strong = a[..., half:] > 1e-3 * a[..., half:].max(axis=-1, keepdims=True)
        d = np.abs(np.angle(np.exp(1j * (a[..., :half] - b[..., :half]))))[strong]
        m = np.abs(a[..., half:] - b[..., half:]) / max(np.abs(a[..., half:]).max(), 1e-30)
        line += f"; magnitude rel {m.max():.3g}; phase of strong bins max {d.max():.3g} rad"
    elif name == "agd":
        power = lw["astft"].astype(np.float64) ** 2
        strong = power > 1e-6 * power.max(axis=-1, keepdims=True)
        rel = np.abs(a - b)[strong] / np.maximum(np.abs(a)[strong], 1.0)
        line += f"; bins with power above 1e-6 of the peak: rel {rel.max():.3g}"
    elif name in ("afbank",):
        ea, eb = np.exp(a), np.exp(b)
        rel = np.abs(ea - eb) / ea.max(axis=-1, keepdims=True)
        line += f"; energies rel to the frame's peak {rel.max():.3g}"
    elif name == "afbank2" and "bands" in ref:
        line += f"; bands with signal max |diff| {np.abs(a - b)[ref['bands']].max():.3g}"
    else:
        line += f" (rel {np.abs(a - b).max() / max(np.abs(a).max(), 1e-30):.3g})"
    return line


def main() -> None:
    args = ludwig_parser(__doc__.splitlines()[0]).parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_ludwig_types_"))
    tables = {
        "audio": make_audio(work / "audio"),
        "audio_mixed": make_audio(work / "audio", mixed=True),
        "h3": make_h3(work / "h3"),
    }
    stored: dict[str, np.ndarray] = {}
    metas: dict[str, Any] = {}
    for cname, config in CONFIGS.items():
        lw = run_ludwig(args.ludwig_python, config, tables[cname])
        dm, dm_meta, dm_cold = run_datamill(config, tables[cname])
        ref = {}
        if "afbank2" in dm:
            paths = [ln.split(",")[1] for ln in tables[cname].read_text().splitlines()[1:]]
            pre = next(f for f in config["input_features"] if f["name"] == "afbank2")
            ref["bands"] = signal_bands(paths, pre["preprocessing"], dm["afbank2"].shape[1])
        for f in config["input_features"][1:]:
            name = f["name"]
            print(f"[{cname}] " + compare(name, lw["tensors"], dm, **ref), flush=True)
            # raw samples: every 8th stored (the fixture stays small; equality is exact)
            stored[f"{cname}/{name}"] = (
                lw["tensors"][name][:, ::8] if name == "araw" else (lw["tensors"][name])
            )
            m = lw["meta"][name]
            keys = ("feature_dim", "max_length", "sampling_rate_in_hz", "reshape")
            metas[f"{cname}/{name}"] = {k: m[k] for k in keys if k in m}
            if "feature_dim" in m:
                ours = {k: dm_meta[name].get(k) for k in keys}
                print(f"    metadata Ludwig {metas[f'{cname}/{name}']} datamill {ours}")
        load = os.getloadavg()[0]
        print(
            f"[{cname}] cold preprocess: Ludwig {lw['times']['cold']:.3f} s, datamill "
            f"{dm_cold:.3f} s (best of 3), ratio {lw['times']['cold'] / dm_cold:.1f}x, "
            f"load average {load:.2f}",
            flush=True,
        )
    if args.write_fixture:
        np.savez_compressed(FIXTURE / "types_ludwig_tensors.npz", **stored)
        (FIXTURE / "types_ludwig_meta.json").write_text(json.dumps(metas, indent=1) + "\n")
        (FIXTURE / "types_configs.json").write_text(json.dumps(CONFIGS, indent=1) + "\n")
        print(f"fixture written to {FIXTURE}")


if __name__ == "__main__":
    main()
