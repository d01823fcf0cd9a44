"""Ray engine vs local engine: preprocessing (1M-row synthetic CSV, 10M rows of Parquet in 10+
files) and BERT.

Workloads (``--quick``: 50k rows, 300k rows in 10 files, wikitext2 x1):

* **pre**: the synthetic CSV of ``bench_preprocess.py`` (cat/tags/seq/review, seeded), 1M rows;
  local ``preprocess(csv)`` (HDF5) vs ``preprocess(csv, engine="ray")`` (shardset dataset).
* **big**: the same generator, 10M rows written as one Parquet file (the local engine reads one
  file) and as 10+ Parquet files (the Ray engine reads the folder).
* **bert**: ``wikitext2_test.raw`` x20 (``--bert-repeat``), ``max_seq_length`` 128, dupe 1; the
  local builder trains the tokenizer and the Ray run uses the same one (WordPiece training breaks
  frequency ties differently from run to run).

Each side runs in a fresh interpreter (``subprocess``): time = wall clock of the call, driver peak
memory = that interpreter's peak RSS (``VmHWM``) (the Ray workers' memory is not the driver's). The
Ray side starts a local Ray (``num_cpus`` = cores) unless ``--address`` is given; Ray's fixed costs
(``ray.init``, ``import ray.data``, the first tiny task) are measured separately. Outputs are
compared: metadata (header aside from paths and fingerprints) and every tensor, shard by shard
against the HDF5 rows (every BERT column, sample by sample).

Usage: .venv/bin/python benchmarks/bench_ray.py [--quick] [--address HOST:PORT] [--only
pre,big,bert] Don't run the full benchmark while others use the CPU; ``--quick`` is a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("DATAMILL_DATA", HERE.parents[0] / ".." / "shared" / "data"))
SKIP_HEADER = ("hdf5", "dataset", "source", "fingerprint", "input_fingerprint")


def _peak_mb() -> float:
    """This interpreter's peak RSS (VmHWM: reset by exec, unlike ru_maxrss which Linux keeps across
    it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- one side, in its own interpreter --------------------------------------------------------------
def side(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    from bench_preprocess import CONFIG

    out: dict[str, Any] = {}
    if args.engine == "ray":
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        t = time.perf_counter()
        import ray

        from datamill.ray._runtime import connect

        if args.address:
            ray.init(address=args.address, log_to_driver=False)
        else:
            ray.init(address="local", include_dashboard=False, log_to_driver=False)
        connect(None)
        out["ray_init_s"] = time.perf_counter() - t
        t = time.perf_counter()
        import ray.data

        out["ray_data_import_s"] = time.perf_counter() - t
        t = time.perf_counter()
        ray.get(ray.remote(lambda: 1).remote())
        out["first_task_s"] = time.perf_counter() - t
    t = time.perf_counter()
    if args.task in ("pre", "big"):
        from datamill.preprocessing.api import preprocess

        res = preprocess(args.input, CONFIG, output_dir=args.out, engine=args.engine)
        out.update(
            rows=res.num_rows,
            meta=str(res.meta_path),
            hdf5=str(res.hdf5_path),
            dataset=str(getattr(res, "dataset_path", "")),
        )
    else:
        from datamill.pretrain.bert import build_bert_samples

        kw: dict[str, Any] = {
            "vocab_size": 30000,
            "max_seq_length": 128,
            "dupe_factor": 1,
            "seed": 0,
        }
        if args.engine == "ray":
            res = build_bert_samples(
                args.input, out=args.out, engine="ray", tokenizer=args.tokenizer, **kw
            )
        else:
            res = build_bert_samples(args.input, out=args.out, **kw)
        out.update(rows=res.samples, path=str(res.path), tokenizer=str(res.tokenizer_path))
    out["seconds"] = time.perf_counter() - t
    out["driver_peak_mb"] = _peak_mb()
    return out


def run_side(
    engine: str, task: str, inp: Path, out: Path, address: str | None, tokenizer: str | None = None
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--_side",
        engine,
        "--_task",
        task,
        "--_input",
        str(inp),
        "--_out",
        str(out),
    ]
    if address:
        cmd += ["--address", address]
    if tokenizer:
        cmd += ["--_tokenizer", tokenizer]
    env = {**os.environ, "DATAMILL_QUIET": "1", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{engine} {task} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"  {engine} {task}: {json.dumps(result)}", flush=True)  # kept even if a later step fails
    return result


# -- comparing the outputs -------------------------------------------------------------------------
def same_preprocessed(local: dict[str, Any], ray_side: dict[str, Any]) -> bool:
    import h5py
    import numpy as np

    from datamill.preprocessing.features import CSR
    from datamill.ray._tables import table_to_arrays
    from datamill.shards import ShardsetDataset

    a, b = (json.loads(Path(s["meta"]).read_text()) for s in (local, ray_side))
    for doc in (a, b):
        doc["datamill"] = {k: v for k, v in doc["datamill"].items() if k not in SKIP_HEADER}
    if a != b:
        return False
    ds = ShardsetDataset(ray_side["dataset"])
    lo = 0
    sizes = ds.shard_sizes()
    with h5py.File(local["hdf5"], "r") as f:
        for k in range(ds.num_shards):
            arrays = table_to_arrays(ds.read_shard(k), uid="uid")
            n = int(sizes[k])
            for key, value in arrays.items():
                node = f[key]
                if isinstance(node, h5py.Group):  # a CSR column (set/bag): indices/offsets[/values]
                    off = node["offsets"][lo : lo + n + 1]
                    if not (
                        isinstance(value, CSR)
                        and np.array_equal(off - off[0], value.offsets)
                        and np.array_equal(node["indices"][off[0] : off[-1]], value.indices)
                        and (
                            "values" not in node
                            or np.array_equal(node["values"][off[0] : off[-1]], value.values)
                        )
                    ):
                        return False
                elif not np.array_equal(node[lo : lo + n], value):
                    return False
            lo += n
    return True


def same_bert(local: dict[str, Any], ray_side: dict[str, Any]) -> bool:
    """Every sample equal, column by column (the local Parquet file against the shards in order)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datamill.shards import ShardsetDataset

    names = ["tokens", "segment_ids", "masked_positions", "masked_labels", "is_random_next"]
    left = pq.read_table(local["path"], columns=names)
    ds = ShardsetDataset(ray_side["path"])
    right = pa.concat_tables([ds.read_shard(k, columns=names) for k in range(ds.num_shards)])
    return local["rows"] == ray_side["rows"] == left.num_rows == right.num_rows and all(
        left.column(n).combine_chunks().equals(right.column(n).combine_chunks()) for n in names
    )


# -- workloads -------------------------------------------------------------------------------------
def report(
    name: str, rows: int, local: dict[str, Any], ray_side: dict[str, Any], same: bool
) -> None:
    ratio = ray_side["seconds"] / local["seconds"]
    print(f"\n{name}: {rows:,} rows")
    print(f"  {'engine':<8}{'seconds':>10}{'rows/s':>14}{'driver peak MB':>16}")
    for label, s in (("local", local), ("ray", ray_side)):
        print(
            f"  {label:<8}{s['seconds']:>10.2f}{s['rows'] / s['seconds']:>14,.0f}"
            f"{s['driver_peak_mb']:>16,.0f}"
        )
    print(
        f"  ray/local time ratio {ratio:.2f}; ray fixed costs: init "
        f"{ray_side['ray_init_s']:.1f} s, "
        f"import ray.data {ray_side.get('ray_data_import_s', 0.0):.2f} s, "
        f"first task {ray_side['first_task_s']:.2f} s; outputs identical: {same}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--address", default=None)
    ap.add_argument("--only", default="pre,big,bert")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--big-rows", type=int, default=None)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--bert-repeat", type=int, default=None)
    for hidden in ("--_side", "--_task", "--_input", "--_out", "--_tokenizer"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._side:
        ns = argparse.Namespace(
            engine=args._side,
            task=args._task,
            input=args._input,
            out=args._out,
            address=args.address,
            tokenizer=args._tokenizer,
        )
        print(json.dumps(side(ns)))
        return
    sys.path.insert(0, str(HERE))
    from bench_preprocess import make_csv

    only = set(args.only.split(","))
    rows = args.rows or (50_000 if args.quick else 1_000_000)
    big = args.big_rows or (300_000 if args.quick else 10_000_000)
    repeat = args.bert_repeat or (1 if args.quick else 20)
    print(
        f"bench_ray: {os.cpu_count()} cores, {'quick' if args.quick else 'full'} run, "
        f"Ray at {args.address or 'a local instance'}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        d = Path(tmp)
        if "pre" in only:
            make_csv(d / "synth.csv", rows)
            loc = run_side("local", "pre", d / "synth.csv", d / "pre-local", args.address)
            ray_side = run_side("ray", "pre", d / "synth.csv", d / "pre-ray", args.address)
            report("pre (synthetic CSV)", rows, loc, ray_side, same_preprocessed(loc, ray_side))
        if "big" in only:
            import pyarrow.csv as pacsv
            import pyarrow.parquet as pq

            make_csv(d / "big.csv", big)
            table = pacsv.read_csv(d / "big.csv")
            (d / "big.csv").unlink()
            pq.write_table(table, d / "big.parquet")
            (d / "parts").mkdir()
            step = -(-big // args.files)
            for i, lo in enumerate(range(0, big, step)):
                pq.write_table(table.slice(lo, step), d / "parts" / f"part-{i:03d}.parquet")
            del table
            loc = run_side("local", "big", d / "big.parquet", d / "big-local", args.address)
            ray_side = run_side("ray", "big", d / "parts", d / "big-ray", args.address)
            report(
                f"big (Parquet, {args.files} files for Ray)",
                big,
                loc,
                ray_side,
                same_preprocessed(loc, ray_side),
            )
        if "bert" in only:
            text = (DATA / "wikitext2_test.raw").read_text(encoding="utf-8")
            (d / "wiki.raw").write_text(text * repeat, encoding="utf-8")
            loc = run_side("local", "bert", d / "wiki.raw", d / "bert.parquet", args.address)
            ray_side = run_side(
                "ray",
                "bert",
                d / "wiki.raw",
                d / "bert-ray",
                args.address,
                tokenizer=loc["tokenizer"],
            )
            report(
                f"bert (wikitext2_test.raw x{repeat}, samples)",
                loc["rows"],
                loc,
                ray_side,
                same_bert(loc, ray_side),
            )


if __name__ == "__main__":
    main()
