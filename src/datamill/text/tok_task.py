"""One tokenize task: read its documents, ``encode_batch`` them in large batches, write its shard
into the work folder (temp name + rename) and then its receipt (the commit marker of the task).

The same :func:`run_task` runs in the calling process, in a local worker process and in a Ray task,
so every engine writes the same bytes. A task's shard holds ``uid`` (int64: the input's index in the
run's inputs ``<< 40`` | the document's byte offset, or Parquet row), ``tokens`` (list of uint16
when
the vocabulary fits, else int32), ``length`` (int32) and the kept metadata columns.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from datamill.core.ragged import encodings_to_csr
from datamill.text.tok_inputs import InputFile, Task
from datamill.text.tok_read import BadRecords, Batch, ReadOptions, read_task

__all__ = ["UID_SHIFT", "TaskConfig", "done_tasks", "run_task", "shard_name", "token_type"]

UID_SHIFT = 40
"""A document's UID is ``file index << UID_SHIFT | position`` (positions below 1 TiB)."""

Progress = Callable[[int, int, int], None]
"""``(stored bytes, documents, tokens)`` done since the last call."""


@dataclass(frozen=True)
class TaskConfig:
    """Everything a task needs (picklable): inputs, read options, tokenizer JSON, specials, work
    folder."""

    files: tuple[InputFile, ...]
    read: ReadOptions
    tokenizer_json: str
    bos: int | None
    eos: int | None
    vocab_size: int
    work: str


def token_type(vocab_size: int) -> pa.DataType:
    """``uint16`` when every id fits, else ``int32``.

    Examples:
        >>> token_type(50257), token_type(100_000)
        (DataType(uint16), DataType(int32))
    """
    return pa.uint16() if vocab_size <= 1 << 16 else pa.int32()


def shard_name(k: int) -> str:
    """The work folder's file of task ``k``."""
    return f"task-{k:05d}.parquet"


def _receipt(k: int) -> str:
    return f"task-{k:05d}.json"


_TOKENIZERS: dict[str, Any] = {}


def _tokenizer(text: str) -> Any:
    """The ``tokenizers.Tokenizer`` of a JSON text, built once per process."""
    tok = _TOKENIZERS.get(text)
    if tok is None:
        from tokenizers import Tokenizer

        _TOKENIZERS.clear()
        tok = _TOKENIZERS[text] = Tokenizer.from_str(text)
    return tok


def _with_specials(
    ids: NDArray[np.int32], offsets: NDArray[np.int64], bos: int | None, eos: int | None
) -> tuple[NDArray[np.int32], NDArray[np.int64]]:
    """BOS/EOS around every document: one scatter of the ids into the longer array."""
    nb, ne = int(bos is not None), int(eos is not None)
    if not nb and not ne:
        return ids, offsets
    n = len(offsets) - 1
    lens = np.diff(offsets)
    new_off = np.zeros(n + 1, np.int64)
    np.cumsum(lens + nb + ne, out=new_off[1:])
    out = np.empty(int(new_off[-1]), np.int32)
    doc = np.repeat(np.arange(n, dtype=np.int64), lens)
    out[np.arange(len(ids), dtype=np.int64) + doc * (nb + ne) + nb] = ids
    if bos is not None:
        out[new_off[:-1]] = bos
    if eos is not None:
        out[new_off[1:] - 1] = eos
    return out, new_off


def _encode(cfg: TaskConfig, task: Task, batch: Batch) -> pa.Table:
    tok = _tokenizer(cfg.tokenizer_json)
    ids, offsets = encodings_to_csr(
        tok.encode_batch_fast(batch.texts, add_special_tokens=False), dtype=np.int32
    )
    ids, offsets = _with_specials(ids, offsets, cfg.bos, cfg.eos)
    ttype = token_type(cfg.vocab_size)
    tokens = pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)),
        pa.array(ids.astype(ttype.to_pandas_dtype(), copy=False), ttype),
    )
    uid = (np.int64(task.file) << np.int64(UID_SHIFT)) | batch.positions
    cols: dict[str, Any] = {
        "uid": pa.array(uid, pa.int64()),
        "tokens": tokens,
        "length": pa.array(np.diff(offsets).astype(np.int32)),
    }
    for k in cfg.read.keep:
        extra = batch.extra
        have = extra is not None and k in extra.column_names
        cols[k] = extra.column(k) if extra is not None and have else pa.nulls(len(uid), pa.string())
    return pa.table(cols)


def _schema(cfg: TaskConfig) -> pa.Schema:
    fields = [
        ("uid", pa.int64()),
        ("tokens", pa.list_(token_type(cfg.vocab_size))),
        ("length", pa.int32()),
    ]
    return pa.schema(fields + [(k, pa.string()) for k in cfg.read.keep])


def run_task(cfg: TaskConfig, task: Task, progress: Progress | None = None) -> dict[str, Any]:
    """Tokenize ``task`` into the work folder; returns its receipt (counts and bad records).

    Raises:
        DataFileError: a bad record (unless skipped), located by file, line and field.
    """
    f = cfg.files[task.file]
    work = Path(cfg.work)
    # the work file is read once, by the publisher: no dictionary, no compression (2-3x cheaper to
    # write and read than the defaults the published shard gets)
    final = work / shard_name(task.index)
    tmp = work / f".{shard_name(task.index)}.{os.getpid()}.tmp"
    bad = BadRecords()
    docs = tokens = done = 0
    schema = _schema(cfg)
    try:
        with pq.ParquetWriter(tmp, schema, use_dictionary=False, compression="none") as w:
            for batch in read_task(f, task, cfg.read, bad):
                t = _encode(cfg, task, batch).cast(schema) if batch.texts else schema.empty_table()
                if t.num_rows:
                    w.write_table(t)
                n_tok = int(pa.compute.sum(t.column("length")).as_py() or 0) if t.num_rows else 0
                docs, tokens = docs + t.num_rows, tokens + n_tok
                if progress is not None:
                    progress(batch.done - done, t.num_rows, n_tok)
                done = batch.done
        if progress is not None and done < task.weight:
            progress(task.weight - done, 0, 0)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    receipt = {
        "task": task.index,
        "file": task.file,
        "documents": docs,
        "tokens": tokens,
        "work": task.weight,
        "bad": bad.count,
        "bad_examples": bad.examples,
    }
    rtmp = work / f".{_receipt(task.index)}.{os.getpid()}.tmp"
    rtmp.write_text(json.dumps(receipt, sort_keys=True), encoding="utf-8")
    os.replace(rtmp, work / _receipt(task.index))
    return receipt


def done_tasks(work: Path) -> dict[int, dict[str, Any]]:
    """The receipts of the tasks finished in ``work`` (a task whose shard or receipt is missing is
    not done)."""
    out: dict[int, dict[str, Any]] = {}
    if not work.is_dir():
        return out
    for p in sorted(work.glob("task-*.json")):
        try:
            r = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        k = int(r.get("task", -1))
        if k >= 0 and (work / shard_name(k)).is_file():
            out[k] = r
    return out
