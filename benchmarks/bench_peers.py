"""datamill's Loader side by side with the loaders our users would otherwise pick, in one run.

Systems: datamill (this tree, the project's venv), litData 0.2.76, mosaicml-streaming 0.13.0,
Hugging Face ``datasets`` 5.2.0 and a torch ``DataLoader`` over a map-style pyarrow table. Each
peer runs in its own venv under ``--cache`` (default ``~/.cache/datamill-bench/<peer>``), created
when absent (``pip install torch==2.13.0`` first where torch is needed: the local CPU wheel;
litData's venv has ``obstore`` removed so that it downloads through boto3, which honours an
``http://`` endpoint).

Data (fixed seed, written once under ``--work``): ``tab`` = uid, 3 float32, an int64 label and 8-64
int32 token ids; ``img`` = uid, a label and a 3 KB binary ``image``. 100 Parquet files each; the
same data converted to each peer's format (conversion time reported): litData ``optimize`` chunks,
MDS shards (``compression=None``), an HF Arrow dataset (``save_to_disk``); torch map-style and
datamill read the Parquet files.

Every epoch: batch 256, shuffled (seed 0), one process, ``num_workers=0``; time starts after the
imports, so "first" is building the dataset/loader objects plus the first batch. The consumer
(:func:`touch`) does the same with every system's batches: it keeps the uids and, on ``img``, reads
every sample's length and first byte (a Python loop over the ``bytes`` objects the peers hand out;
numpy over datamill's bytes + ``image_offsets``), on ``tab`` it sums the token mask. The uids are
checked after the clock stops (each uid exactly once), so are the image bytes (their total and the
sum of the first bytes equal the data's), and the delivered order's
neighbour statistics (:func:`datamill.loader.planner.shuffle_quality`, what ``datamill plan``
prints; distance between the original positions of consecutive samples, same-file share) are printed
beside the speed. S3 (SeaweedFS on loopback, started as ``tests/loader/seaweed.py`` does) for the
systems that stream from object storage (datamill, litData, mosaic): ``cold`` (empty cache),
``warm`` (the second epoch in the same process, cache kept) and ``cold10`` (empty cache bounded to
10% of the data; mosaic with ``shuffle_block_size = N/40`` there, as a mosaic user sizes it to the
cache). Before each repetition's cold epochs, ``bench_s3_ceiling.py`` measures the store itself
(every object fetched with 1, 4, 8 connections, bytes discarded: samples/s if reading were free) and
the summary prints each cold epoch beside it, with the CPU seconds of the reader and of the store
(``--ceiling ''`` skips it). Locally two more modes: ``workers2`` (a torch ``DataLoader`` with 2
worker processes; datamill through ``datamill.loader.torch``, litData's ``StreamingDataLoader``,
mosaic and torch map-style; not HF) and ``ranks2`` (2 rank processes at once, each with its rank's
part: datamill ``rank=``, litData ``WORLD_SIZE``/``GLOBAL_RANK``, mosaic ``RANK``/``WORLD_SIZE``,
torch ``DistributedSampler``, HF ``split_dataset_by_node``; samples/s = both ranks' samples / the
slower rank's time). Systems interleave within each repetition; median and range of ``--reps``
repetitions.

    python benchmarks/bench_peers.py                 # 1M tabular + 200k binary, local + S3, 3 reps
    python benchmarks/bench_peers.py --quick         # 100k / 20k, 1 rep: a smoke run
    python benchmarks/bench_peers.py --data img --storage local --systems datamill,litdata

This file runs in every venv (the workers import only their own library), so it imports nothing but
the standard library at the top.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = (
    "datamill",
    "datamill-procs",
    "datamill-warmup",
    "litdata",
    "streaming",
    "hf",
    "torchmap",
)
S3_SYSTEMS = ("datamill", "datamill-warmup", "datamill-full-window", "litdata", "streaming")
WORKER_SYSTEMS = (
    "datamill",
    "datamill-procs",
    "datamill-warmup",
    "litdata",
    "streaming",
    "torchmap",
)
LOCAL_MODES = ("local", "workers2", "ranks2")
S3_MODES = ("cold", "warm", "cold10")
DATAMILLS = ("datamill", "datamill-procs", "datamill-warmup", "datamill-full-window")
S3_ONLY = ("datamill-full-window",)  # on local files the default already has full windows
PROCS = "datamill-procs"  # Workers(processes=1) locally, processes=2 in workers2; not ranks2
LABELS = {
    "datamill": "datamill",
    "datamill-procs": "datamill Workers(processes=N)",
    "datamill-warmup": "datamill warmup=True",
    "datamill-full-window": "datamill warmup=False",
    "litdata": "litData 0.2.76",
    "streaming": "mosaic streaming 0.13.0",
    "hf": "HF datasets 5.2.0",
    "torchmap": "torch map-style",
}
VENV_PACKAGES: dict[str, list[list[str]]] = {  # pip install steps per peer venv, in order
    "litdata": [["torch==2.13.0"], ["litdata==0.2.76", "pyarrow", "boto3"]],
    "streaming": [["torch==2.13.0"], ["mosaicml-streaming==0.13.0", "pyarrow", "boto3"]],
    "hf": [["datasets==5.2.0", "pyarrow"]],
    "torchmap": [["torch==2.13.0"], ["pyarrow", "numpy"]],
}
BATCH = 256
FILES = 100
BUCKET = "peers"
IMAGE_BYTES = 3072


# ---------------------------------------------------------------------------------------- helpers
def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def ensure_venv(cache: Path, peer: str) -> Path:
    """The peer's venv python, created with its pinned packages when absent."""
    venv = cache / peer
    python = venv / "bin" / "python"
    marker = venv / ".datamill-bench-ready"
    if marker.exists():
        return python
    print(f"[setup] creating {venv} ...", flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # torch first (the local CPU wheel), then the rest constrained to it: litData's torchvision
    # would otherwise replace torch with a CUDA build (GBs of nvidia-* wheels)
    constraints = cache / "constraints.txt"
    constraints.write_text("torch==2.13.0+cpu\n", encoding="utf-8")
    for step in VENV_PACKAGES[peer]:
        extra = [] if step == ["torch==2.13.0"] else ["-c", str(constraints)]
        subprocess.run([str(python), "-m", "pip", "install", "-q", *extra, *step], check=True)
    if (
        peer == "litdata"
    ):  # obstore's S3Store refuses an http:// endpoint; without it litData uses boto3
        subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "obstore"], check=False)
    if peer == "streaming":  # see _stub_torchvision
        _stub_torchvision(python)
    marker.write_text("ok\n", encoding="utf-8")
    return python


TORCHVISION_STUB = {
    "__init__.py": (
        '"""A stub: mosaic streaming imports torchvision for its vision datasets only."""\n'
    ),
    "datasets/__init__.py": (
        "from torch.utils.data import Dataset as VisionDataset\nCIFAR10 = None\n"
    ),
    "transforms/__init__.py": "",
    "transforms/functional.py": "def to_tensor(x):\n    raise NotImplementedError\n",
}


def _stub_torchvision(python: Path) -> None:
    """Replace torchvision in mosaic's venv by a stub of the two names ``streaming.vision`` imports.

    ``import streaming`` imports ``streaming.vision``, which imports torchvision; PyPI's torchvision
    wheel is built for CUDA torch and fails to load beside the CPU torch wheel ("operator
    torchvision::nms does not exist"). The benchmark never uses mosaic's vision datasets.
    """
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "torchvision"], check=False)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    for rel, text in TORCHVISION_STUB.items():
        path = Path(site) / "torchvision" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def pad_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A list of sample dicts -> numpy batch: ragged ``tokens`` padded with a mask, ``image`` an
    object array."""
    import numpy as np

    out: dict[str, Any] = {}
    for key in rows[0]:
        vals = [r[key] for r in rows]
        if key == "tokens":
            out[key], out[key + "_mask"] = pad_ragged(vals)
        elif key == "image":
            arr = np.empty(len(vals), dtype=object)
            arr[:] = vals
            out[key] = arr
        else:
            out[key] = np.asarray(vals)
    return out


def pad_ragged(vals: list[Any]) -> tuple[Any, Any]:
    import numpy as np

    lengths = np.fromiter((len(v) for v in vals), dtype=np.int64, count=len(vals))
    width = int(lengths.max()) if len(vals) else 0
    mask = np.arange(width)[None, :] < lengths[:, None]
    padded = np.zeros((len(vals), width), dtype=np.int32)
    padded[mask] = (
        np.concatenate([np.asarray(v, dtype=np.int32) for v in vals]) if len(vals) else []
    )
    return padded, mask


# ---------------------------------------------------------------------------------------- data
def make_data(work: Path, ds: str, n: int) -> Path:
    """``n`` samples of ``ds`` in ``FILES`` Parquet files (one row group each) under
    ``work/ds/parquet``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = work / ds / "parquet"
    done = out / "_done.json"
    if done.exists() and json.loads(done.read_text())["n"] == n:
        return out
    shutil.rmtree(work / ds, ignore_errors=True)
    out.mkdir(parents=True)
    rng = np.random.default_rng(0 if ds == "tab" else 1)
    per = -(-n // FILES)
    for i, start in enumerate(range(0, n, per)):
        m = min(per, n - start)
        cols: dict[str, Any] = {"uid": np.arange(start, start + m, dtype=np.int64)}
        if ds == "tab":
            for j in range(3):
                cols[f"f{j}"] = rng.random(m, dtype=np.float32)
            cols["label"] = rng.integers(0, 10, m).astype(np.int64)
            lengths = rng.integers(8, 65, m)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            cols["tokens"] = pa.ListArray.from_arrays(
                pa.array(offsets),
                pa.array(rng.integers(0, 30000, int(offsets[-1]), dtype=np.int32)),
            )
        else:
            cols["label"] = rng.integers(0, 10, m).astype(np.int64)
            offsets = (np.arange(m + 1) * IMAGE_BYTES).astype(np.int32)
            data = rng.integers(0, 256, m * IMAGE_BYTES, dtype=np.uint8)
            cols["image"] = pa.BinaryArray.from_buffers(
                pa.binary(), m, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
            )
        pq.write_table(
            pa.table(cols),
            out / f"part-{i:05d}.parquet",
            row_group_size=m,
            use_dictionary=["uid", "label"],
        )
    done.write_text(json.dumps({"n": n}))
    return out


def convert(system: str, ds: str, parquet: Path, out: Path, n: int) -> None:
    """Write ``parquet``'s samples in ``system``'s format under ``out`` (runs in the peer's
    venv)."""
    import pyarrow.parquet as pq

    files = sorted(str(p) for p in parquet.glob("*.parquet"))
    if system == "litdata":
        from litdata import optimize

        optimize(
            fn=_litdata_rows,
            inputs=files,
            output_dir=str(out),
            chunk_size=max(1, n // 100),
            num_workers=2,
            mode="overwrite",
        )
    elif system == "streaming":
        from streaming import MDSWriter

        columns = {"uid": "int64", "label": "int64"}
        columns.update(
            {"f0": "float32", "f1": "float32", "f2": "float32", "tokens": "ndarray:int32"}
            if ds == "tab"
            else {"image": "bytes"}
        )
        per_sample = 180 if ds == "tab" else IMAGE_BYTES + 40
        with MDSWriter(
            out=str(out),
            columns=columns,
            size_limit=max(1 << 16, per_sample * n // 100),
            compression=None,
        ) as writer:
            for f in files:
                for row in _rows(pq.read_table(f)):
                    writer.write(row)
    elif system == "hf":
        import datasets

        datasets.disable_progress_bars()
        hfds = datasets.Dataset.from_parquet(files, cache_dir=str(out.parent / "hf-cache"))
        hfds.save_to_disk(str(out))
        shutil.rmtree(out.parent / "hf-cache", ignore_errors=True)
    else:
        raise ValueError(system)


def _rows(table: Any) -> Iterator[dict[str, Any]]:
    import numpy as np

    cols = {c: table.column(c).to_pylist() for c in table.column_names if c != "tokens"}
    if "tokens" in table.column_names:
        tok = table.column("tokens").combine_chunks()
        offs, vals = tok.offsets.to_numpy(), tok.values.to_numpy()
        cols["tokens"] = [vals[offs[i] : offs[i + 1]].astype(np.int32) for i in range(len(tok))]
    names = list(cols)
    for i in range(table.num_rows):
        yield {k: cols[k][i] for k in names}


def _litdata_rows(path: str) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    yield from _rows(pq.read_table(path))


# ---------------------------------------------------------------------------------------- workers
def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One timed epoch of one system (runs in that system's venv); uids saved to
    ``spec["uids"]``."""
    import numpy as np
    from bench_s3_ceiling import machine_cpu, machine_since  # the standard library only

    system, storage, mode = spec["system"], spec["storage"], spec["mode"]
    make = {
        "datamill": _datamill,
        "datamill-procs": _datamill,
        "datamill-warmup": _datamill,
        "datamill-full-window": _datamill,
        "litdata": _litdata,
        "streaming": _streaming,
        "hf": _hf,
        "torchmap": _torchmap,
    }[system]
    os.environ.update(spec.get("env", {}))  # ranks2: the rank's environment, before any import
    epochs = make(spec)  # imports done; returns a callable epoch(e) -> iterator of batches
    start = time.perf_counter()
    first, uids, nbytes, firsts = None, [], 0, 0
    if storage == "s3" and mode == "warm":  # the cold epoch first, untimed: the cache stays
        for batch in epochs(0):
            pass
        start = time.perf_counter()
    cpu, faults, machine = time.process_time(), _minor_faults(), machine_cpu()
    for batch in epochs(1 if mode == "warm" else 0):
        if first is None:
            first = time.perf_counter() - start
        uid, size, head = touch(batch)
        uids.append(uid)
        nbytes += size
        firsts += head
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    faults, machine = _minor_faults() - faults, machine_since(machine)
    seq = np.concatenate(uids).astype(np.int64) if uids else np.zeros(0, dtype=np.int64)
    np.save(spec["uids"], seq)
    return {
        "seconds": seconds,
        "cpu": cpu,  # this process's CPU seconds (every thread; not DataLoader workers')
        "child_cpu": _children_cpu(),  # DataLoader worker processes (once they have exited)
        "first": first or seconds,
        "samples": len(seq),
        "bytes": nbytes,
        "first_bytes": firsts,
        "faults": faults,  # minor page faults of this process in the timed epoch (memory first
        "peak_mb": _peak_rss_mb(),  # touched); its peak resident memory, MB (imports included)
        "machine": machine,  # the whole machine's CPU in the timed epoch, by kind (idle: unused)
    }


def _minor_faults() -> int:
    """This process's minor page faults so far (0 where ``resource`` is missing)."""
    try:
        import resource
    except ImportError:
        return 0
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def _peak_rss_mb() -> float:
    """This process's peak resident memory in MB (Linux reports KiB; 0 where unknown)."""
    try:
        import resource
    except ImportError:
        return 0.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _children_cpu() -> float:
    t = os.times()
    return float(t.children_user + t.children_system)


def touch(batch: Any) -> tuple[Any, int, int]:
    """What the consumer does with every batch: its uids, and on ``img`` each sample's length and
    first byte (summed); on ``tab`` the number of real tokens. The same for every system, in its own
    idiom.
    """
    import numpy as np

    uid = np.array(batch["uid"])  # a copy: a kept view would keep the whole batch alive
    if "image_offsets" in batch:  # datamill: the batch's bytes + offsets (numpy views or tensors)
        offs, values = np.asarray(batch["image_offsets"]), np.asarray(batch["image"])
        return uid, int(offs[-1] - offs[0]), int(values[offs[:-1]].sum(dtype=np.int64))
    images = batch.get("image")
    if isinstance(images, np.ndarray) and images.dtype.kind == "S":  # HF's numpy format: |S3072
        # (fixed width: a len() of an element drops trailing zero bytes, so read the raw rows)
        raw = images.view(np.uint8).reshape(len(images), images.dtype.itemsize)
        return uid, raw.size, int(raw[:, 0].sum(dtype=np.int64))
    if images is not None:  # one bytes object per sample
        return uid, sum(len(b) for b in images), sum(b[0] for b in images)
    return uid, int(np.asarray(batch["tokens_mask"]).sum()), 0


def _s3_env(spec: dict[str, Any]) -> None:
    endpoint, key, secret = spec["s3"]
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": endpoint,
            "S3_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": key,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
        }
    )


def _datamill(spec: dict[str, Any]) -> Callable[[int], Iterator[Any]]:
    sys.path.insert(0, str(ROOT / "src"))
    from datamill.core.parquet import ParquetSource
    from datamill.loader import Loader, Workers
    from datamill.loader.remote import RemoteParquetSource

    def epochs(epoch: int) -> Iterator[Any]:
        if spec["storage"] == "s3":
            _s3_env(spec)
            if "source" not in state:
                state["source"] = RemoteParquetSource(
                    spec["url"] + "/parquet",
                    cache_dir=spec["cache_dir"],
                    cache_limit=spec.get("cache_limit"),
                )
            src = state["source"]
        else:
            src = ParquetSource(spec["path"])
        rank, world = spec.get("rank", 0), spec.get("world", 1)
        procs = spec["system"] == PROCS  # batches built in worker processes, shared memory
        loader = Loader(
            src,
            BATCH,
            seed=0,
            epoch=epoch,
            batching=dataclasses.replace(_batching(spec["system"]), shuffle=True),
            rank=rank,
            world_size=world,
            workers=Workers(processes=_workers(spec) or 1) if procs else None,
        )
        if spec["mode"] == "workers2":
            from torch.utils.data import DataLoader

            from datamill.loader.torch import TorchLoaderDataset

            # datamill's own worker processes hand over through shared memory: num_workers=0
            n = 0 if procs else 2
            return iter(DataLoader(TorchLoaderDataset(loader), batch_size=None, num_workers=n))
        return iter(loader)

    state: dict[str, Any] = {}
    if spec["mode"] == "workers2":  # imported before the clock starts, as the peers' are
        import torch.utils.data  # noqa: F401

        import datamill.loader.torch  # noqa: F401
    return epochs


def _batching(system: str) -> Any:
    """datamill's defaults (warm-up windows on object storage, full windows on local files), or
    warm-up forced on (``datamill-warmup``) or off (``datamill-full-window``: the default before
    issue 31, for comparison)."""
    from datamill.loader import Batching

    if system == "datamill-warmup":
        return Batching(warmup=True)
    if system == "datamill-full-window":
        return Batching(warmup=False)
    return Batching()


def _litdata(spec: dict[str, Any]) -> Callable[[int], Iterator[Any]]:
    from litdata import StreamingDataLoader, StreamingDataset

    state: dict[str, Any] = {}

    def epochs(epoch: int) -> Iterator[Any]:
        if "loader" not in state:
            if spec["storage"] == "s3":
                _s3_env(spec)
                from litdata.streaming.resolver import Dir

                kwargs: dict[str, Any] = {}
                if spec.get("cache_limit"):
                    kwargs["max_cache_size"] = int(spec["cache_limit"])
                ds = StreamingDataset(
                    Dir(path=spec["cache_dir"], url=spec["url"] + "/litdata"),
                    shuffle=True,
                    seed=0,
                    **kwargs,
                )
            else:
                ds = StreamingDataset(spec["path"], shuffle=True, seed=0)
            state["loader"] = StreamingDataLoader(
                ds, batch_size=BATCH, num_workers=_workers(spec), collate_fn=pad_rows
            )
        return iter(state["loader"])  # a new iter is the next epoch

    return epochs


def _streaming(spec: dict[str, Any]) -> Callable[[int], Iterator[Any]]:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    state: dict[str, Any] = {}

    def epochs(epoch: int) -> Iterator[Any]:
        if "loader" not in state:
            if spec["storage"] == "s3":
                _s3_env(spec)
                kwargs: dict[str, Any] = {}
                if spec.get("cache_limit"):
                    kwargs.update(
                        cache_limit=int(spec["cache_limit"]),
                        shuffle_block_size=max(1, spec["n"] // 40),
                    )
                ds = StreamingDataset(
                    remote=spec["url"] + "/mds",
                    local=spec["cache_dir"],
                    shuffle=True,
                    shuffle_seed=0,
                    batch_size=BATCH,
                    **kwargs,
                )
            else:
                ds = StreamingDataset(
                    local=spec["path"], shuffle=True, shuffle_seed=0, batch_size=BATCH
                )
            state["loader"] = DataLoader(
                ds, batch_size=BATCH, num_workers=_workers(spec), collate_fn=pad_rows
            )
        return iter(state["loader"])

    return epochs


def _hf(spec: dict[str, Any]) -> Callable[[int], Iterator[Any]]:
    import datasets

    datasets.disable_progress_bars()

    def epochs(epoch: int) -> Iterator[Any]:
        ds = datasets.load_from_disk(spec["path"])
        if spec.get("world", 1) > 1:
            from datasets.distributed import split_dataset_by_node

            ds = split_dataset_by_node(ds, rank=spec["rank"], world_size=spec["world"])
        ds = ds.with_format("numpy").shuffle(seed=epoch)
        for batch in ds.iter(batch_size=BATCH):
            if "tokens" in batch:
                batch["tokens"], batch["tokens_mask"] = pad_ragged(list(batch["tokens"]))
            yield batch

    return epochs


def _torchmap(spec: dict[str, Any]) -> Callable[[int], Iterator[Any]]:
    import numpy as np
    import pyarrow.parquet as pq
    import torch
    from torch.utils.data import DataLoader, Dataset

    class TableDataset(Dataset):  # type: ignore[type-arg]  # torch's generic, untyped here
        def __init__(self, path: str) -> None:
            table = pq.read_table(path)
            self.cols = {
                c: table.column(c).to_numpy()
                for c in table.column_names
                if c not in ("tokens", "image")
            }
            self.tok = None
            if "tokens" in table.column_names:
                tok = table.column("tokens").combine_chunks()
                self.tok = (tok.offsets.to_numpy(), tok.values.to_numpy())
            self.image = (
                table.column("image").to_pylist() if "image" in table.column_names else None
            )
            self.n = table.num_rows

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> dict[str, Any]:
            out = {c: v[i] for c, v in self.cols.items()}
            if self.tok is not None:
                offs, vals = self.tok
                out["tokens"] = vals[offs[i] : offs[i + 1]]
            if self.image is not None:
                out["image"] = self.image[i]
            return out

    def epochs(epoch: int) -> Iterator[Any]:
        gen = torch.Generator()
        gen.manual_seed(epoch)
        ds = TableDataset(spec["path"])
        kwargs: dict[str, Any] = {"shuffle": True, "generator": gen}
        if spec.get("world", 1) > 1:
            from torch.utils.data import DistributedSampler

            sampler = DistributedSampler(
                ds, num_replicas=spec["world"], rank=spec["rank"], shuffle=True, seed=epoch
            )
            kwargs = {"sampler": sampler}
        loader = DataLoader(
            ds, batch_size=BATCH, num_workers=_workers(spec), collate_fn=pad_rows, **kwargs
        )
        return iter(loader)

    _ = np
    return epochs


def _workers(spec: dict[str, Any]) -> int:
    return 2 if spec["mode"] == "workers2" else 0


def rank_env(system: str, rank: int, world: int, port: int) -> dict[str, str]:
    """The environment a peer reads its rank from (datamill, torch map-style: arguments)."""
    if system == "litdata":
        return {"WORLD_SIZE": str(world), "GLOBAL_RANK": str(rank)}
    if system == "streaming":  # mosaic also rendezvous through torch.distributed's env://
        return {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    return {}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------------------------------- driver
def run_worker(python: Path, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    try:
        proc = subprocess.run(
            [str(python), __file__, "--worker", json.dumps(spec)],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            env={**os.environ, "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: {' | '.join(tail)}"}
    return dict(json.loads(lines[-1][7:]))


def run_ranks(python: Path, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Ranks 0 and 1 of 2 at once (two processes): their samples together, the slower one's time."""
    import numpy as np

    procs, files, port = [], [], _free_port()
    for rank in range(2):
        env = rank_env(spec["system"], rank, 2, port)
        one = {**spec, "rank": rank, "world": 2, "env": env}
        one["uids"] = spec["uids"].replace(".npy", f"-rank{rank}.npy")
        files.append(one["uids"])
        procs.append(
            subprocess.Popen(
                [str(python), __file__, "--worker", json.dumps(one)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
            )
        )
    outs = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            return {"error": f"timeout after {timeout:.0f} s"}
        lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            tail = (stderr or stdout).strip().splitlines()[-3:]
            return {"error": f"exit {proc.returncode}: {' | '.join(tail)}"}
        outs.append(json.loads(lines[-1][7:]))
    np.save(spec["uids"], np.concatenate([np.load(f) for f in files]))
    for f in files:
        Path(f).unlink()
    return {
        "seconds": max(o["seconds"] for o in outs),
        "first": max(o["first"] for o in outs),
        "samples": sum(o["samples"] for o in outs),
        "cpu": sum(o.get("cpu", 0.0) for o in outs),
        "child_cpu": sum(o.get("child_cpu", 0.0) for o in outs),
        "bytes": sum(o["bytes"] for o in outs),
        "first_bytes": sum(o["first_bytes"] for o in outs),
    }


def expected_touch(path: Path, ds: str) -> tuple[int, int]:
    """What :func:`touch` sums over an epoch of ``ds`` when every sample arrives once, intact."""
    import numpy as np
    import pyarrow.parquet as pq

    total = first = 0
    for f in sorted(Path(path).glob("*.parquet")) if Path(path).is_dir() else []:
        col = pq.ParquetFile(f).read(columns=["image" if ds == "img" else "tokens"]).column(0)
        for chunk in col.chunks:
            offs = np.frombuffer(chunk.buffers()[1], dtype=np.int32)[
                chunk.offset : chunk.offset + len(chunk) + 1
            ]
            total += int(offs[-1] - offs[0])
            if ds == "img":
                data = np.frombuffer(chunk.buffers()[2], dtype=np.uint8)
                first += int(data[offs[:-1]].sum(dtype=np.int64))
    return total, first


def mixing(seq: Any, rows_per_file: int) -> dict[str, float]:
    import numpy as np

    sys.path.insert(0, str(ROOT / "src"))
    from datamill.loader.planner import shuffle_quality

    return shuffle_quality(
        np.asarray(seq, dtype=np.int64),
        np.arange(int(seq.max()) + 1 if len(seq) else 0) // rows_per_file,
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="100k tabular / 20k binary samples, 1 repetition"
    )
    ap.add_argument(
        "--tab", type=int, default=None, help="tabular samples (default 1,000,000; --quick 100,000)"
    )
    ap.add_argument(
        "--img", type=int, default=None, help="binary samples (default 200,000; --quick 20,000)"
    )
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 3; --quick 1)")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--data", default="tab,img")
    ap.add_argument("--storage", default="local,s3")
    ap.add_argument(
        "--modes",
        default=",".join(LOCAL_MODES + S3_MODES),
        help="local: local, workers2, ranks2; s3: cold, warm, cold10",
    )
    ap.add_argument(
        "--cache", default=str(Path.home() / ".cache" / "datamill-bench"), help="peer venvs"
    )
    ap.add_argument("--work", default=None, help="data folder (default <cache>/data)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per epoch run")
    ap.add_argument(
        "--ceiling",
        default="1,4,8",
        help="S3 cold: also GET every object with this many connections at once, bytes discarded "
        "(benchmarks/bench_s3_ceiling.py), before the cold epochs of each repetition; '' skips",
    )
    ap.add_argument("--out", default=None, help="also write the markdown table here")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--convert", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    if args.convert:
        c = json.loads(args.convert)
        convert(c["system"], c["ds"], Path(c["parquet"]), Path(c["out"]), c["n"])
        return

    sizes = {
        "tab": args.tab or (100_000 if args.quick else 1_000_000),
        "img": args.img or (20_000 if args.quick else 200_000),
    }
    reps = args.reps or (1 if args.quick else 3)
    systems = [s for s in args.systems.split(",") if s]
    datas = [d for d in args.data.split(",") if d]
    storages = [s for s in args.storage.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    cache = Path(args.cache).expanduser()
    work = Path(args.work) if args.work else cache / "data"
    work.mkdir(parents=True, exist_ok=True)
    pythons = {
        s: Path(sys.executable) if s in DATAMILLS else ensure_venv(cache, s) for s in systems
    }
    cmd = " ".join(["python", "benchmarks/bench_peers.py", *sys.argv[1:]])
    print(f"# bench_peers: {cmd}\n# load at start: {load()} ({os.cpu_count()} cpus)", flush=True)

    # data and conversions (conversion time reported; reused when the same size is there)
    paths: dict[tuple[str, str], Path] = {}
    conv_times: dict[tuple[str, str], float] = {}
    for ds in datas:
        t0 = time.perf_counter()
        parquet = make_data(work, ds, sizes[ds])
        print(
            f"[data] {ds}: {sizes[ds]:,} samples in {parquet} ({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
        for s in systems:
            if s in (*DATAMILLS, "torchmap"):
                paths[(s, ds)] = parquet
                continue
            out = work / ds / s
            marker = work / ds / f"{s}.json"
            if not marker.exists():
                shutil.rmtree(out, ignore_errors=True)
                t0 = time.perf_counter()
                subprocess.run(
                    [
                        str(pythons[s]),
                        __file__,
                        "--convert",
                        json.dumps(
                            {
                                "system": s,
                                "ds": ds,
                                "parquet": str(parquet),
                                "out": str(out),
                                "n": sizes[ds],
                            }
                        ),
                    ],
                    check=True,
                    capture_output=True,
                )
                marker.write_text(json.dumps({"seconds": time.perf_counter() - t0}))
            conv_times[(s, ds)] = json.loads(marker.read_text())["seconds"]
            paths[(s, ds)] = out
            print(f"[convert] {s} {ds}: {conv_times[(s, ds)]:.1f} s", flush=True)

    results: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    loads: list[str] = []
    with _maybe_s3(on="s3" in storages, work=work) as s3:
        s3_cpu = _store_cpu(work) if s3 is not None else (lambda: 0.0)
        nbytes: dict[tuple[str, str], int] = {}
        if s3 is not None:
            _upload(s3, paths, systems, datas, nbytes)
        cases = [
            (ds, st, mode)
            for ds in datas
            for st in storages
            for mode in (LOCAL_MODES if st == "local" else S3_MODES)
            if mode in modes
        ]
        expected = {ds: expected_touch(work / ds / "parquet", ds) for ds in datas}
        ceilings: dict[str, list[dict[str, Any]]] = {}
        conns = tuple(int(c) for c in args.ceiling.split(",") if c)
        for rep in range(reps):
            for ds, st, mode in cases:
                if st == "s3" and mode == "cold" and conns and set(systems) & set(DATAMILLS):
                    assert s3 is not None
                    ceilings.setdefault(ds, []).extend(
                        _ceiling(
                            s3, ds, sizes[ds], conns[:: 1 if rep % 2 == 0 else -1], rep, s3_cpu
                        )
                    )
                for s in systems:
                    if st == "s3" and s not in S3_SYSTEMS or st == "local" and s in S3_ONLY:
                        continue
                    if mode == "workers2" and s not in WORKER_SYSTEMS:
                        continue
                    if s == PROCS and (st == "s3" or mode == "ranks2"):
                        continue
                    spec: dict[str, Any] = {
                        "system": s,
                        "storage": st,
                        "mode": mode,
                        "n": sizes[ds],
                        "path": str(paths[(s, ds)]),
                        "uids": str(work / f"uids-{s}-{ds}.npy"),
                    }
                    if st == "s3":
                        assert s3 is not None
                        cdir = work / "s3cache" / s
                        shutil.rmtree(cdir, ignore_errors=True)
                        cdir.mkdir(parents=True)
                        spec.update(s3=list(s3), url=f"s3://{BUCKET}/{ds}", cache_dir=str(cdir))
                        if mode == "cold10":
                            spec["cache_limit"] = max(1, nbytes[(s, ds)] // 10)
                    store_before = s3_cpu() if st == "s3" else None
                    asked = _requests() if st == "s3" else {}
                    if mode == "ranks2":
                        res = run_ranks(pythons[s], spec, args.timeout)
                    else:
                        res = run_worker(pythons[s], spec, args.timeout)
                    if store_before is not None and mode == "cold":
                        res["store_cpu"] = s3_cpu() - store_before
                    if asked:
                        res["requests"] = _per_object(asked, _requests(), _OBJECTS.get((s, ds), 0))
                    res["load"] = load()
                    loads.append(res["load"])
                    if "error" not in res:
                        res.update(_check(Path(spec["uids"]), sizes[ds]))
                        res["bytes_ok"] = (res["bytes"], res["first_bytes"]) == expected[ds]
                    results.setdefault((ds, st, mode, s), []).append(res)
                    _print_one(rep, ds, st, mode, s, res)
    report = _table(results, systems, datas, storages, sizes, conv_times, reps, cmd, loads)
    report += _s3_cold_summary(results, systems, datas)
    if ceilings:
        from bench_s3_ceiling import summary

        def median(ds: str, mode: str, s: str) -> float | None:
            stt = _stats(results.get((ds, "s3", mode, s), []))
            return None if stt is None else stt[0]

        report += summary(
            ceilings,
            median,
            [s for s in systems if s in S3_SYSTEMS],
            LABELS,
            lambda ds, s: results.get((ds, "s3", "cold", s), []),
            goal_for=[s for s in systems if s in DATAMILLS],
        )
    print(report)
    if args.out:
        Path(args.out).write_text(report, encoding="utf-8")


def _store_cpu(work: Path) -> Callable[[], float]:
    """The S3 server's CPU seconds so far (0 when its process cannot be found)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_s3_ceiling import find_pid, process_cpu

    pid = find_pid(f"-dir={work / 'seaweed' / 'data'}")
    return (lambda: 0.0) if pid is None else (lambda: process_cpu(pid))


_S3_METRICS: list[int] = []  # the store's metrics port
_OBJECTS: dict[tuple[str, str], int] = {}  # objects uploaded per (system, data)


def _requests() -> dict[str, int]:
    """The requests the S3 store has answered so far by type and status (empty without metrics)."""
    if not _S3_METRICS:
        return {}
    from tests.loader.seaweed import request_counts

    try:
        return request_counts(_S3_METRICS[0])
    except OSError:
        return {}


def _per_object(before: dict[str, int], after: dict[str, int], objects: int) -> str:
    """``after - before`` requests per object: total and by kind (``GET 206`` = ranged GET,
    ``GET 200`` = HEAD or whole GET)."""
    got = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
    if not got or objects <= 0:
        return ""
    parts = ", ".join(f"{k} {v / objects:.2f}" for k, v in sorted(got.items()))
    return f"requests {sum(got.values()) / objects:.2f}/object ({parts}; {objects} objects)"


def _ceiling(
    s3: tuple[str, str, str],
    ds: str,
    n: int,
    conns: tuple[int, ...],
    rep: int,
    store_cpu: Callable[[], float],
) -> list[dict[str, Any]]:
    """The store's ceiling for ``ds`` (bench_s3_ceiling: every Parquet object fetched, bytes
    discarded), one fresh process per connection count; printed like a run."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_s3_ceiling import machine_idle, measure

    runs = []
    for c in conns:  # one at a time: the store's requests counted per measurement
        before = _requests()
        got = measure(
            s3, f"{BUCKET}/{ds}/parquet", samples=n, connections=(c,), store_cpu=store_cpu
        )
        for r in got:
            objects = max(
                (v for (d, x), v in _OBJECTS.items() if x == ds and d in DATAMILLS), default=0
            )
            r["requests"] = _per_object(before, _requests(), objects)
        runs += got
    for r in runs:
        if "error" in r:
            print(
                f"[run {rep}] {ds} ceiling {r['connections']} GETs ERROR {r['error']}", flush=True
            )
        else:
            print(
                f"[run {rep}] {ds} ceiling {r['connections']} GET(s) at once: "
                f"{r['samples_s']:>11,.0f} samples/s if reading were free ({r['mb_s']:,.0f} MB/s, "
                f"{r['seconds']:.2f} s; CPU {r['cpu']:.2f} s + store "
                f"{r.get('store_cpu', 0):.2f} s), "
                + (f"{r['faults'] / 1000:,.0f}k page faults, " if "faults" in r else "")
                + (f"{r['requests']}, " if r.get("requests") else "")
                + machine_idle(r).lstrip(", ")
                + (", " if machine_idle(r) else "")
                + f"load {r['load']}",
                flush=True,
            )
    return runs


def _s3_cold_summary(
    results: dict[tuple[str, str, str, str], list[dict[str, Any]]],
    systems: list[str],
    datas: list[str],
) -> str:
    """Issue 31 point 3 for every S3 system side by side: cold and cold-with-cache-at-10% epochs
    as a share of the warm one (medians of the same run), and the worst cold first batch."""

    def med(ds: str, mode: str, s: str) -> float | None:
        stt = _stats(results.get((ds, "s3", mode, s), []))
        return None if stt is None else stt[0]

    out = [
        "",
        "S3 cold path (cold / warm and cold with cache at 10% / warm, same run, no goal set;",
    ]
    out.append("first batch from cold S3, worst run; goal <= 0.5 s):")
    for ds in datas:
        for s in [s for s in systems if s in S3_SYSTEMS]:
            warm = med(ds, "warm", s)
            if warm is None:
                continue
            ratios = [
                f"{mode} {v / warm:.2f}x" if (v := med(ds, mode, s)) is not None else f"{mode} n/a"
                for mode in ("cold", "cold10")
            ]
            firsts = [
                r["first"] for r in results.get((ds, "s3", "cold", s), []) if "error" not in r
            ]
            worst = f"{max(firsts):.2f} s" if firsts else "n/a"
            out.append(f"- {ds} {LABELS[s]}: {', '.join(ratios)}; first batch {worst}")
    return "\n".join(out) + "\n"


def _check(path: Path, n: int) -> dict[str, Any]:
    import numpy as np

    seq = np.load(path)
    once = (
        len(seq) == n
        and len(np.unique(seq)) == n
        and int(seq.min()) == 0
        and int(seq.max()) == n - 1
    )
    q = mixing(seq, -(-n // FILES))
    path.unlink()
    return {"once": bool(once), "mix": q}


class _maybe_s3:
    def __init__(self, *, on: bool, work: Path) -> None:
        self.on, self.work = on, work
        self.cm: Any = None

    def __enter__(self) -> tuple[str, str, str] | None:
        if not self.on:
            return None
        sys.path.insert(0, str(ROOT))
        from tests.loader.seaweed import free_port, seaweed_s3

        folder = self.work / "seaweed"
        shutil.rmtree(folder, ignore_errors=True)
        _S3_METRICS[:] = [free_port()]  # requests counted by the store (_requests)
        self.cm = seaweed_s3(folder, metrics_port=_S3_METRICS[0])
        return tuple(self.cm.__enter__())  # type: ignore[return-value]

    def __exit__(self, *exc: object) -> None:
        if self.cm is not None:
            self.cm.__exit__(*exc)


def _upload(
    s3: tuple[str, str, str],
    paths: dict[tuple[str, str], Path],
    systems: list[str],
    datas: list[str],
    nbytes: dict[tuple[str, str], int],
) -> None:
    import pyarrow.fs as pafs

    sys.path.insert(0, str(ROOT / "src"))
    from datamill.core.objstore import s3_filesystem

    fs = s3_filesystem(
        endpoint=s3[0], access_key=s3[1], secret_key=s3[2], allow_bucket_creation=True
    )
    fs.create_dir(BUCKET)
    names = {
        "datamill": "parquet",
        "datamill-warmup": "parquet",
        "datamill-full-window": "parquet",
        "litdata": "litdata",
        "streaming": "mds",
    }
    for ds in datas:
        for s in systems:
            if s not in S3_SYSTEMS or s in DATAMILLS and any((d, ds) in nbytes for d in DATAMILLS):
                if s in DATAMILLS:
                    first = next(d for d in DATAMILLS if (d, ds) in nbytes)
                    nbytes[(s, ds)] = nbytes[(first, ds)]
                    _OBJECTS[(s, ds)] = _OBJECTS[(first, ds)]
                continue
            local = paths[(s, ds)]
            files = [p for p in local.rglob("*") if p.is_file() and not p.name.startswith("_")]
            t0 = time.perf_counter()
            for p in files:
                pafs.copy_files(
                    str(p),
                    f"{BUCKET}/{ds}/{names[s]}/{p.relative_to(local)}",
                    destination_filesystem=fs,
                )
            if s in DATAMILLS:  # datamill's index beside the objects (written with them)
                from datamill.loader.parquet_index import write_parquet_index

                write_parquet_index(f"s3://{BUCKET}/{ds}/{names[s]}", local=local, filesystem=fs)
            nbytes[(s, ds)] = sum(p.stat().st_size for p in files)
            _OBJECTS[(s, ds)] = len(files)
            print(
                f"[s3] {s} {ds}: {len(files)} objects, {nbytes[(s, ds)] / 2**20:,.1f} MiB "
                "uploaded in "
                f"{time.perf_counter() - t0:.1f} s",
                flush=True,
            )


def _print_one(rep: int, ds: str, st: str, mode: str, s: str, res: dict[str, Any]) -> None:
    from bench_s3_ceiling import machine_idle

    if "error" in res:
        print(f"[run {rep}] {ds} {mode:6s} {s:10s} ERROR {res['error']}", flush=True)
        return
    rate = res["samples"] / res["seconds"]
    print(
        f"[run {rep}] {ds} {mode:6s} {s:10s} {rate:>11,.0f} samples/s, first batch "
        f"{res['first']:.2f} s, CPU {res.get('cpu', 0):.2f} s "
        f"({res.get('cpu', 0) / max(1, res['samples']) * 1e6:.2f} us/sample in the trainer)"
        + (f" + store {res['store_cpu']:.2f} s" if "store_cpu" in res else "")
        + (f" + workers {res['child_cpu']:.2f} s" if res.get("child_cpu") else "")
        + (f", {res['requests']}" if res.get("requests") else "")
        + (
            f", {res['faults'] / 1000:,.0f}k page faults, peak RSS {res['peak_mb']:,.0f} MB"
            if res.get("peak_mb")
            else ""
        )
        + (machine_idle(res) if st == "s3" else "")
        + f", once={res['once']}, bytes ok={res.get('bytes_ok')}, median "
        f"distance {res['mix']['median_distance']:,.0f}, load {res['load']}",
        flush=True,
    )


def _stats(runs: list[dict[str, Any]]) -> tuple[float, float, float, float] | None:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return None
    rates = [r["samples"] / r["seconds"] for r in ok]
    return (
        statistics.median(rates),
        min(rates),
        max(rates),
        statistics.median(r["first"] for r in ok),
    )


def _table(
    results: dict[tuple[str, str, str, str], list[dict[str, Any]]],
    systems: list[str],
    datas: list[str],
    storages: list[str],
    sizes: dict[str, int],
    conv: dict[tuple[str, str], float],
    reps: int,
    cmd: str,
    loads: list[str],
) -> str:
    out = [
        f"### bench_peers: `{cmd}`",
        "",
        (
            f"samples/s of one shuffled epoch (batch {BATCH}; one process unless the mode says "
            f"workers2 / ranks2), median of {reps} interleaved repetition(s) [range], first batch "
            "(s); mixing = neighbour distance median / p10 and same-file share of the delivered "
            "order. The consumer keeps every batch's uids and, on img, reads each sample's length "
            "and first byte (peers: a Python loop over their bytes objects; datamill: numpy over "
            "its bytes + offsets), on tab sums the token mask; `once` = every uid exactly once and "
            "those sums equal the data's. Load average (1/5/15 min) over the runs: "
            f"{loads[0] if loads else '-'} ... {loads[-1] if loads else '-'}."
        ),
        "",
    ]
    out.append(
        "| data | storage/mode | system | samples/s | range | first batch s | once | mixing: "
        "median / p10 dist, same file |"
    )
    out.append("|---|---|---|---|---|---|---|---|")
    med: dict[tuple[str, str, str], float] = {}
    for (ds, st, mode, s), runs in sorted(
        results.items(),
        key=lambda kv: (datas.index(kv[0][0]), kv[0][1], kv[0][2], systems.index(kv[0][3])),
    ):
        stt = _stats(runs)
        if stt is None:
            out.append(
                f"| {ds} {sizes[ds]:,} | {st} {mode} | {LABELS[s]} | error: "
                f"{runs[-1]['error'][:80]} | | | | |"
            )
            continue
        m, lo, hi, first = stt
        med[(ds, mode, s)] = m
        ok = [r for r in runs if "error" not in r]
        q = ok[-1]["mix"]
        once = all(r["once"] and r.get("bytes_ok", True) for r in ok)
        out.append(
            f"| {ds} {sizes[ds]:,} | {st} {mode} | {LABELS[s]} | {m:,.0f} | {lo:,.0f}-{hi:,.0f} "
            f"| {first:.2f} | "
            f"{'yes' if once else 'NO'} | {q['median_distance']:,.0f} / {q['p10_distance']:,.0f}, "
            f"{q['same_shard']:.0%} |"
        )
    if conv:
        out += [
            "",
            "conversion (s): "
            + ", ".join(f"{s} {ds} {t:.1f}" for (s, ds), t in sorted(conv.items())),
        ]
    out += [
        "",
        (
            "Goals (datamill vs the peers, same run; load 1/5/15 min over the runs "
            f"{loads[0] if loads else '-'} ... {loads[-1] if loads else '-'}):"
        ),
    ]

    def ratio(a: tuple[str, str, str], b: tuple[str, str, str]) -> str:
        return f"{med[a] / med[b]:.2f}x" if a in med and b in med else "n/a"

    def goal(name: str, value: str, target: float) -> None:
        ok = value != "n/a" and float(value.rstrip("x")) >= target
        out.append(
            f"- {name}: {value} (goal >= {target}x) "
            f"{'MET' if ok else 'NOT MET' if value != 'n/a' else ''}"
        )

    if PROCS in systems:
        out += _procs_goals(results, med, datas, ratio, goal)
    for dm in [d for d in DATAMILLS if d in systems and d != PROCS]:
        tag = LABELS[dm]
        goal(
            f"3 KB binary, local: {tag} / litData",
            ratio(("img", "local", dm), ("img", "local", "litdata")),
            1.5,
        )
        goal(
            f"3 KB binary, warm S3: {tag} / litData",
            ratio(("img", "warm", dm), ("img", "warm", "litdata")),
            1.5,
        )
        goal(
            f"3 KB binary, cold S3: {tag} / litData",
            ratio(("img", "cold", dm), ("img", "cold", "litdata")),
            1.5,
        )
        # a cold epoch's goal is against the store's ceiling, and its cold / warm ratios (no goal)
        # are in the S3 cold path section (_s3_cold_summary), both below the table
        for mode in ("workers2", "ranks2"):
            value = ratio(("img", mode, dm), ("img", mode, "litdata"))
            if value != "n/a":
                out.append(f"- 3 KB binary, {mode}: {tag} / litData: {value} (no goal set)")
        peers = [s for s in systems if s not in DATAMILLS and ("tab", "local", s) in med]
        if peers and ("tab", "local", dm) in med:
            best = max(peers, key=lambda s: med[("tab", "local", s)])
            goal(
                f"tabular, local: {tag} / best peer ({best})",
                ratio(("tab", "local", dm), ("tab", "local", best)),
                1.0,
            )
        firsts = [
            r["first"]
            for ds in datas
            for r in results.get((ds, "s3", "cold", dm), [])
            if "error" not in r
        ]
        if firsts:
            out.append(
                f"- first batch from cold S3 ({tag}, worst): {max(firsts):.2f} s (goal <= 0.5 s) "
                f"{'MET' if max(firsts) <= 0.5 else 'NOT MET'}"
            )
    return "\n".join(out) + "\n"


def _procs_goals(
    results: dict[tuple[str, str, str, str], list[dict[str, Any]]],
    med: dict[tuple[str, str, str], float],
    datas: list[str],
    ratio: Callable[[tuple[str, str, str], tuple[str, str, str]], str],
    goal: Callable[[str, str, float], None],
) -> list[str]:
    """Issue 41 point 3: worker processes against in process, the trainer's own CPU per sample
    (``time.process_time()`` in the trainer, the consumer included), the 2-process path against
    litData's 2-worker ``StreamingDataLoader``; ``goal`` appends its lines to the report."""
    out: list[str] = []
    for ds in datas:
        goal(
            f"{ds}, local: Workers(processes=1) / in process",
            ratio((ds, "local", PROCS), (ds, "local", "datamill")),
            0.95,
        )
        for mode in ("local", "workers2"):
            for s in ("datamill", PROCS):
                runs = [r for r in results.get((ds, "local", mode, s), []) if "error" not in r]
                if runs:
                    us = statistics.median(r["cpu"] / max(1, r["samples"]) * 1e6 for r in runs)
                    ok = "MET" if us <= 1.0 else "NOT MET"
                    out.append(
                        f"- {ds}, {mode}: the trainer's CPU per sample, {LABELS[s]}: {us:.2f} us "
                        + (f"(goal <= 1 us) {ok}" if s == PROCS else "(for comparison)")
                    )
    goal(
        "3 KB binary, 2 workers: Workers(processes=2) through DataLoader / litData "
        "StreamingDataLoader(num_workers=2)",
        ratio(("img", "workers2", PROCS), ("img", "workers2", "litdata")),
        1.5,
    )
    return out


if __name__ == "__main__":
    main()
