"""The inputs of ``datamill tokenize``: files and globs (local or any storage scheme), their kind,
and the plan of tasks (a file and a byte range, or a range of Parquet row groups).

A task is the unit of work, of resumption and of output (one task -> one shard). Uncompressed JSONL
and text files are cut into byte ranges of about ``task_bytes``; a range ``[a, b)`` owns every
record that *starts* in it (the cut after ``a`` moves to the next record boundary, found the same
way by the task before it). Compressed files (``.gz``, ``.zst``: not seekable) are one task each,
Parquet files one task per run of row groups. The plan lists tasks in input order (the shard
order); :func:`schedule` orders them largest first, so no big task is left for the end.
"""

from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from datamill.core.errors import ConfigError, DataFileError, DataFileNotFoundError
from datamill.core.storage import filesystem_for, is_remote, storage_error

__all__ = [
    "COMPRESSIONS",
    "TASK_COST",
    "InputFile",
    "Task",
    "auto_task_bytes",
    "expand_inputs",
    "plan_tasks",
    "schedule",
]

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
"""File suffix -> pyarrow codec of the compressed inputs (read with ``CompressedInputStream``)."""

_KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
_GLOB = set("*?[")
MIN_TASK_BYTES = 256 << 10
MAX_TASK_BYTES = 64 << 20
MIN_PIECE = 4 << 10
TASK_COST = 16 << 10
"""The fixed cost of a task (opening its input, its shard file, its receipt) in stored bytes."""
_FINER = ((0.05, 16), (0.20, 4))
"""(share of the splittable bytes left, how much finer the ranges are cut there)."""


@dataclass(frozen=True)
class InputFile:
    """One input file: its URL as given (expanded), kind, codec and size in stored bytes."""

    url: str
    kind: str
    """``"jsonl"``, ``"parquet"`` or ``"text"``."""
    compression: str | None
    size: int


@dataclass(frozen=True)
class Task:
    """One unit of work: ``file`` (index into the inputs), ``[start, end)`` and its weight.

    ``start``/``end`` are byte offsets (uncompressed text or JSONL), row-group indices (Parquet), or
    ``0``/``size`` (a compressed file, read whole). ``weight`` is the stored bytes it covers plus
    :data:`TASK_COST` (the work the progress bar counts: a task's fixed cost, its shard file and
    receipt, counts as that many bytes, so runs of many small files get an honest ETA too) (what
    the progress bar counts).
    """

    index: int
    file: int
    start: int
    end: int
    weight: int


def _kind(url: str) -> tuple[str, str | None]:
    name = url.rsplit("/", 1)[-1].lower()
    p = PurePosixPath(name)
    ext = p.suffix
    codec = COMPRESSIONS.get(ext)
    if codec is not None:
        ext = PurePosixPath(p.stem).suffix
    return _KINDS.get(ext, "text"), codec


def _info(url: str) -> pafs.FileInfo:
    fs, path = filesystem_for(url)
    try:
        return fs.get_file_info(path)
    except OSError as exc:
        raise storage_error(exc, url) from exc


def _expand_remote(spec: str) -> list[str]:
    """:func:`_expand_one` for a URL: the object itself, the objects below a prefix that is a
    folder, or a glob's matches (sorted, with the URL's scheme)."""
    fs, path = filesystem_for(spec)
    prefix = spec[: len(spec) - len(spec.split("://", 1)[1])]
    if _GLOB & set(path):
        base = path[: min(path.index(c) for c in _GLOB if c in path)].rsplit("/", 1)[0]
        sel = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        try:
            infos = fs.get_file_info(sel)
        except OSError as exc:
            raise storage_error(exc, spec) from exc
        return sorted(
            prefix + i.path
            for i in infos
            if i.type == pafs.FileType.File and fnmatch.fnmatchcase(i.path, path)
        )
    info = _info(spec)
    if info.type == pafs.FileType.Directory:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
        return sorted(prefix + i.path for i in infos if i.type == pafs.FileType.File)
    return [spec]


def _expand_one(spec: str) -> list[str]:
    """The files ``spec`` names: itself, the files below a folder, or a glob's matches (sorted)."""
    if is_remote(spec):
        return _expand_remote(spec)
    if _GLOB & set(spec):
        return sorted(p for p in glob.glob(spec, recursive=True) if Path(p).is_file())  # noqa: PTH207 - a glob of the user's, absolute or relative
    if os.path.isdir(spec):  # noqa: PTH112 - False for a name the OS refuses (too long), not an OSError
        return sorted(
            str(p) for p in Path(spec).rglob("*") if p.is_file() and not p.name.startswith(".")
        )
    return [spec]


def expand_inputs(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
) -> list[InputFile]:
    """Every input file, in the order given (a glob's or folder's files sorted), duplicates once.

    Raises:
        ConfigError: no inputs. DataFileNotFoundError: a file, folder or glob that names nothing.

    Examples:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "b.jsonl").write_text('{"text": "x"}\\n')
        >>> _ = (d / "a.txt.gz").write_bytes(b"")
        >>> [(pathlib.Path(f.url).name, f.kind, f.compression) for f in expand_inputs(str(d / "*"))]
        [('a.txt.gz', 'text', 'gzip'), ('b.jsonl', 'jsonl', None)]
    """
    specs = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    if not specs:
        raise ConfigError("no inputs given", hint="name files, folders or globs of documents")
    out: list[InputFile] = []
    seen: set[str] = set()
    for spec in (os.fspath(s) for s in specs):
        urls = _expand_one(spec)
        if not urls:
            raise DataFileNotFoundError(
                "no file matches", path=spec, hint="check the path or the glob pattern"
            )
        for url in urls:
            if url in seen:
                continue
            seen.add(url)
            info = _info(url)
            if info.type != pafs.FileType.File:
                raise DataFileNotFoundError(
                    "no such file", path=url, hint="check the path (inputs are files or globs)"
                )
            kind, codec = _kind(url)
            if kind == "parquet" and codec is not None:
                raise DataFileError(
                    "a compressed Parquet file is not supported (Parquet compresses its pages)",
                    path=url,
                    hint="decompress it first",
                )
            out.append(InputFile(url, kind, codec, int(info.size or 0)))
    return out


def auto_task_bytes(total: int) -> int:
    """The task size of a run over ``total`` stored bytes: about 1/128 of it, within [256 KiB,
    64 MiB] (independent of the worker count, so every engine cuts the same shards).

    Examples:
        >>> auto_task_bytes(10 << 30) == 64 << 20, auto_task_bytes(1000) == 256 << 10
        (True, True)
    """
    return int(min(MAX_TASK_BYTES, max(MIN_TASK_BYTES, total // 128)))


def _parquet_tasks(f: InputFile, file: int, task_bytes: int, first: int) -> list[Task]:
    fs, path = filesystem_for(f.url)
    try:
        with fs.open_input_file(path) as raw:
            meta = pq.ParquetFile(raw).metadata
    except OSError as exc:
        raise storage_error(exc, f.url) from exc
    except Exception as exc:  # pyarrow raises ArrowInvalid for a file that is not Parquet
        raise DataFileError(f"not a Parquet file: {exc}", path=f.url) from exc
    tasks: list[Task] = []
    lo, acc = 0, 0
    for g in range(meta.num_row_groups):
        acc += meta.row_group(g).total_byte_size
        if acc >= task_bytes or g == meta.num_row_groups - 1:
            tasks.append(Task(first + len(tasks), file, lo, g + 1, acc + TASK_COST))
            lo, acc = g + 1, 0
    return tasks


def _piece(task_bytes: int, left: int, splittable: int) -> int:
    """The size of the next range when ``left`` splittable bytes follow it (finer near the end)."""
    for share, div in _FINER:
        if left <= share * splittable:
            return max(MIN_PIECE, task_bytes // div)
    return task_bytes


def plan_tasks(
    files: Sequence[InputFile], *, task_bytes: int, whole_files: bool = False
) -> list[Task]:
    """The tasks over ``files`` in input order (task ``i`` becomes shard ``i``).

    Byte ranges are ``task_bytes`` long, except that the last 20% of the splittable bytes (those of
    uncompressed text and JSONL files, in input order) are cut 4 times finer and the last 5% 16
    times finer: run largest first, those small pieces are what the workers share at the end, so
    they all finish together (independent of the worker count: every engine cuts the same shards).

    Args:
        files: from :func:`expand_inputs`.
        task_bytes: the stored bytes of a task (the last range of a file is shorter).
        whole_files: one task per text file (a document per file). Defaults to ``False``.

    Examples:
        >>> fs = [InputFile("a.jsonl", "jsonl", None, 250), InputFile("b.gz", "text", "gzip", 40)]
        >>> [(t.file, t.start, t.end) for t in plan_tasks(fs, task_bytes=100)]
        [(0, 0, 100), (0, 100, 200), (0, 200, 250), (1, 0, 40)]
        >>> plan_tasks(fs, task_bytes=100)[0].weight == 100 + TASK_COST
        True
    """
    whole = [f.compression is not None or whole_files or f.kind == "parquet" for f in files]
    splittable = sum(f.size for f, w in zip(files, whole, strict=True) if not w)
    left = splittable
    tasks: list[Task] = []
    for i, f in enumerate(files):
        if f.kind == "parquet":
            tasks += _parquet_tasks(f, i, task_bytes, len(tasks))
            continue
        if whole[i]:
            tasks.append(Task(len(tasks), i, 0, f.size, f.size + TASK_COST))
            continue
        lo = 0
        while lo < f.size or (lo == 0 and f.size == 0):
            hi = min(lo + _piece(task_bytes, left, splittable), f.size)
            tasks.append(Task(len(tasks), i, lo, hi, hi - lo + TASK_COST))
            left -= hi - lo
            lo = hi
            if f.size == 0:
                break
    return tasks


def schedule(tasks: Sequence[Task]) -> list[Task]:
    """The order to run ``tasks`` in: largest first (ties in input order), so the work left near the
    end is small pieces that keep every worker busy (no tail).

    Examples:
        >>> ts = [Task(0, 0, 0, 10, 10), Task(1, 1, 0, 50, 50), Task(2, 2, 0, 10, 10)]
        >>> [t.index for t in schedule(ts)]
        [1, 0, 2]
    """
    return sorted(tasks, key=lambda t: (-t.weight, t.index))
