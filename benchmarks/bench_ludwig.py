"""datamill vs Ludwig 0.17.10 on the same Ludwig config and dataset: values compared, time ratios.

Ludwig lives in its own venv (it pins torch/transformers versions and declares Python >= 3.12); it
runs ``bench_ludwig_side.py`` there, which writes Ludwig's metadata, its preprocessed tensors (per
split) and its times. This script then preprocesses the same file with datamill and compares,
feature by feature: vocabularies (as decoded strings), fill values, statistics and every tensor row
(rows matched through the ``Id`` feature, since Ludwig shuffles its splits), and prints the
differences and the time ratios (import, cold, cached, CLI end to end).

The comparison fits datamill on every row (``split: {type: none}``), as Ludwig does (it fits
before it splits); datamill's default fits on the training rows only (a deliberate difference, see
the README's "Typed preprocessing"). The split sizes are compared on the default run.

Set-up of Ludwig's venv (about 4 minutes; ``torch==2.13.0`` first: the CPU wheel is the local one, a
plain torch requirement would pull GBs of CUDA). ``pip install ludwig==0.17.10`` alone fails on
Python 3.11 ("Requires-Python >=3.12"), hence ``--no-deps --ignore-requires-python`` and the light
dependencies::

    python3 -m venv /work/.cache/ludwig-venv && P=/work/.cache/ludwig-venv/bin/pip
    $P install torch==2.13.0
    $P install --no-deps --ignore-requires-python ludwig==0.17.10
    $P install --no-deps torchvision==0.28.0 torchaudio
    $P install absl-py dataclasses-json datasets filelock "fsspec[http]" jsonschema lxml numpy \\
        pandas "protobuf>=4" psutil py-cpuinfo pyarrow pyyaml requests retry rich safetensors \\
        scikit-learn scipy sentencepiece tabulate torchinfo torchmetrics tqdm "transformers>=5" \\
        xlrd openpyxl Pillow h5py gpustat sacremoses soundfile

Usage::

    .venv/bin/python benchmarks/bench_ludwig.py
        [--ludwig-python /work/.cache/ludwig-venv/bin/python] [--scale 100] [--write-fixture]

Two companions use the same venv and ``bench_ludwig_side.py``: ``bench_ludwig_rows.py`` (the rows of
a hash split and of ``sample_ratio``, binary labels, fill values, Ludwig's refusals) and
``bench_ludwig_types.py`` (every audio ``type`` and h3, with times).

``--write-fixture`` stores Ludwig's output on house_prices_train.csv in ``tests/fixtures/ludwig/``
(what ``tests/preprocessing/test_ludwig_fixture.py`` checks datamill against).

``--dataset penguins``: the second dataset, generated (:func:`make_penguins`: categories with
missing values, padding and mixed case, sets, bags, text, sequences, dates, vectors, time series, a
few rows without a target) with its Ludwig user config ``tests/fixtures/ludwig/penguins.yaml``
(stratified split, ``drop_row``, text with Ludwig 0.17's keys, ``lowercase``). datamill runs it with
``preprocessing.layout: ludwig017`` and ``split: none`` and every feature is compared as decoded
tokens/values; ``--write-fixture`` regenerates ``penguins.csv`` and stores Ludwig's output as
``penguins_ludwig_{meta.json,tensors.npz}`` (``tests/preprocessing/test_ludwig_penguins.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "tests/fixtures/ludwig/house_prices.yaml"
FIXTURE = ROOT / "tests/fixtures/ludwig"
SPLITS = ("training", "validation", "test")
_LUDWIG_ONLY = ("checksum", "data_train_parquet_fp", "dataset_src")


PENGUINS_CONFIG = ROOT / "tests/fixtures/ludwig/penguins.yaml"
PENGUINS_CSV = ROOT / "tests/fixtures/ludwig/penguins.csv"


def make_penguins(path: Path, rows: int = 344, seed: int = 7) -> None:
    """A generated penguin-like table with every feature type: categories with missing values,
    padding and mixed case, sets, bags, text, sequences, dates, vectors, time series; a few rows
    without a species."""
    import csv

    rng = np.random.default_rng(seed)
    species = rng.choice(["Adelie", "Gentoo", "Chinstrap"], size=rows, p=[0.44, 0.36, 0.20])
    islands = {
        "Adelie": ["Torgersen", "Biscoe", "Dream"],
        "Gentoo": ["Biscoe"],
        "Chinstrap": ["Dream"],
    }
    food = ["fish", "krill", "squid", "Krill", "crab", "Fish", "algae"]
    tagset = ["banded", "Rare", "tagged", "chick", "adult", "molting", "rare"]
    notes = [
        "Seen near the shore.",
        "calm, feeding",
        "Nest with two eggs!",
        "chick fed by parent",
        "Observed at dawn; windy and cold.",
        "Rare sighting near colony",
        "tagged, measured and released",
    ]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "Id",
                "species",
                "island",
                "sex",
                "bill_length_mm",
                "body_mass_g",
                "healthy",
                "tags",
                "diet",
                "notes",
                "call",
                "observed",
                "embedding",
                "dives",
            ]
        )
        for i in range(rows):  # one row at a time: a few hundred rows of test data
            sp = str(species[i])
            island = str(rng.choice(islands[sp]))
            island = (
                f" {island} " if rng.random() < 0.1 else island
            )  # padded: stripped by both tools
            island = "" if rng.random() < 0.08 else island
            sex = str(
                rng.choice(
                    ["MALE", "female", "Female", "male", ""], p=[0.3, 0.25, 0.15, 0.22, 0.08]
                )
            )
            bill = "" if rng.random() < 0.05 else f"{rng.normal(44, 5):.1f}"
            mass = f"{rng.normal(4200, 800):.0f}"
            healthy = str(rng.choice(["yes", "no"], p=[0.8, 0.2]))
            tags = (
                ""
                if rng.random() < 0.1
                else " ".join(rng.choice(tagset, size=rng.integers(1, 4), replace=False))
            )
            diet = (
                "" if rng.random() < 0.05 else " ".join(rng.choice(food, size=rng.integers(1, 6)))
            )
            note = "" if rng.random() < 0.1 else str(rng.choice(notes))
            call = " ".join(rng.choice(["kaw", "kee", "ark", "hrr"], size=rng.integers(1, 5)))
            day = f"2021-{rng.integers(1, 13):02d}-{rng.integers(1, 29):02d}"
            emb = " ".join(f"{v:.3f}" for v in rng.normal(0, 1, 4))
            dives = " ".join(f"{v:.1f}" for v in rng.uniform(0, 60, rng.integers(2, 6)))
            sp = "" if i % 70 == 13 else sp  # a target missing: drop_row
            w.writerow(
                [
                    i + 1,
                    sp,
                    island,
                    sex,
                    bill,
                    mass,
                    healthy,
                    tags,
                    diet,
                    note,
                    call,
                    day,
                    emb,
                    dives,
                ]
            )


def _data_dir() -> Path:
    return Path(os.environ.get("DATAMILL_DATA", ROOT.parent / "shared/data"))


def compare(
    ludwig_meta: dict[str, Any], tensors: Any, data: dict[str, Any], meta: Any
) -> list[str]:
    """Every difference between Ludwig's output and datamill's (fitted on the same rows), as
    lines."""
    diffs: list[str] = []
    pos = {int(v): i for i, v in enumerate(np.asarray(data["Id"]))}
    for name, lm in ludwig_meta.items():
        if name in _LUDWIG_ONLY:
            continue
        dm = meta[name]
        kind = dm["type"]
        lp, dp = lm.get("preprocessing", {}), dm.get("preprocessing", {})
        lfill, dfill = lp.get("computed_fill_value"), dp.get("computed_fill_value")
        if kind == "number":
            for stat in ("mean", "std", "min", "max"):
                if stat in lm and not np.isclose(float(lm[stat]), dm[stat], rtol=1e-6):
                    diffs.append(f"{name}: {stat} Ludwig {lm[stat]} datamill {dm[stat]}")
            if (
                lfill is not None
                and dfill is not None
                and not np.isclose(float(lfill), float(dfill))
            ):
                diffs.append(f"{name}: computed_fill_value Ludwig {lfill} datamill {dfill}")
        elif kind == "category":
            lv = {k: v for k, v in lm["str2freq"].items() if v}
            dv = {k: v for k, v in dm["str2freq"].items() if v}
            if lv != dv:
                diffs.append(
                    f"{name}: str2freq differs: {sorted(set(lv.items()) ^ set(dv.items()))[:6]}"
                )
            if lfill != dfill:
                diffs.append(f"{name}: computed_fill_value Ludwig {lfill!r} datamill {dfill!r}")
        elif kind == "binary" and lm["bool2str"] != dm["bool2str"]:
            diffs.append(f"{name}: bool2str Ludwig {lm['bool2str']} datamill {dm['bool2str']}")
        for split in SPLITS:
            key = f"{split}/{name}"
            if key not in tensors.files:
                continue
            lt = tensors[key]
            rows = np.array([pos[int(v)] for v in tensors[f"{split}/Id"]], dtype=np.int64)
            dt = np.asarray(data[name])[rows]
            if kind == "category":
                ok = (np.asarray(lm["idx2str"])[lt.astype(np.int64)] == meta.decode(name, dt)).all()
            elif kind == "number":
                ok = np.allclose(lt, dt, rtol=2e-7, atol=1e-6)
            else:
                ok = (lt == dt).all()
            if not ok:
                diffs.append(f"{name}: {split} tensor differs")
    return diffs


def compare_decoded(
    ludwig_meta: dict[str, Any], tensors: Any, data: dict[str, Any], meta: Any
) -> list[str]:
    """Per feature of any type: ``name: equal`` or what differs, Ludwig's rows matched through
    ``Id``."""
    pos = {int(v): i for i, v in enumerate(np.asarray(data["Id"]))}
    lines = []
    for name, lm in ludwig_meta.items():
        if name in _LUDWIG_ONLY or name not in data:
            continue
        theirs = np.concatenate(
            [tensors[f"{s}/{name}"] for s in SPLITS if f"{s}/{name}" in tensors.files]
        )
        rows = np.array([pos[int(v)] for s in SPLITS for v in tensors[f"{s}/Id"]], dtype=np.int64)
        ours = np.asarray(data[name])[rows]
        if theirs.shape != ours.shape or theirs.dtype != ours.dtype:
            lines.append(
                f"{name}: shape/dtype Ludwig {theirs.shape} {theirs.dtype}, datamill "
                f"{ours.shape} {ours.dtype}"
            )
            continue
        if "idx2str" in lm:
            lv, dv = np.asarray(lm["idx2str"]), np.asarray(meta[name]["idx2str"])
            if theirs.ndim == 1:
                same = lv[theirs.astype(np.int64)] == dv[ours.astype(np.int64)]
            elif (
                meta[name].get("max_set_size") is not None
            ):  # set/bag: the same token counts per row
                order = np.array([list(dv).index(t) if t in set(dv) else -1 for t in lv])
                same = np.array(
                    [
                        (order >= 0).all() and (r == o[order]).all() and r.sum() == o.sum()
                        for r, o in zip(theirs, ours)
                    ]
                )
            else:
                same = (lv[theirs.astype(np.int64)] == dv[ours.astype(np.int64)]).all(axis=1)
        elif theirs.dtype.kind == "f":
            same = np.isclose(theirs, ours, rtol=2e-7, atol=1e-6).reshape(len(rows), -1).all(axis=1)
        else:
            same = (theirs == ours).reshape(len(rows), -1).all(axis=1)
        n_bad = int((~np.asarray(same)).sum())
        lines.append(
            f"{name} ({meta[name]['type']}): "
            + ("equal" if n_bad == 0 else f"{n_bad} of {len(rows)} rows differ")
        )
    return lines


def ludwig_side(
    python: Path, config: Path | dict[str, Any], data: Path, out: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run ``bench_ludwig_side.py`` in Ludwig's venv (``python``) on ``config`` (a YAML file, or a
    dict written as ``config.yaml`` beside ``out``) and ``data``, writing into ``out``; the
    finished process (the three Ludwig benchmarks share this runner)."""
    if not isinstance(config, Path):
        import yaml

        out.parent.mkdir(parents=True, exist_ok=True)
        path = out.parent / "config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        config = path
    side = Path(__file__).with_name("bench_ludwig_side.py")
    return subprocess.run(
        [str(python), str(side), str(config), str(data), str(out), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def _run_ludwig(python: Path, config: Path, csv: Path, out: Path, repeat: int) -> dict[str, float]:
    done = ludwig_side(python, config, csv, out, "--repeat", str(repeat))
    if done.returncode != 0:
        raise SystemExit(f"Ludwig's side failed:\n{done.stderr[-3000:]}")
    times: dict[str, float] = json.loads((out / "ludwig_times.json").read_text())
    return times


def _time_cli(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return time.perf_counter() - t


def _datamill(config: dict[str, Any], csv: Path, repeat: int) -> tuple[Any, dict[str, float]]:
    t = time.perf_counter()
    from datamill.preprocessing import api

    times = {"import": time.perf_counter() - t}
    work = Path(tempfile.mkdtemp(prefix="bench_ludwig_"))
    try:
        local = work / csv.name
        shutil.copyfile(csv, local)
        for _ in range(repeat):
            for old in work.glob("*.meta.json"):
                old.unlink()
            t = time.perf_counter()
            out = api.preprocess(local, config)
            times["cold"] = min(times.get("cold", 1e9), time.perf_counter() - t)
            t = time.perf_counter()
            hit = api.preprocess(local, config)
            assert hit.cached
            times["cached"] = min(times.get("cached", 1e9), time.perf_counter() - t)
        _ = out.data
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out, times


def ludwig_parser(description: str) -> argparse.ArgumentParser:
    """The options every Ludwig benchmark takes: ``--ludwig-python`` (Ludwig's venv, or
    ``$LUDWIG_PYTHON``) and ``--write-fixture``."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument(
        "--ludwig-python",
        type=Path,
        default=Path(
            os.environ.get("LUDWIG_PYTHON", ROOT.parent / ".cache/ludwig-venv/bin/python")
        ),
    )
    ap.add_argument(
        "--write-fixture", action="store_true", help=f"store Ludwig's output in {FIXTURE}"
    )
    return ap


def main() -> None:
    ap = ludwig_parser(__doc__.split("\n\n")[0])
    ap.add_argument(
        "--scale", type=int, default=1, help="repeat the CSV's rows this many times (timings)"
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dataset", choices=("house_prices", "penguins"), default="house_prices")
    args = ap.parse_args()
    import yaml

    if args.dataset == "penguins":
        _penguins(args)
        return

    csv = _data_dir() / "house_prices_train.csv"
    work = Path(tempfile.mkdtemp(prefix="bench_ludwig_"))
    if args.scale > 1:
        lines = csv.read_text().splitlines(keepends=True)
        big = work / f"house_prices_x{args.scale}.csv"
        body = lines[1:]
        with big.open("w") as f:  # Ids made unique per copy so rows can still be matched
            f.write(lines[0])
            for k in range(args.scale):
                for line in body:
                    head, rest = line.split(",", 1)
                    f.write(f"{int(head) + k * 100000},{rest}")
        csv = big
    if not args.ludwig_python.exists():
        raise SystemExit(
            f"no Ludwig venv at {args.ludwig_python}: create it as this script's docstring says"
        )
    lw_out = work / "ludwig"
    lw_times = _run_ludwig(args.ludwig_python, CONFIG, csv, lw_out, args.repeat)
    ludwig_meta = {
        k: v
        for k, v in json.loads((lw_out / "ludwig_meta.json").read_text()).items()
        if k not in _LUDWIG_ONLY
    }
    tensors = np.load(lw_out / "ludwig_tensors.npz")
    raw = yaml.safe_load(CONFIG.read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one notice about the model keys
        same_rows, dm_times = _datamill(
            {**raw, "preprocessing": {"split": {"type": "none"}}}, csv, args.repeat
        )
        default, _ = _datamill(raw, csv, 1)
    diffs = compare(ludwig_meta, tensors, same_rows.data, same_rows.metadata)
    sizes = [len(tensors[f"{s}/Id"]) for s in SPLITS]
    ours = list(default.metadata.header["split"].values())
    print(f"rows: {sum(sizes)}; split sizes Ludwig {sizes} datamill {ours}")
    print("differences (datamill fitted on every row, as Ludwig):", "none" if not diffs else "")
    for d in diffs:
        print("  " + d)
    cli = [
        sys.executable,
        "-c",
        "import sys; from datamill.cli import main; sys.exit(main())",
        "--quiet",
        "preprocess",
        str(csv),
        "--config",
        str(CONFIG),
        "--output-dir",
        str(work / "cli"),
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    dm_times["cli_cold"] = _time_cli(cli, env)
    dm_times["cli_cached"] = _time_cli(cli, env)
    print(f"{'measure':<10} {'Ludwig s':>10} {'datamill s':>11} {'ratio':>7}")
    for k in ("import", "cold", "cached"):
        print(
            f"{k:<10} {lw_times[k]:>10.3f} {dm_times[k]:>11.3f} {lw_times[k] / dm_times[k]:>6.1f}x"
        )
    for k in ("cli_cold", "cli_cached"):
        print(f"{k:<10} {'':>10} {dm_times[k]:>11.3f}")
    if args.write_fixture:
        if args.scale != 1:
            raise SystemExit("--write-fixture stores the 1x run only")
        FIXTURE.mkdir(parents=True, exist_ok=True)
        (FIXTURE / "ludwig_meta.json").write_text(
            json.dumps(ludwig_meta, indent=1, sort_keys=True) + "\n"
        )
        shutil.copyfile(lw_out / "ludwig_tensors.npz", FIXTURE / "ludwig_tensors.npz")
        print(f"fixture written to {FIXTURE}")
    shutil.rmtree(work, ignore_errors=True)


def _penguins(args: argparse.Namespace) -> None:
    """The generated dataset: every feature type, compared as decoded values; stratified sizes."""
    import yaml

    work = Path(tempfile.mkdtemp(prefix="bench_ludwig_"))
    csv = PENGUINS_CSV if not args.write_fixture else work / "penguins.csv"
    if args.write_fixture:
        make_penguins(csv)
    if not args.ludwig_python.exists():
        raise SystemExit(
            f"no Ludwig venv at {args.ludwig_python}: create it as this script's docstring says"
        )
    lw_out = work / "ludwig"
    lw_times = _run_ludwig(args.ludwig_python, PENGUINS_CONFIG, csv, lw_out, args.repeat)
    ludwig_meta = {
        k: v
        for k, v in json.loads((lw_out / "ludwig_meta.json").read_text()).items()
        if k not in _LUDWIG_ONLY
    }
    tensors = np.load(lw_out / "ludwig_tensors.npz")
    raw = yaml.safe_load(PENGUINS_CONFIG.read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one notice about the model keys
        same_rows, dm_times = _datamill(
            {**raw, "preprocessing": {"split": {"type": "none"}, "layout": "ludwig017"}},
            csv,
            args.repeat,
        )
        default, _ = _datamill(raw, csv, 1)
    sizes = [len(tensors[f"{s}/Id"]) for s in SPLITS]
    print(
        f"stratified split sizes: Ludwig {sizes} datamill "
        f"{list(default.metadata.header['split'].values())}"
    )
    print(
        "per feature (datamill with layout: ludwig017, fitted on every row as Ludwig; a "
        "difference is a row of"
        " docs/ludwig-differences.md: statistics fitted before drop_row, category lowercase, "
        "bag lowercase):"
    )
    for line in compare_decoded(ludwig_meta, tensors, same_rows.data, same_rows.metadata):
        print("  " + line)
    print(f"{'measure':<10} {'Ludwig s':>10} {'datamill s':>11} {'ratio':>7}")
    for k in ("import", "cold", "cached"):
        print(
            f"{k:<10} {lw_times[k]:>10.3f} {dm_times[k]:>11.3f} {lw_times[k] / dm_times[k]:>6.1f}x"
        )
    if args.write_fixture:
        shutil.copyfile(csv, PENGUINS_CSV)
        (FIXTURE / "penguins_ludwig_meta.json").write_text(
            json.dumps(ludwig_meta, indent=1, sort_keys=True) + "\n"
        )
        shutil.copyfile(lw_out / "ludwig_tensors.npz", FIXTURE / "penguins_ludwig_tensors.npz")
        print(f"fixture written to {FIXTURE}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
