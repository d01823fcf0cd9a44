"""Ludwig's side of ``bench_ludwig.py``: run in Ludwig's own venv, never in datamill's.

Usage: <ludwig-venv>/bin/python benchmarks/bench_ludwig_side.py CONFIG.yaml DATA.csv OUT_DIR
[--repeat N]

Preprocesses DATA.csv with Ludwig's ``preprocess_for_training`` (seed 42) in a scratch copy of the
file (Ludwig writes its cache beside the input), then writes to OUT_DIR:
``ludwig_meta.json`` (Ludwig's training-set metadata), ``ludwig_tensors.npz`` (per split, every
feature's preprocessed column: ``<split>/<feature>``) and ``ludwig_times.json`` (import, cold and
cached seconds). Nothing else from datamill is imported.

Shims, because the PyPI torchvision/torchaudio wheels link CUDA libraries this CPU machine lacks and
Ludwig 0.17 declares Python >= 3.12 (installed with ``--ignore-requires-python``): torchvision's
fake-kernel registrations that fail are skipped, and ``torchaudio`` is a stub module whose ``load``
reads with ``soundfile`` and whose ``functional.lfilter`` is ``scipy.signal.lfilter`` (the two
torchaudio calls Ludwig's audio features make; everything else is Ludwig's own code).
"""

from __future__ import annotations

import importlib.machinery
import json
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path


def _shims() -> None:
    import torch
    import torch.library

    original = torch.library.register_fake

    def register_fake(op, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not str(op).startswith("torchvision::"):
            return original(op, *args, **kwargs)

        def wrap(fn):  # type: ignore[no-untyped-def]
            try:
                return original(op, *args, **kwargs)(fn)
            except RuntimeError:  # torchvision's C ops are not loaded (CUDA-linked wheel)
                return fn

        return wrap

    torch.library.register_fake = register_fake
    stub = types.ModuleType("torchaudio")
    stub.__version__ = "0"  # type: ignore[attr-defined]
    stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
    stub.load = _load  # type: ignore[attr-defined]
    functional = types.ModuleType("torchaudio.functional")
    functional.lfilter = _lfilter  # type: ignore[attr-defined]
    stub.functional = functional  # type: ignore[attr-defined]
    sys.modules["torchaudio"] = stub
    sys.modules["torchaudio.functional"] = functional


def _load(path):  # type: ignore[no-untyped-def]
    """torchaudio.load's result (channels × frames float32 in [-1, 1], rate) read by soundfile:
    torchaudio 2.11 cannot load here (its C library) and delegates reading to torchcodec anyway."""
    import soundfile
    import torch

    data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    return torch.from_numpy(data.T.copy()), int(rate)


def _lfilter(waveform, a_coeffs, b_coeffs, clamp=True):  # type: ignore[no-untyped-def]  # noqa: FBT002 - torchaudio's signature
    """torchaudio.functional.lfilter by scipy.signal.lfilter (Ludwig's own comment: "parity with
    scipy.signal.lfilter"), in float64 as Ludwig calls it."""
    import scipy.signal
    import torch

    y = scipy.signal.lfilter(b_coeffs.numpy(), a_coeffs.numpy(), waveform.numpy(), axis=-1)
    return torch.from_numpy(y)


def main() -> None:
    config_path, data_path, out_dir = (Path(a) for a in sys.argv[1:4])
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 1
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    _shims()
    import logging

    import numpy as np
    import yaml
    from ludwig.data.preprocessing import preprocess_for_training
    from ludwig.schema.model_types.base import ModelConfig
    from ludwig.utils.config_utils import get_preprocessing_params

    logging.disable(logging.WARNING)
    t_import = time.perf_counter() - t0
    raw = yaml.safe_load(config_path.read_text())
    config_obj = ModelConfig.from_dict(raw)
    config = config_obj.to_dict()  # what LudwigModel does with a user's config
    # LudwigModel passes the config's global preprocessing (split, ...) itself, as
    # get_preprocessing_params makes it; preprocess_for_training's own default is Ludwig's default
    # (a random 0.7/0.1/0.2 split)
    params = get_preprocessing_params(config_obj)
    scratch = Path(tempfile.mkdtemp(prefix="ludwig_side_"))
    data = scratch / data_path.name
    shutil.copyfile(data_path, data)
    times: dict[str, float] = {"import": t_import}
    try:
        for attempt in range(repeat):
            for old in scratch.glob("*.hdf5"):
                old.unlink()
            for old in scratch.glob("*.meta.json"):
                old.unlink()
            t = time.perf_counter()
            train, val, test, meta = preprocess_for_training(
                config,
                dataset=str(data),
                random_seed=42,
                skip_save_processed_input=False,
                preprocessing_params=params,
            )
            times.setdefault("cold", time.perf_counter() - t)
            times["cold"] = min(times["cold"], time.perf_counter() - t)
            t = time.perf_counter()
            preprocess_for_training(
                config,
                dataset=str(data),
                random_seed=42,
                skip_save_processed_input=False,
                preprocessing_params=params,
            )
            cached = time.perf_counter() - t
            times["cached"] = min(times.get("cached", cached), cached)
            del attempt
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    features = raw["input_features"] + raw["output_features"]
    arrays = {}
    for name, ds in (("training", train), ("validation", val), ("test", test)):
        if ds is None:
            continue
        for f in features:
            proc = meta[f["name"]].get("proc_column") or f["name"]
            for key, value in ds.dataset.items():
                if key == proc or key.startswith(f["name"] + "_"):
                    arrays[f"{name}/{f['name']}"] = np.asarray(value)
    np.savez_compressed(out_dir / "ludwig_tensors.npz", **arrays)
    (out_dir / "ludwig_meta.json").write_text(
        json.dumps(meta, indent=1, sort_keys=True, default=str)
    )
    (out_dir / "ludwig_times.json").write_text(json.dumps(times, indent=1))
    print(json.dumps(times))


if __name__ == "__main__":
    main()
