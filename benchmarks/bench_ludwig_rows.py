"""The rows Ludwig 0.17.10 picks, beside datamill's: hash split, ``sample_ratio``, binary
``fallback_true_label``, an output's ``computed_fill_value`` under ``drop_row``, and the two configs
Ludwig refuses (a binary column of three values, ``iq`` with an interquartile range of 0).

Ludwig runs in its own venv through ``bench_ludwig_side.py`` (see ``bench_ludwig.py`` for how the
venv is made). The data is generated (:func:`make_rows`, 400 rows: string ids with a non-ASCII
value, a quote and a missing id; integer ids; Y/N and human/bot binaries; a category target with
missing values). Each config of ``CONFIGS`` is run by Ludwig and by datamill and compared: which
``Id`` goes to which split, the kept rows, ``fallback_true_label``, ``computed_fill_value``, and for
the refused configs whether both refuse.

Usage::

    .venv/bin/python benchmarks/bench_ludwig_rows.py
        [--ludwig-python /work/.cache/ludwig-venv/bin/python] [--write-fixture]

``--write-fixture`` stores the generated CSV and Ludwig's answers (small JSON: the ids per split,
the metadata fields compared, the refusal messages) in ``tests/fixtures/ludwig/rows*``, which
``tests/preprocessing/test_ludwig_rows.py`` checks datamill against without running Ludwig.
"""

from __future__ import annotations

import csv
import json
import tempfile
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
ROWS_CSV = FIXTURE / "rows.csv"
ROWS_JSON = FIXTURE / "rows_ludwig.json"
SPLITS = ("training", "validation", "test")

_BASE: dict[str, Any] = {
    "input_features": [
        {"name": "Id", "type": "number", "preprocessing": {"normalization": None}},
        {"name": "x", "type": "number"},
        {"name": "yn", "type": "binary"},
        {"name": "hb", "type": "binary"},
    ],
    "output_features": [{"name": "target", "type": "category"}],
}

#: name → the config as a Ludwig user writes it (model sections left out: datamill ignores them)
CONFIGS: dict[str, dict[str, Any]] = {
    "hash_str": {
        **_BASE,
        "preprocessing": {"split": {"type": "hash", "column": "uid"}},
    },
    "hash_int": {
        **_BASE,
        "preprocessing": {
            "split": {"type": "hash", "column": "num_id", "probabilities": [0.6, 0.2, 0.2]}
        },
    },
    "sample": {
        **_BASE,
        "preprocessing": {"sample_ratio": 0.6, "split": {"type": "hash", "column": "num_id"}},
    },
    "refuse_binary": {
        "input_features": [{"name": "Id", "type": "number"}, {"name": "tri", "type": "binary"}],
        "output_features": [{"name": "target", "type": "category"}],
    },
    "refuse_iq": {
        "input_features": [
            {"name": "Id", "type": "number"},
            {"name": "const", "type": "number", "preprocessing": {"normalization": "iq"}},
        ],
        "output_features": [{"name": "target", "type": "category"}],
    },
}


def make_rows(path: Path, rows: int = 400, seed: int = 11) -> None:
    """The generated table (see the module doc); one row at a time: a few hundred rows."""
    rng = np.random.default_rng(seed)
    num_ids = rng.choice(np.arange(100_000, 1_000_000), size=rows, replace=False)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["Id", "uid", "num_id", "x", "yn", "hb", "tri", "const", "target"])
        for i in range(rows):
            uid = f"user-{i:04d}"
            if i == 7:
                uid = "Zoë"
            elif i == 8:
                uid = 'say "hi"'
            elif i == 9:
                uid = ""  # missing: Ludwig drops the row (dropna over the split column)
            target = "" if rng.random() < 0.06 else str(rng.choice(["ant", "bee", "cat"]))
            w.writerow(
                [
                    i,
                    uid,
                    int(num_ids[i]),
                    f"{rng.normal(3, 2):.4f}",
                    rng.choice(["Y", "N"]),
                    rng.choice(["human", "bot"]),
                    rng.choice(["Y", "N", "yes"]),
                    1 if i % 10 else 2,
                    target,
                ]
            )


def run_ludwig(ludwig_python: Path, config: dict[str, Any], data: Path) -> dict[str, Any]:
    """Ludwig's answer for one config: ids per split and metadata, or its refusal message."""
    work = Path(tempfile.mkdtemp(prefix="bench_ludwig_rows_"))
    proc = ludwig_side(ludwig_python, config, data, work / "out")
    if proc.returncode != 0:
        last = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-1]
        return {"error": last}
    meta = json.loads((work / "out/ludwig_meta.json").read_text())
    tensors = np.load(work / "out/ludwig_tensors.npz")
    ids = {s: sorted(int(v) for v in tensors[f"{s}/Id"]) for s in SPLITS if f"{s}/Id" in tensors}
    keep = ("fallback_true_label", "computed_fill_value", "missing_value_strategy")
    fields = {
        f["name"]: {k: meta[f["name"]]["preprocessing"].get(k) for k in keep}
        for f in config["input_features"] + config["output_features"]
    }
    for f in config["input_features"]:
        if "fallback_true_label" in meta[f["name"]]:
            fields[f["name"]]["meta_fallback_true_label"] = meta[f["name"]]["fallback_true_label"]
    return {"ids": ids, "preprocessing": fields}


def run_datamill(config: dict[str, Any], data: Path) -> dict[str, Any]:
    """datamill's answer for one config, in the same shape as :func:`run_ludwig`."""
    import datamill
    from datamill.core.errors import DatamillError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = datamill.preprocess(data, config, skip_save=True)
    except DatamillError as exc:
        return {"error": str(exc).splitlines()[0]}
    ids_all = out.data["Id"].astype(np.int64)
    split = out.data["split"]
    ids = {s: sorted(ids_all[split == k].tolist()) for k, s in enumerate(SPLITS)}
    fields = {}
    for f in config["input_features"] + config["output_features"]:
        m = out.metadata[f["name"]]
        fields[f["name"]] = {
            "computed_fill_value": m["preprocessing"].get("computed_fill_value"),
            "meta_fallback_true_label": m.get("fallback_true_label"),
        }
    return {"ids": ids, "preprocessing": fields}


def compare(name: str, lw: dict[str, Any], dm: dict[str, Any]) -> list[str]:
    """Lines saying what is equal and what differs for one config."""
    if "error" in lw or "error" in dm:
        return [f"{name}: Ludwig {lw.get('error', 'ran')!r} | datamill {dm.get('error', 'ran')!r}"]
    lines = []
    for s in SPLITS:
        a, b = set(lw["ids"].get(s, [])), set(dm["ids"].get(s, []))
        lines.append(f"{name} {s}: Ludwig {len(a)} rows, datamill {len(b)}, in common {len(a & b)}")
    for feat, fields in lw["preprocessing"].items():
        for key in ("computed_fill_value", "meta_fallback_true_label"):
            if key in fields:
                got = dm["preprocessing"].get(feat, {}).get(key)
                same = "equal" if got == fields[key] else "DIFFERENT"
                lines.append(f"{name} {feat}.{key}: Ludwig {fields[key]!r} datamill {got!r} {same}")
    return lines


def main() -> None:
    args = ludwig_parser(__doc__.splitlines()[0]).parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_ludwig_rows_"))
    data = work / "rows.csv" if args.write_fixture else ROWS_CSV
    if args.write_fixture:
        make_rows(data)
    answers = {}
    for name, config in CONFIGS.items():
        lw = run_ludwig(args.ludwig_python, config, data)
        dm = run_datamill(config, data)
        answers[name] = lw
        for line in compare(name, lw, dm):
            print(line, flush=True)
    if args.write_fixture:
        ROWS_CSV.write_bytes(data.read_bytes())
        ROWS_JSON.write_text(json.dumps({"configs": CONFIGS, "ludwig": answers}, indent=1) + "\n")
        print(f"fixture written to {ROWS_JSON}")


if __name__ == "__main__":
    main()
