"""BERT pretraining data from raw text, whole processes side by side: ``datamill bert`` (the CLI) vs
the seed's pure-Python script vs the seed's Hugging Face ``datasets`` path.

    .venv/bin/python benchmarks/bench_bert.py          # full: 10 and 100 MB inputs (~8 min quiet)
    .venv/bin/python benchmarks/bench_bert.py --quick  # smoke run: 1.3 MB and 2.6 MB (~1 min)

Each side is one subprocess timed by the wall clock, interpreter start, imports, tokenizer training,
reading, tokenising, sampling and writing included:

(a) ``datamill bert RAW --out X.parquet`` (the CLI's entry point in a fresh interpreter, as the
    console script runs it; trains its WordPiece tokenizer);
(b) ``benchmarks/bert_seed_script.py RAW``: the seed's script in pure Python with ``random.Random``
    (tokenizer trained with ``tokenizers``' ``Tokenizer.train(files=...)``, each line encoded on its
    own, the seed article's pair loop, ``truncate_seq_pair``, Google's masking, padding); writes
    nothing;
(c) the same script with ``--hf``: the samples through ``datasets.Dataset.from_generator`` and
    ``to_parquet``.

Every side uses the same settings (``SETTINGS``: dupe factor 5, 512 tokens, 15% masking, at most
20 predictions, short-sequence probability 0.1, a 30,000-word WordPiece vocabulary trained on the
input). Inputs are ``wikitext2_test.raw`` repeated to about 10 MB and 100 MB (a repeated corpus:
said so in the output). datamill runs twice, before and after the seed's two sides, and its ratios
use the mean of its two runs, so a change of load during the run hits both sides alike. The machine
is shared: compare the ratios measured in one run, not seconds across runs.

The WikiText-103 projection (4.27M samples from ~540 MB of raw text) charges every stage: the text
stages (read, cut, train the tokenizer, tokenise) at their per-byte rate measured by a whole
``datamill bert`` process on unrepeated text (all shared text files concatenated: the repeated
corpus would flatter training and tokenising, which see each distinct word once), the sample
stage (pairs, masking, padding, Parquet writing) at its per-sample rate on the largest input, and
the process start once.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED_SCRIPT = ROOT / "benchmarks" / "bert_seed_script.py"
SETTINGS = {
    "dupe_factor": 5,
    "max_seq_length": 512,
    "vocab_size": 30000,
}  # the script's other defaults
# (mask 0.15, 20 predictions, short 0.1) are datamill's defaults too
WIKITEXT103_SAMPLES = 4_270_000  # the seed's WikiText-103 run
WIKITEXT103_BYTES = 540_000_000  # wiki.train.raw of WikiText-103, about 540 MB
TEXT_STAGES = (
    "read_split",
    "cut_words",
    "train_tokenizer",
    "tokenize",
)  # train_merges is part of train_tokenizer


@dataclass
class Run:
    name: str
    wall: float  # seconds, whole process
    samples: int
    peak_mb: float
    stages: dict[str, float] = field(default_factory=dict)
    inside: float = 0.0  # seconds the process reports for its own work
    out_mb: float = 0.0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("TOKENIZERS_PARALLELISM", "true")
    return env


def _timed(cmd: list[str]) -> tuple[float, float, str]:
    """Run ``cmd``; (wall seconds, peak RSS MB of the process, stdout). Fails loudly on an error."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=_env())
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err.read()[-3000:]}")
        return wall, usage.ru_maxrss / 1024, out.read()


def _datamill_cmd() -> list[str]:
    """``datamill`` as the console script runs it (its entry point calls ``datamill.cli.main``); not
    the script file itself, which the shared venv may have generated for another version of the
    entry point."""
    return [sys.executable, "-c", "import sys; from datamill.cli import main; sys.exit(main())"]


def run_datamill(raw: Path, out: Path) -> Run:
    cmd = [
        *_datamill_cmd(),
        "bert",
        str(raw),
        "--out",
        str(out),
        "--dupe-factor",
        str(SETTINGS["dupe_factor"]),
        "--max-seq-length",
        str(SETTINGS["max_seq_length"]),
        "--vocab-size",
        str(SETTINGS["vocab_size"]),
        "--quiet",
    ]
    wall, peak, text = _timed(cmd)
    m = re.search(r"samples ([\d,]+) .*\(([\d.]+) s\)", text)
    st = re.search(r"seconds per stage: (.*)", text)
    if not m or not st:
        raise SystemExit(f"unexpected datamill output:\n{text}")
    stages = {k: float(v) for k, v in (p.rsplit(" ", 1) for p in st.group(1).split(", "))}
    return Run(
        "datamill bert (CLI)",
        wall,
        int(m.group(1).replace(",", "")),
        peak,
        stages,
        float(m.group(2)),
        out.stat().st_size / 1e6,
    )


def run_seed(raw: Path, hf_out: Path | None) -> Run:
    cmd = [
        sys.executable,
        str(SEED_SCRIPT),
        str(raw),
        "--dupe-factor",
        str(SETTINGS["dupe_factor"]),
        "--max-seq-length",
        str(SETTINGS["max_seq_length"]),
        "--vocab-size",
        str(SETTINGS["vocab_size"]),
    ]
    if hf_out is not None:
        cmd += ["--hf", str(hf_out)]
    wall, peak, text = _timed(cmd)
    rep = json.loads(text.strip().splitlines()[-1])
    stages = {k: float(rep[k]) for k in ("train_tokenizer", "read_tokenize", "samples_write")}
    name = (
        "seed script + HF from_generator/to_parquet"
        if hf_out
        else "seed script, pure Python (writes nothing)"
    )
    return Run(
        name,
        wall,
        int(rep["samples"]),
        peak,
        stages,
        sum(stages.values()),
        hf_out.stat().st_size / 1e6 if hf_out else 0.0,
    )


def build_input(src: Path, copies: int, dst: Path) -> Path:
    data = src.read_bytes()
    with dst.open("wb") as f:
        for _ in range(copies):
            f.write(data)
    return dst


def build_unrepeated(data_dir: Path, dst: Path) -> Path:
    """All shared text files, concatenated once (PTB train+valid+test, The Time Machine, WikiText-2
    test)."""
    parts = []
    with zipfile.ZipFile(data_dir / "ptb.zip") as z:
        for name in ("ptb/ptb.train.txt", "ptb/ptb.valid.txt", "ptb/ptb.test.txt"):
            parts.append(z.read(name))
    parts += [
        (data_dir / "timemachine.txt").read_bytes(),
        (data_dir / "wikitext2_test.raw").read_bytes(),
    ]
    dst.write_bytes(b"\n\n".join(parts))
    return dst


def _row(r: Run, ref: float | None = None) -> str:
    ratio = f"{r.wall / ref:6.1f}x" if ref else "     - "
    stages = ", ".join(f"{k} {v:.2f}" for k, v in r.stages.items() if v >= 0.005)
    return (
        f"  {r.name:44} {r.wall:8.2f} {r.samples:>9,} {r.samples / r.wall:>9,.0f} "
        f"{r.peak_mb:>8.0f} "
        f"{r.out_mb:>7.1f}  {ratio}\n      in-process seconds: {stages}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: 1 and 2 copies of wikitext2_test.raw"
    )
    ap.add_argument(
        "--data", default=os.environ.get("DATAMILL_DATA", str(ROOT / ".." / "shared" / "data"))
    )
    ap.add_argument(
        "--sizes-mb", default=None, help="comma-separated input sizes in MB (default 10,100)"
    )
    ap.add_argument(
        "--skip-hf-above-mb",
        type=float,
        default=None,
        help="skip the HF side for inputs larger than this (default: never)",
    )
    args = ap.parse_args()
    data_dir = Path(args.data)
    wiki = data_dir / "wikitext2_test.raw"
    sizes = [1.0, 2.0] if args.quick else [float(x) for x in (args.sizes_mb or "10,100").split(",")]
    print(
        f"machine: {os.cpu_count()} cores, {platform.platform()}, Python "
        f"{platform.python_version()}; "
        f"load average at start {os.getloadavg()[0]:.2f}"
    )
    print(
        f"settings (all sides): {SETTINGS}, mask 0.15, at most 20 predictions, short_seq_prob 0.1, "
        "WordPiece trained on the input; datamill seed 0, the seed script random.Random(12345)"
    )
    tmp = Path(tempfile.mkdtemp(prefix="bench-bert-"))
    results: dict[float, list[Run]] = {}
    try:
        for mb in sizes:
            copies = max(1, round(mb * 1e6 / wiki.stat().st_size))
            raw = build_input(wiki, copies, tmp / f"wiki_x{copies}.raw")
            print(
                f"\ninput: wikitext2_test.raw repeated {copies} times = "
                f"{raw.stat().st_size / 1e6:.1f} MB "
                "(a repeated corpus)",
                flush=True,
            )
            runs = [run_datamill(raw, tmp / "dm1.parquet")]
            print(f"  datamill done ({runs[-1].wall:.1f} s)", flush=True)
            runs.append(run_seed(raw, None))
            print(f"  seed pure Python done ({runs[-1].wall:.1f} s)", flush=True)
            if args.skip_hf_above_mb is None or mb <= args.skip_hf_above_mb:
                runs.append(run_seed(raw, tmp / "hf.parquet"))
                print(f"  seed HF done ({runs[-1].wall:.1f} s)", flush=True)
            runs.append(run_datamill(raw, tmp / "dm2.parquet"))
            results[mb] = runs
            raw.unlink()
            _report(mb, runs)
        mix = build_unrepeated(data_dir, tmp / "unrepeated.txt")
        print(
            f"\nunrepeated text: all shared text files once = {mix.stat().st_size / 1e6:.1f} MB",
            flush=True,
        )
        text_run = run_datamill(mix, tmp / "mix.parquet")
        print(_row(text_run))
        _project(results[sizes[-1]], text_run, mix.stat().st_size)
        print(f"\nload average at the end {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _report(mb: float, runs: list[Run]) -> None:
    dm = [r for r in runs if r.name.startswith("datamill")]
    dm_wall = sum(r.wall for r in dm) / len(dm)
    print(
        f"  {'side':44} {'wall s':>8} {'samples':>9} {'samples/s':>9} {'peak MB':>8} "
        f"{'out MB':>7}  vs datamill"
    )
    for r in runs:
        print(_row(r, None if r.name.startswith("datamill") else dm_wall))
    py = next(r for r in runs if "pure Python" in r.name)
    goal = " (goal >= 10x at 100 MB)" if mb >= 100 else ""
    print(
        f"  datamill (mean of {len(dm)} runs, {dm_wall:.2f} s) is {py.wall / dm_wall:.1f}x the "
        "seed's pure-Python "
        f"whole process{goal}",
        end="",
    )
    hf = [r for r in runs if "HF" in r.name]
    if hf:
        goal = " (goal >= 20x at 100 MB)" if mb >= 100 else ""
        print(f", {hf[0].wall / dm_wall:.1f}x the HF path{goal}")
    else:
        print(" (HF side skipped)")


def _project(runs: list[Run], text_run: Run, text_bytes: int) -> None:
    dm = [r for r in runs if r.name.startswith("datamill")]
    per_sample = sum(r.inside - sum(r.stages.get(k, 0.0) for k in TEXT_STAGES) for r in dm) / sum(
        r.samples for r in dm
    )
    text_s = sum(text_run.stages.get(k, 0.0) for k in TEXT_STAGES)
    merges = text_run.stages.get("train_merges", 0.0)
    per_byte = text_s / text_bytes
    start = sum(r.wall - r.inside for r in dm) / len(dm)
    scale = WIKITEXT103_BYTES / text_bytes
    t_text = per_byte * WIKITEXT103_BYTES
    t_samples = per_sample * WIKITEXT103_SAMPLES
    total = start + t_text + t_samples
    print(
        f"\nprojected WikiText-103 ({WIKITEXT103_SAMPLES / 1e6:.2f}M samples, "
        f"~{WIKITEXT103_BYTES / 1e6:.0f} MB): "
        f"process start {start:.1f} s + text stages {t_text:.1f} s (read, cut, train, tokenise at "
        f"{text_bytes / text_s / 1e6:.1f} MB/s on unrepeated text, every stage charged per "
        "byte) + sample stage "
        f"{t_samples:.1f} s (pairs, masking, padding, Parquet at {1 / per_sample:,.0f} "
        f"samples/s) = {total:.0f} s = "
        f"{total / 60:.2f} min (goal < 2 min{': met' if total < 120 else ': NOT met'})"
    )
    if merges:
        # the merge phase follows the distinct words, not the bytes: Heaps' law V ~ N^0.5
        refined = total - merges * scale + merges * scale**0.5
        print(
            f"  charging the tokenizer's merge phase ({merges:.2f} s here) by the number of "
            "distinct words "
            f"(Heaps' law, x{scale**0.5:.1f} for {scale:.0f}x the text) instead of per byte: "
            f"{refined:.0f} s = "
            f"{refined / 60:.2f} min (an estimate)"
        )


if __name__ == "__main__":
    main()
