"""BERT Parquet: writing row groups as they are produced, and reading them back as padded batches.

The file metadata key ``datamill`` holds a JSON object (format, layout, max_seq_length, special
ids, tokenizer file, counts). :class:`BertParquetSource` is a
:class:`~datamill.core.parquet.ParquetSource` (row groups are shards) that checks that JSON;
:func:`collate_bert` turns a batch table of either layout into fixed-shape padded arrays
(``BertParquetSource.padded_collate``), which :func:`datamill.loader.read_batches` uses (seeded
shuffle, rank split, resumable state). This producer never imports the loader: the loader's Source
registry finds the file.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from datamill.core.checks import check_path
from datamill.core.constants import BERT_FORMAT
from datamill.core.errors import DataFileError, DataFileNotFoundError
from datamill.core.faults import fault_point
from datamill.core.io import PathLike, atomic_path
from datamill.core.parquet import ParquetSource
from datamill.core.ragged import csr_from_arrow, pad
from datamill.pretrain.bert._mask import bert_schema
from datamill.pretrain.bert._run import TaskResult

__all__ = [
    "BertParquetSource",
    "WriteStats",
    "collate_bert",
    "is_bert_parquet",
    "read_bert_metadata",
    "read_bert_tokenizer_json",
    "write_batches",
]

META_KEY = "datamill"
TOKENIZER_KEY = "datamill.tokenizer"  # file metadata only (not in the Arrow schema read back)
COMPRESSION = "zstd"  # see benchmarks/results/bert.md: dictionary + zstd is small and fast enough


@dataclass
class WriteStats:
    samples: int = 0
    tokens: int = 0
    row_groups: int = 0
    timings: dict[str, float] = field(default_factory=dict)


def write_batches(
    results: Iterable[TaskResult],
    out: PathLike,
    *,
    layout: str,
    meta: dict[str, Any],
    tokenizer_json: str | None = None,
) -> WriteStats:
    """Write every task's batches as row groups of ``out`` (atomically); metadata completed at the
    end."""
    stats = WriteStats()
    worker: dict[str, float] = {}
    write_s = 0.0
    wait_s = 0.0
    schema = bert_schema(layout).with_metadata({META_KEY: json.dumps(meta, sort_keys=True)})
    with atomic_path(out) as tmp:
        # statistics of list columns are useless (min/max token id) and cost ~7% of the write;
        # dictionary pages of token ids cost ~20% of the write and make the file larger, not smaller
        writer = pq.ParquetWriter(
            tmp,
            schema,
            compression=COMPRESSION,
            write_statistics=["is_random_next"],
            use_dictionary=False,
        )
        try:
            t = time.perf_counter()
            for res in results:
                t1 = time.perf_counter()
                wait_s += t1 - t
                for batch in res.batches:
                    writer.write_batch(batch.replace_schema_metadata(schema.metadata))
                    stats.row_groups += 1
                    fault_point("bert.row_group_written")
                stats.samples += res.samples
                stats.tokens += res.tokens
                for k, v in res.timings.items():
                    worker[k] = worker.get(k, 0.0) + v
                t = time.perf_counter()
                write_s += t - t1
            final = dict(
                meta, samples=stats.samples, tokens=stats.tokens, row_groups=stats.row_groups
            )
            kv = {META_KEY: json.dumps(final, sort_keys=True)}
            if tokenizer_json is not None:
                kv[TOKENIZER_KEY] = tokenizer_json
            writer.add_key_value_metadata(kv)
        finally:
            t2 = time.perf_counter()
            writer.close()
            write_s += time.perf_counter() - t2
        fault_point("bert.before_switch")
    stats.timings = {
        "write_parquet": write_s,
        "wait_for_samples": wait_s,
        **{f"workers_{k}": v for k, v in worker.items()},
    }
    return stats


def is_bert_parquet(path: PathLike) -> bool:
    """Whether ``path`` is a Parquet file whose metadata carries datamill's BERT key (a cheap
    check).

    Examples:
        >>> is_bert_parquet("no-such-file.parquet")
        False
    """
    p = Path(check_path(path))
    if not (p.is_file() and p.suffix in (".parquet", ".pq")):
        return False
    try:
        return META_KEY.encode() in (pq.read_metadata(p).metadata or {})
    except (OSError, pa.ArrowException):
        return False


def read_bert_metadata(path: PathLike) -> dict[str, Any]:
    """The ``datamill`` JSON of a BERT Parquet file; errors name the file."""
    p = Path(check_path(path, name="the BERT Parquet path"))
    if not p.exists():
        raise DataFileNotFoundError("no such BERT Parquet file", path=p)
    try:
        kv = pq.read_metadata(p).metadata or {}
    except (OSError, pa.ArrowException) as exc:
        raise DataFileError(f"not a readable Parquet file ({exc})", path=p) from exc
    raw = kv.get(META_KEY.encode())
    try:
        meta = json.loads(raw) if raw is not None else None
    except ValueError as exc:
        raise DataFileError("the 'datamill' metadata is not valid JSON", path=p) from exc
    if not isinstance(meta, dict) or meta.get("format") != BERT_FORMAT:
        found = None if not isinstance(meta, dict) else meta.get("format")
        raise DataFileError(
            f"expected BERT samples (metadata format {BERT_FORMAT!r}), found {found!r}",
            path=p,
            hint="write it with datamill.build_bert_samples / `datamill bert`",
        )
    return meta


def read_bert_tokenizer_json(path: PathLike) -> str:
    """The tokenizer JSON stored in a BERT Parquet file (checked as a datamill BERT file first)."""
    read_bert_metadata(path)
    raw = (pq.read_metadata(path).metadata or {}).get(TOKENIZER_KEY.encode())
    if raw is None:
        raise DataFileError(
            "no tokenizer stored in the file metadata",
            path=Path(path),
            hint="use the <stem>.tokenizer.json beside it, or rebuild the file",
        )
    return bytes(raw).decode("utf-8")


def _pad_rows(
    col: pa.ChunkedArray | pa.Array, width: int, fill: int, dtype: Any
) -> tuple[NDArray[Any], NDArray[np.int64]]:
    """A list column padded to ``(n, width)`` with ``fill``, and its row offsets."""
    values, offsets = csr_from_arrow(col)
    return pad(values, offsets, width, fill=fill, dtype=dtype)[0], offsets


class BertBatchCollate:
    """Picklable collate: a batch table (either layout) -> dict of fixed-shape numpy arrays.

    Keys: ``tokens`` (int32, ``(B, L)``), ``segment_ids`` (int8, -1 on padding), ``attention_mask``
    (bool), ``is_random_next`` (bool), ``masked_positions`` / ``masked_labels`` (int32, ``(B, P)``,
    0 after the sample's predictions) and ``masked_weights`` (float32, 1 for real predictions),
    with ``L = max_seq_length`` and ``P = max_predictions_per_seq``; torch tensors with
    ``as_torch``.
    """

    def __init__(self, meta: dict[str, Any], *, as_torch: bool = False) -> None:
        self.L = int(meta["max_seq_length"])
        self.P = int(meta["max_predictions_per_seq"])
        self.pad = int(meta["special_ids"]["pad"])
        self.as_torch = as_torch

    def __call__(self, table: pa.Table) -> dict[str, Any]:
        n = table.num_rows
        tokens, to = _pad_rows(table.column("tokens"), self.L, self.pad, np.int32)
        length = np.diff(to)
        pos = np.arange(self.L, dtype=np.int64)[None, :]
        if "segment_ids" in table.column_names:
            seg, _ = _pad_rows(table.column("segment_ids"), self.L, -1, np.int8)
            attention = seg >= 0
        else:  # compact layout: segments from segment_a_length, padding from the list length
            a_len = table.column("segment_a_length").to_numpy().astype(np.int64)
            attention = pos < length[:, None]
            seg = (pos >= a_len[:, None]).view(np.int8) - 2 * (~attention).view(np.int8)
        positions, po = _pad_rows(table.column("masked_positions"), self.P, 0, np.int32)
        labels, _ = _pad_rows(table.column("masked_labels"), self.P, 0, np.int32)
        out = {
            "tokens": tokens,
            "segment_ids": seg.astype(np.int8),
            "attention_mask": attention,
            "is_random_next": table.column("is_random_next")
            .to_numpy(zero_copy_only=False)
            .astype(np.bool_),
            "masked_positions": positions,
            "masked_labels": labels,
            "masked_weights": (np.arange(self.P)[None, :] < np.diff(po)[:, None]).astype(
                np.float32
            ),
        }
        assert out["tokens"].shape == (n, self.L)
        if self.as_torch:
            from datamill.core.optional import require

            torch = require("torch", extra="torch")
            return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}
        return out


def collate_bert(
    path_or_meta: PathLike | dict[str, Any], *, as_torch: bool = False
) -> BertBatchCollate:
    """The collate function for a BERT Parquet file (its metadata gives ``L`` and ``P``)."""
    meta = path_or_meta if isinstance(path_or_meta, dict) else read_bert_metadata(path_or_meta)
    return BertBatchCollate(meta, as_torch=as_torch)


class BertParquetSource(ParquetSource):
    """A BERT Parquet file as a Source (row groups are shards), with its ``meta`` checked."""

    def __init__(self, path: PathLike) -> None:
        self.meta = read_bert_metadata(path)
        super().__init__(path)

    def padded_collate(self, *, as_torch: bool = False) -> BertBatchCollate:
        """The loader ``collate`` giving fixed-shape padded batches (:class:`BertBatchCollate`)."""
        return BertBatchCollate(self.meta, as_torch=as_torch)
