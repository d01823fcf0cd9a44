"""The fuzzer's folder: small real inputs, good outputs made by datamill itself, their damaged
copies, a user's files, an unwritable folder, and the menu of hostile values built from them.

Layout of the workspace ``W`` (every path the fuzzer passes is inside it; the current folder is
``W/cwd``)::

    inputs/   small real inputs (CSV, Parquet, text, zip, PNG, tokenizer, configs) and damaged
              copies
    outputs/  good outputs of every kind (corpus, word2vec, BERT Parquet, shardset, HDF5 +
              meta.json, loader state); after each command each one must still load
    bad/      truncated and corrupted copies of outputs (meta.json, dataset.json, states, HDF5,
              shards)
    user/     a user's file and folder (never to be changed)
    ro/       an unwritable folder (``chattr +i``; see :func:`make_unwritable`)
    cwd/      the current folder while a command runs; emptied after each command
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import struct
import subprocess
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

__all__ = ["Workspace", "build_workspace"]

NUMBERS = [
    "0",
    "-1",
    "1",
    "2",
    "3",
    "100000",
    "1000000",
    "nan",
    "inf",
    "-inf",
    "1e18",
    "1000000000000000000",
    "2147483648",
    "9223372036854775808",
    "0.5",
    "1e-300",
    "-0.0",
    "",
    " ",
    "abc",
    "\u0663",
    "1_000",
]
"""Hostile numbers, as command-line strings (U+0663 is an Arabic-Indic 3, which int() accepts)."""

STRINGS = [
    "",
    " ",
    "x" * 100_000,
    "a\x00b",
    "\u00fcn\u00efc\u00f6d\u00e9 \u540d\u524d \U0001f389",
    "-",
    ".",
    "..",
    "--",
    "-x",
    "\n",
    "id,label",
    "nan",
    "inf",
    "0",
    "-1",
    "%s%n",
    "{}",
    "[]",
    "../../../../etc/passwd-not",
]
"""Hostile strings (the last one resolves outside nothing: it is relative to ``W/cwd`` and
absent)."""


@dataclass
class Workspace:
    """The prepared folder and what the fuzzer draws from it."""

    root: Path
    unwritable: str  # how the unwritable folder was made
    paths: dict[str, str] = field(default_factory=dict)  # name -> absolute path
    outputs: dict[str, Callable[[Path], Any]] = field(
        default_factory=dict
    )  # good output -> its loader

    def p(self, name: str) -> str:
        return self.paths[name]

    @property
    def cwd(self) -> Path:
        return self.root / "cwd"

    def path_menu(self) -> list[str]:
        """Every prepared path plus hostile path-like strings."""
        return sorted(set(self.paths.values())) + STRINGS


def _truncate(src: Path, dst: Path) -> None:
    data = src.read_bytes()
    dst.write_bytes(data[: len(data) // 2])


def _corrupt(src: Path, dst: Path) -> None:
    data = bytearray(src.read_bytes())
    mid = len(data) // 2
    for i in range(mid, min(len(data), mid + 64)):
        data[i] ^= 0x5A
    dst.write_bytes(bytes(data))


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR declares ``width`` x ``height`` (RGB) with one tiny IDAT: a decompression
    bomb."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body))
            + kind
            + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 16))
        + chunk(b"IEND", b"")
    )


def bomb_png() -> bytes:
    """The issue's example: a PNG header declaring 100000 x 100000 pixels."""
    return _png_header(100_000, 100_000)


def make_unwritable(folder: Path) -> str:
    """Make ``folder`` unwritable even for root: ``chattr +i`` when it works, else say so (the
    fuzzer then relies on paths under a file, which fail for everyone). Returns the method used."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "inside.txt").write_text("already here\n")
    if shutil.which("chattr"):
        done = subprocess.run(["chattr", "+i", os.fspath(folder)], capture_output=True, check=False)
        if done.returncode == 0:
            probe = folder / ".probe"
            try:
                probe.write_text("x")
            except OSError:
                return "chattr +i"
            probe.unlink()
            subprocess.run(["chattr", "-i", os.fspath(folder)], capture_output=True, check=False)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return "chmod 555"
    return "none (root without chattr: only paths under a file are unwritable)"


def release_unwritable(folder: Path) -> None:
    """Undo :func:`make_unwritable` so the folder can be removed."""
    if shutil.which("chattr") and folder.exists():
        subprocess.run(["chattr", "-i", os.fspath(folder)], capture_output=True, check=False)
    with contextlib.suppress(OSError):
        folder.chmod(0o755)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        yield


def _cli(*args: str) -> None:
    from datamill.cli import main

    with _quiet():
        status = main(["-q", *args])
    if status != 0:
        raise RuntimeError(
            f"preparing the fuzz workspace: datamill {' '.join(args)} exited {status}"
        )


def build_workspace(root: Path, data_dir: Path) -> Workspace:
    """Create the workspace under ``root`` (a fresh temporary folder)."""
    ws = Workspace(root=root, unwritable="")
    for sub in ("inputs", "outputs", "bad", "user", "cwd", "fakedata"):
        (root / sub).mkdir(parents=True)
    i, o, b, u = root / "inputs", root / "outputs", root / "bad", root / "user"
    paths = ws.paths

    # ---- inputs: a small table (30 rows of house prices), text, a zip, images, configs
    house = pcsv.read_csv(data_dir / "house_prices_train.csv").slice(0, 30)
    house = house.select(["Id", "MSZoning", "LotArea", "Street", "SalePrice"])
    pcsv.write_csv(house, i / "table.csv")
    pq.write_table(house, i / "table.parquet")
    (i / "table.yaml").write_text(
        "input_features:\n  - {name: MSZoning, type: category}\n"
        "  - {name: LotArea, type: number}\n  - {name: Street, type: binary}\n"
        "output_features:\n  - {name: SalePrice, type: number}\n"
    )
    (i / "dupkeys.yaml").write_text(
        "input_features:\n  - {name: MSZoning, type: category}\n"
        "input_features:\n  - {name: LotArea, type: number}\n"
    )
    (i / "bad.yaml").write_text("input_features: [{name: nope, type: category}\n")
    text = (
        (data_dir / "timemachine.txt")
        .read_text(encoding="utf-8")
        .splitlines(keepends=True)[100:300]
    )
    (i / "text.txt").write_text("".join(text), encoding="utf-8")
    raw = (
        (data_dir / "wikitext2_test.raw")
        .read_text(encoding="utf-8")
        .splitlines(keepends=True)[:120]
    )
    (i / "raw.txt").write_text("".join(raw), encoding="utf-8")
    with zipfile.ZipFile(data_dir / "ptb.zip") as z:
        ptb = z.read("ptb/ptb.train.txt").decode().splitlines(keepends=True)[:300]
    with zipfile.ZipFile(i / "ptb.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("ptb/ptb.train.txt", "".join(ptb))
    (i / "images").mkdir()
    for k, src in enumerate(sorted((data_dir / "cifar10_tiny" / "images").glob("*.png"))[:6]):
        shutil.copy(src, i / "images" / f"{k}.png")
    (i / "images" / "bomb.png").write_bytes(bomb_png())
    _truncate(i / "images" / "0.png", i / "images" / "trunc.png")
    _corrupt(i / "images" / "1.png", i / "images" / "corrupt.png")
    rows = "\n".join(f"{k},images/{k}.png,{'cat' if k % 2 else 'dog'}" for k in range(6))
    (i / "images.csv").write_text(f"id,image_path,label\n{rows}\n")
    for bad in ("bomb", "trunc", "corrupt"):
        (i / f"images_{bad}.csv").write_text(
            f"id,image_path,label\n{rows}\n6,images/{bad}.png,cat\n"
        )
    (i / "images.yaml").write_text(
        "input_features:\n  - {name: image_path, type: image}\n"
        "output_features:\n  - {name: label, type: category}\n"
    )
    for name in ("table.csv", "table.parquet", "ptb.zip", "text.txt"):
        stem, ext = name.rsplit(".", 1)
        _truncate(i / name, i / f"{stem}_trunc.{ext}")
        _corrupt(i / name, i / f"{stem}_corrupt.{ext}")
    (i / "empty.txt").write_text("")
    (i / "binary.bin").write_bytes(bytes(range(256)) * 4)

    # ---- a fake data folder for `demo` (the real one would run the whole tour)
    shutil.copy(i / "table.csv", root / "fakedata" / "house_prices_train.csv")

    # ---- good outputs, made by datamill itself
    _cli(
        "preprocess",
        os.fspath(i / "table.csv"),
        "-c",
        os.fspath(i / "table.yaml"),
        "-o",
        os.fspath(o / "prep"),
    )
    _cli("corpus", os.fspath(i / "text.txt"), "--level", "word", "--out", os.fspath(o / "corpus"))
    _cli(
        "word2vec",
        os.fspath(i / "ptb.zip") + ":ptb/ptb.train.txt",
        "--out",
        os.fspath(o / "w2v"),
        "--min-freq",
        "1",
        "--window",
        "2",
    )
    _cli(
        "bert",
        os.fspath(i / "raw.txt"),
        "--out",
        os.fspath(o / "bert.parquet"),
        "--vocab-size",
        "300",
        "--max-seq-length",
        "32",
        "--dupe-factor",
        "1",
        "--workers",
        "1",
    )
    _cli(
        "shards",
        "create",
        os.fspath(o / "ds"),
        "--uid",
        "Id",
        "--shardset",
        "main",
        os.fspath(i / "table.csv"),
        "--shard-size",
        "8",
    )
    _cli(
        "iterate",
        os.fspath(o / "ds"),
        "--batch-size",
        "4",
        "--limit",
        "2",
        "--save-state",
        os.fspath(o / "state.json"),
        "--save-record",
        os.fspath(o / "record.json"),
    )
    _cli("serve", "keys", "create", "--state", os.fspath(o / "serve"), "--role", "admin")
    shutil.copy(
        o / "bert.tokenizer.json"
        if (o / "bert.tokenizer.json").exists()
        else next(o.glob("*tokenizer*.json")),
        i / "tokenizer.json",
    )

    from datamill.preprocessing import load
    from datamill.pretrain.bert import read_metadata
    from datamill.pretrain.word2vec import SkipGramSamples
    from datamill.shards import ShardsetDataset
    from datamill.text import Corpus

    hdf5 = next((o / "prep").glob("*.hdf5"))
    meta = next((o / "prep").glob("*.meta.json"))
    ws.outputs = {
        os.fspath(o / "prep"): lambda p: load(next(p.glob("*.hdf5"))),
        os.fspath(o / "corpus"): lambda p: Corpus.load(p, mmap=False),
        os.fspath(o / "w2v"): SkipGramSamples.load,
        os.fspath(o / "bert.parquet"): read_metadata,
        os.fspath(o / "bert.tokenizer.json"): lambda p: json.loads(p.read_text(encoding="utf-8")),
        os.fspath(o / "ds"): lambda p: ShardsetDataset(p).describe(),
        os.fspath(o / "state.json"): lambda p: _load_state(p),
        os.fspath(o / "record.json"): lambda p: json.loads(p.read_text(encoding="utf-8")),
        os.fspath(o / "serve"): lambda p: _cli("serve", "keys", "list", "--state", os.fspath(p)),
    }

    # ---- damaged outputs
    state = o / "state.json"
    _truncate(state, b / "state_trunc.json")
    _corrupt(state, b / "state_corrupt.json")
    st = json.loads(state.read_text())
    for key, value in (
        ("batches_seen", 10**6),
        ("epoch", -1),
        ("seed", "x"),
        ("samples_seen", 2**70),
    ):
        if key in st:
            (b / f"state_{key}.json").write_text(json.dumps({**st, key: value}))
    for kind, fn in (("trunc", _truncate), ("corrupt", _corrupt)):
        shutil.copytree(o / "prep", b / f"prep_meta_{kind}")
        fn(meta, b / f"prep_meta_{kind}" / meta.name)
        shutil.copytree(o / "prep", b / f"prep_hdf5_{kind}")
        fn(hdf5, b / f"prep_hdf5_{kind}" / hdf5.name)
        shutil.copytree(o / "ds", b / f"ds_manifest_{kind}")
        fn(o / "ds" / "dataset.json", b / f"ds_manifest_{kind}" / "dataset.json")
        shutil.copytree(o / "ds", b / f"ds_shard_{kind}")
        shard = min((b / f"ds_shard_{kind}").rglob("*.parquet"))
        fn(shard, shard)
        fn(o / "bert.parquet", b / f"bert_{kind}.parquet")
        shutil.copytree(o / "corpus", b / f"corpus_{kind}")
        for f in sorted((b / f"corpus_{kind}").iterdir())[:2]:
            fn(f, f)

    # ---- a user's files, the unwritable folder
    (u / "notes.txt").write_text("my precious notes\n")
    (u / "mydir").mkdir()
    (u / "mydir" / "keep.md").write_text("mine\n")
    ws.unwritable = make_unwritable(root / "ro")

    for folder in (i, o, b, u):
        for entry in sorted(folder.rglob("*")):
            paths[os.fspath(entry.relative_to(root))] = os.fspath(entry)
    paths.update(
        {
            "missing": os.fspath(root / "missing" / "nothing.csv"),
            "missing_dir": os.fspath(root / "nothing-here"),
            "under_file": os.fspath(u / "notes.txt" / "sub" / "out"),
            "ro_child": os.fspath(root / "ro" / "out"),
            "ro_file": os.fspath(root / "ro" / "out.parquet"),
            "ro": os.fspath(root / "ro"),
            "inside_input": os.fspath(o / "ds" / "new"),
            "inside_corpus": os.fspath(o / "corpus" / "x.parquet"),
            "zip_member": os.fspath(i / "ptb.zip") + ":ptb/ptb.train.txt",
            "zip_missing_member": os.fspath(i / "ptb.zip") + ":nope.txt",
            "fresh_dir": os.fspath(root / "cwd" / "fresh"),
            "fresh_file": os.fspath(root / "cwd" / "fresh.parquet"),
            "fakedata": os.fspath(root / "fakedata"),
        }
    )
    return ws


def _load_state(path: Path) -> Any:
    state = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(state, dict) or "format" not in state:
        raise ValueError(f"{path}: not a loader state")
    return state


def table_for(n: int) -> pa.Table:
    """A small deterministic table (for the API fuzzer's sources)."""
    rng = np.random.default_rng(0)
    return pa.table(
        {"uid": np.arange(n), "x": rng.normal(size=n), "label": rng.choice(["a", "b"], n)}
    )
