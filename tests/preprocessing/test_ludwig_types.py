"""audio and h3 against real Ludwig 0.17.10's stored tensors (``benchmarks/bench_ludwig_types.py``).

The input files are regenerated with the benchmark's own generators (deterministic sines, silence,
seeded noise, seeded H3 cells); the tolerances are float32's where the values are above float32
noise (the benchmark's ``compare`` says why each is masked as it is).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import datamill
from datamill.core.progress import quiet

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/fixtures/ludwig"
LUDWIG = np.load(FIXTURE / "types_ludwig_tensors.npz")
META = json.loads((FIXTURE / "types_ludwig_meta.json").read_text())
CONFIGS = json.loads((FIXTURE / "types_configs.json").read_text())


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # as `python benchmarks/...` runs it: bench_ludwig
    spec = importlib.util.spec_from_file_location(
        "bench_ludwig_types", ROOT / "benchmarks/bench_ludwig_types.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_ludwig_types"] = module
    spec.loader.exec_module(module)
    return module


def _run(config: dict[str, Any], table: Path) -> Any:
    with warnings.catch_warnings(), quiet():
        warnings.simplefilter("ignore")
        return datamill.preprocess(table, config, skip_save=True)


@pytest.mark.parametrize("cname", ["audio", "audio_mixed"])
def test_audio_tensors_equal_ludwigs(
    cname: str, bench: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    table = bench.make_audio(tmp_path_factory.mktemp("audio"), mixed=cname == "audio_mixed")
    out = _run(CONFIGS[cname], table)
    for f in CONFIGS[cname]["input_features"][1:]:
        name = f["name"]
        want = LUDWIG[f"{cname}/{name}"].astype(np.float64)
        ours = out.data[name].astype(np.float64)
        if name == "araw":
            ours = ours[:, ::8]
        assert ours.shape == want.shape, name
        meta = {k: out.metadata[name][k] for k in META[f"{cname}/{name}"]}
        assert meta == META[f"{cname}/{name}"], name
        peak = np.abs(want).max()
        if name in ("araw",):
            np.testing.assert_array_equal(ours, want)
        elif name == "astft":
            assert np.abs(ours - want).max() <= 1e-6 * peak
        elif name == "aphase":
            half = want.shape[-1] // 2
            mag = want[..., half:]
            assert np.abs(ours[..., half:] - mag).max() <= 1e-6 * mag.max()
            strong = mag > 1e-3 * mag.max(axis=-1, keepdims=True)
            dphase = np.angle(np.exp(1j * (ours[..., :half] - want[..., :half])))
            assert np.abs(dphase[strong]).max() < 1e-3
        elif name == "agd":
            power = LUDWIG[f"{cname}/astft"].astype(np.float64) ** 2
            strong = power > 1e-6 * power.max(axis=-1, keepdims=True)
            rel = np.abs(ours - want)[strong] / np.maximum(np.abs(want)[strong], 1.0)
            assert rel.max() < 5e-3
        elif name == "afbank":
            e_want, e_ours = np.exp(want), np.exp(ours)
            assert (np.abs(e_ours - e_want) / e_want.max(axis=-1, keepdims=True)).max() < 1e-5
        else:  # afbank2: norm per_file, where a band holds changing signal
            paths = [ln.split(",")[1] for ln in table.read_text().splitlines()[1:]]
            bands = bench.signal_bands(paths, f["preprocessing"], want.shape[1])
            assert bands.any() and np.abs(ours - want)[bands].max() < 1e-2


def test_h3_components_equal_ludwigs(
    bench: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    table = bench.make_h3(tmp_path_factory.mktemp("h3"))
    out = _run(CONFIGS["h3"], table)
    np.testing.assert_array_equal(out.data["loc"], LUDWIG["h3/loc"])
    assert out.data["loc"].dtype == LUDWIG["h3/loc"].dtype == np.uint8
