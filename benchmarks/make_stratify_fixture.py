"""Ludwig 0.17's stratified split sizes on many class mixes, stored as
``tests/fixtures/ludwig/stratify_sizes.json``.

Runs in Ludwig's own venv (never datamill's; datamill does not depend on scikit-learn): each case
builds a pandas DataFrame with the given rows per class and calls Ludwig's own
``ludwig.data.split.stratify_split_dataframe`` (scikit-learn's ``train_test_split`` twice), then
counts the rows of every class in each split. ``tests/preprocessing/test_ludwig_bugs.py`` checks
``datamill.preprocessing.split.stratify_sizes`` against every case.

Usage::

    /work/.cache/ludwig-venv/bin/python benchmarks/make_stratify_fixture.py [OUT.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ludwig_side import _shims  # torchvision/torchaudio shims, before Ludwig is imported

OUT = Path(__file__).resolve().parents[1] / "tests/fixtures/ludwig/stratify_sizes.json"

MIXES = [
    [59, 71, 48],
    [50, 50, 50],
    [10, 10],
    [3, 3, 3, 3],
    [2, 2],
    [100, 1, 50],
    [7, 1, 1, 9],
    [1000, 30, 5],
    [13, 17, 19, 23, 29],
    [2, 3, 5, 7, 11, 13],
    [400, 400],
    [5, 6],
    [333, 334, 333],
    [20, 2, 2, 2],
    [146, 34, 90, 61],
]
TRIPLES = [(0.7, 0.1, 0.2), (0.6, 0.2, 0.2), (0.8, 0.1, 0.1), (0.5, 0.25, 0.25), (0.34, 0.33, 0.33)]
SEEDS = [42, 0, 7]


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    _shims()
    import numpy as np
    import pandas as pd
    import sklearn
    from ludwig.backend import LOCAL_BACKEND
    from ludwig.data.split import stratify_split_dataframe
    from ludwig.globals import LUDWIG_VERSION

    cases = []
    for counts in MIXES:
        labels = [f"c{k:02d}" for k, c in enumerate(counts) for _ in range(c)]
        for probabilities in TRIPLES:
            for seed in SEEDS:
                rng = np.random.default_rng(seed)
                df = pd.DataFrame(
                    {
                        "label": np.asarray(labels)[rng.permutation(len(labels))],
                        "x": np.arange(len(labels)),
                    }
                )
                try:
                    parts = stratify_split_dataframe(
                        df, "label", list(probabilities), LOCAL_BACKEND, seed
                    )
                except (
                    ValueError
                ) as exc:  # scikit-learn refuses (e.g. fewer rows than classes on one side)
                    cases.append(
                        {
                            "counts": counts,
                            "probabilities": list(probabilities),
                            "seed": seed,
                            "ludwig_error": str(exc).splitlines()[0],
                        }
                    )
                    continue
                sizes = [
                    [int((p["label"] == f"c{k:02d}").sum()) for p in parts]
                    for k in range(len(counts))
                ]
                cases.append(
                    {
                        "counts": counts,
                        "probabilities": list(probabilities),
                        "seed": seed,
                        "sizes": sizes,
                    }
                )
    doc = {
        "ludwig": LUDWIG_VERSION,
        "sklearn": sklearn.__version__,
        "made_by": "benchmarks/make_stratify_fixture.py",
        "cases": cases,
    }
    out.write_text(
        json.dumps(doc, indent=None, separators=(",", ":")).replace('{"counts"', '\n{"counts"')
        + "\n"
    )
    ok = sum("sizes" in c for c in cases)
    print(f"{ok} cases with sizes, {len(cases) - ok} refused by Ludwig/scikit-learn -> {out}")


if __name__ == "__main__":
    main()
