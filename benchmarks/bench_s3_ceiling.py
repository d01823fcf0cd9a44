"""The object store's own ceiling: how fast its objects can be fetched when reading costs nothing.

For issue 31's "S3 cold >= 0.9x warm": a cold epoch cannot be faster than the time to GET every
object of the dataset once. This measures that time with ``N`` connections in parallel (``N`` = 1,
4, 8 by default): every object under a prefix fetched with the same client datamill uses
(pyarrow's ``S3FileSystem``, 8 MiB reads), the bytes discarded (no hash, no decode, no cache
write). It reports MB/s and "samples/s if reading were free" (the dataset's samples / the wall
time), the figure a cold epoch is compared with. ``benchmarks/bench_peers.py`` runs it in the same
run as the loaders (interleaved, each repetition), and prints it beside each cold figure.

    python benchmarks/bench_s3_ceiling.py --endpoint http://127.0.0.1:8333 \\
        --access-key KEY --secret-key SECRET --prefix bucket/img/parquet --samples 200000

Only the standard library is imported at the top (``bench_peers.py`` imports this in its driver).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONNECTIONS = (1, 4, 8)
CHUNK = 8 << 20  # what datamill's ShardFileCache reads at once
COLD_GOAL = 0.6  # a cold epoch from the store: at least this share of its ceiling
MACHINE_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_cpu() -> dict[str, float]:
    """The whole machine's CPU time so far by kind, in core-seconds (every core together: Linux
    ``/proc/stat``); empty where there is none."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    return {k: int(v) / tick for k, v in zip(MACHINE_FIELDS, first[1:])}


def machine_since(before: dict[str, float]) -> dict[str, float]:
    """:func:`machine_cpu` spent since ``before`` (a figure of it), by kind."""
    now = machine_cpu()
    return {k: round(now[k] - before[k], 3) for k in now if k in before}


def get_all(
    endpoint: str, access_key: str, secret_key: str, prefix: str, *, connections: int
) -> dict[str, Any]:
    """GET every object under ``prefix`` with ``connections`` threads; bytes discarded.

    The listing is done before the clock starts (a loader lists once too, when it opens).
    """
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.fs as pafs

    sys.path.insert(0, str(ROOT / "src"))
    from datamill.core.objstore import s3_filesystem

    fs = s3_filesystem(endpoint=endpoint, access_key=access_key, secret_key=secret_key)
    infos = [
        i
        for i in fs.get_file_info(pafs.FileSelector(prefix, recursive=True))
        if i.type == pafs.FileType.File and not i.base_name.startswith("_")  # not an index
    ]

    def fetch(path: str) -> int:
        n = 0
        with fs.open_input_stream(path) as f:
            while chunk := f.read(CHUNK):
                n += len(chunk)
        return n

    import resource

    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    machine = machine_cpu()
    start, cpu = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(max_workers=connections) as pool:
        got = sum(pool.map(fetch, [i.path for i in infos]))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    machine = machine_since(machine)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    want = sum(int(i.size) for i in infos)
    if got != want:
        raise RuntimeError(f"read {got} bytes, the objects hold {want}")
    return {
        "connections": connections,
        "objects": len(infos),
        "bytes": got,
        "seconds": seconds,
        "cpu": cpu,
        "faults": faults,  # minor page faults while fetching (memory touched for the first time)
        "machine": machine,  # the whole machine's CPU while fetching, by kind (idle: unused)
    }


def measure(
    s3: tuple[str, str, str],
    prefix: str,
    *,
    samples: int,
    connections: tuple[int, ...] = CONNECTIONS,
    python: str | None = None,
    store_cpu: Callable[[], float] | None = None,
) -> list[dict[str, Any]]:
    """One fresh process per connection count (as a loader starts fresh); MB/s and samples/s added,
    with the load average after each, and the store server's CPU seconds (``store_cpu()``: its
    CPU time so far) when given."""
    out = []
    for n in connections:
        before = store_cpu() if store_cpu is not None else None
        proc = subprocess.run(
            [
                python or sys.executable,
                __file__,
                "--endpoint",
                s3[0],
                "--access-key",
                s3[1],
                "--secret-key",
                s3[2],
                "--prefix",
                prefix,
                "--connections",
                str(n),
                "--samples",
                str(samples),
                "--json",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            out.append({"connections": n, "error": f"exit {proc.returncode}: {' | '.join(tail)}"})
            continue
        res = json.loads(lines[-1][7:])
        if before is not None and store_cpu is not None:
            res["store_cpu"] = store_cpu() - before
        out.append(res)
    return out


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def find_pid(marker: str) -> int | None:
    """The process whose command line contains ``marker`` (e.g. the store's data folder)."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            if marker in cmd and int(d.name) != os.getpid():
                return int(d.name)
    return None


def _with_rates(res: dict[str, Any], samples: int) -> dict[str, Any]:
    return {
        **res,
        "mb_s": res["bytes"] / res["seconds"] / 1e6,
        "samples_s": samples / res["seconds"],
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def best(runs: list[dict[str, Any]]) -> dict[int, float]:
    """Median samples/s per connection count over the repetitions (errors left out)."""
    by: dict[int, list[float]] = {}
    for r in runs:
        if "error" not in r:
            by.setdefault(int(r["connections"]), []).append(float(r["samples_s"]))
    return {n: statistics.median(v) for n, v in sorted(by.items())}


def summary(
    ceilings: dict[str, list[dict[str, Any]]],
    median: Any,
    systems: list[str],
    labels: dict[str, str],
    cold_runs: Any = None,
    goal_for: Collection[str] = (),
) -> str:
    """Each S3 system's cold epoch beside the store's ceiling and its warm epoch (same run), and
    for the systems in ``goal_for`` the cold goal's line (>= :data:`COLD_GOAL` x the ceiling,
    printed with three decimals so that a figure at the line is not rounded onto it).

    ``ceilings[ds]``: every :func:`measure` result of the run; ``median(ds, mode, system)``: the
    median samples/s of that system's runs (or ``None``); ``cold_runs(ds, system)``: its cold runs
    (dicts with ``seconds``, ``cpu`` and ``store_cpu``) for the CPU figures.
    """
    out = [
        "",
        (
            "S3 cold epoch vs the object store's ceiling (every object fetched once, bytes "
            "discarded), medians of the run's repetitions; CPU = core-seconds of the reading "
            f"process + the store's server, busy = that CPU / wall time ({os.cpu_count()} cores):"
        ),
    ]
    for ds, runs in ceilings.items():
        per = best(runs)
        if not per:
            continue
        ok = [r for r in runs if "error" not in r]
        parts = []
        for n, v in per.items():
            mine = [r for r in ok if r["connections"] == n]
            part = f"{n} GET(s) {statistics.median(r['mb_s'] for r in mine):,.0f} MB/s = {v:,.0f}"
            part += " samples/s"
            if all("store_cpu" in r for r in mine):
                part += " " + _cpu(mine)
            parts.append(part)
        out.append(
            f"- {ds} ceiling: " + ", ".join(parts) + f"; load {ok[0]['load']} ... {ok[-1]['load']}"
        )
        top_n = max(per, key=lambda n: per[n])
        top = per[top_n]
        goals: list[str] = []  # printed after the dataset's systems
        for s in systems:
            cold, warm = median(ds, "cold", s), median(ds, "warm", s)
            if cold is None:
                continue
            line = (
                f"  - {labels[s]}: cold {cold:,.0f} samples/s = {cold / top:.2f}x the ceiling "
                f"({top_n} GETs)"
            )
            mine = [
                r
                for r in (cold_runs(ds, s) if cold_runs is not None else [])
                if "error" not in r and "cpu" in r and "store_cpu" in r
            ]
            if mine:
                line += " " + _cpu(mine)
                budget = cpu_budget([r for r in ok if r["connections"] == top_n], mine)
                if budget:
                    line += "\n    " + budget
            if warm is not None:
                line += (
                    f"; warm {warm:,.0f}: cold / warm {cold / warm:.2f}x, ceiling / warm "
                    f"{top / warm:.2f}x"
                )
                if top / warm < 0.9:
                    line += " (cold >= 0.9x warm is out of reach of the store here)"
            out.append(line)
            if s in goal_for:
                r = cold / top
                goals.append(
                    f"- {ds}, S3 cold / the store's ceiling ({labels[s]}): {r:.3f}x "
                    f"(goal >= {COLD_GOAL}x) {'MET' if r >= COLD_GOAL else 'NOT MET'}"
                )
        out += goals
    return "\n".join(out) + "\n"


def machine_idle(res: dict[str, Any]) -> str:
    """``, machine idle x of y core-s`` for a run that measured the machine's CPU, else ``""``."""
    m = res.get("machine") or {}
    if "idle" not in m:
        return ""
    total = sum(m.values())
    return f", machine idle {m['idle'] + m.get('iowait', 0):.2f} of {total:.2f} core-s"


def cpu_budget(ceiling: list[dict[str, Any]], cold: list[dict[str, Any]]) -> str:
    """Where cold / ceiling comes from, in CPU (medians; runs with ``seconds``, ``cpu`` and
    ``store_cpu``): the core-seconds the reader and the store spent in each, the cores they kept
    busy, and how many core-seconds a cold epoch could spend for 0.6x the ceiling at the ceiling's
    busy cores. cold / ceiling = (ceiling CPU / cold CPU) x (cold busy / ceiling busy)."""
    ceiling = [r for r in ceiling if "store_cpu" in r and r.get("seconds")]
    if not ceiling or not cold:
        return ""

    def med(runs: list[dict[str, Any]], key: Any) -> float:
        return statistics.median(key(r) for r in runs)

    c_ceil = med(ceiling, lambda r: r["cpu"] + r["store_cpu"])
    c_cold = med(cold, lambda r: r["cpu"] + r["store_cpu"])
    b_ceil = med(ceiling, lambda r: (r["cpu"] + r["store_cpu"]) / r["seconds"])
    b_cold = med(cold, lambda r: (r["cpu"] + r["store_cpu"]) / r["seconds"])

    def idle(runs: list[dict[str, Any]]) -> str:
        m = [r["machine"] for r in runs if "idle" in (r.get("machine") or {})]
        if not m:
            return ""
        share = statistics.median((x["idle"] + x.get("iowait", 0)) / sum(x.values()) for x in m)
        return f", machine idle {share:.0%}"

    return (
        f"CPU budget: ceiling {c_ceil:.2f} core-s (reader + store), {b_ceil:.2f} cores busy with "
        f"it{idle(ceiling)}; cold {c_cold:.2f} core-s, {b_cold:.2f} cores{idle(cold)}; "
        f"cold / ceiling = CPU ratio {c_ceil / c_cold:.2f} x busy ratio {b_cold / b_ceil:.2f}; "
        f"{COLD_GOAL}x the ceiling at its busy cores needs <= {c_ceil / COLD_GOAL:.2f} core-s"
    )


def _cpu(runs: list[dict[str, Any]]) -> str:
    reader = statistics.median(r["cpu"] for r in runs)
    store = statistics.median(r["store_cpu"] for r in runs)
    busy = statistics.median((r["cpu"] + r["store_cpu"]) / r["seconds"] for r in runs)
    return f"(CPU {reader:.2f} s + store {store:.2f} s, busy {busy:.1f} cores)"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--access-key", required=True)
    ap.add_argument("--secret-key", required=True)
    ap.add_argument("--prefix", required=True, help="bucket/prefix holding the dataset's objects")
    ap.add_argument("--samples", type=int, required=True, help="samples the objects hold")
    ap.add_argument("--connections", default=",".join(map(str, CONNECTIONS)))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    conns = tuple(int(c) for c in args.connections.split(","))
    s3 = (args.endpoint, args.access_key, args.secret_key)
    if args.json:  # one measurement in this process (what measure() runs)
        res = get_all(*s3, args.prefix, connections=conns[0])
        print("RESULT " + json.dumps(_with_rates(res, args.samples)), flush=True)
        return
    runs = []
    for rep in range(args.reps):
        for r in measure(s3, args.prefix, samples=args.samples, connections=conns):
            runs.append(r)
            if "error" in r:
                print(f"[{rep}] {r['connections']} connections: {r['error']}", flush=True)
            else:
                print(
                    f"[{rep}] {r['connections']} connections: {r['mb_s']:,.0f} MB/s, "
                    f"{r['samples_s']:,.0f} samples/s ({r['seconds']:.2f} s), load {r['load']}",
                    flush=True,
                )
    for n, v in best(runs).items():
        print(f"median, {n} connections: {v:,.0f} samples/s if reading were free")


if __name__ == "__main__":
    main()
