"""BERT documents on Ray: raw text split and tokenised in ``map_batches``, the document index built
from per-block counts.

1. :func:`plan_text_blocks` cuts every file into byte ranges of about :data:`TEXT_BLOCK_BYTES`
   (a zip member is one range). A line belongs to the range holding its first byte, so a worker
   reads whole lines without any scan on the driver (:func:`_read_range`).
2. :func:`tokenize_blocks` runs :func:`_split_tokenize` in ``map_batches`` (one range per batch):
   the local engine's :func:`~datamill.pretrain.bert.engine.split_block` (same document rule: blank
   and ``=`` title lines and file ends break documents), then the tokenizer, rebuilt from its JSON
   once per worker. Each block's row keeps its token ids, sentence lengths and per-document counts
   in the object store; only small columns come to the driver.
3. :func:`build_index` folds the blocks in order on the driver with per-block scalars: document
   ids chain across blocks (a document continued from the block before is merged), and the local
   engine's document blocks (``plan_shards``: cuts every ``SHARD_TOKENS`` tokens) are computed one
   block's document token counts at a time. The driver never holds the tokens, nor an array per
   sentence or per document.
4. :func:`corpus_state` (on a worker, once per process and run) assembles the global sentence and
   document offsets from every block's counts, and reads token ids across blocks
   (:class:`BlockedIds`), zero-copy from the object store: the random "other document" of a pair is
   drawn from the global document index exactly as the local engine draws it.
"""

from __future__ import annotations

import itertools
import os
import pickle
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.errors import DataFileError, DataFileNotFoundError, DatamillError
from datamill.core.io import PathLike, display_name, open_bytes, split_member
from datamill.pretrain.bert.engine import (
    check_file,
    init_state,
    resolve_tokenizer,
    shard_tokens,
    split_block,
)

__all__ = [
    "TEXT_BLOCK_BYTES",
    "BlockedIds",
    "DocumentIndex",
    "build_index",
    "corpus_state",
    "plan_text_blocks",
    "tokenize_blocks",
]

TEXT_BLOCK_BYTES = 16 << 20
"""Raw text per ``map_batches`` task (whole lines; the output does not depend on it)."""

_SMALL = [
    "block",
    "file",
    "breaks",
    "sentences",
    "content",
    "groups",
    "first_doc",
    "last_doc",
    "tokens",
    "kept",
    "error",
    "doc_tokens",
]
_TOKENIZERS: dict[str, Any] = {}
_STATES: dict[str, Any] = {}


def plan_text_blocks(paths: list[PathLike]) -> list[dict[str, Any]]:
    """The byte ranges to split and tokenise, in order: ``{block, file, path, start, end}``.

    Raises:
        DataFileNotFoundError: a file is missing. DataFileError: a path is a folder.

    Examples:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
        >>> _ = p.write_text("x" * 10)
        >>> [(b["start"], b["end"]) for b in plan_text_blocks([p])]
        [(0, 10)]
    """
    out: list[dict[str, Any]] = []
    for i, path in enumerate(paths):
        base, member = split_member(path)
        if not base.exists():
            raise DataFileNotFoundError(
                "no such file", path=base, hint="check the path (every node must see it)"
            )
        if base.is_dir():
            raise DataFileError("expected a file, found a folder", path=base)
        size = (1 << 62) if member is not None else base.stat().st_size  # a zip member: one range
        step = size if member is not None else TEXT_BLOCK_BYTES
        for start in range(0, max(size, 1), max(step, 1)):
            out.append(
                {
                    "block": len(out),
                    "file": i,
                    "path": os.fspath(path),
                    "start": start,
                    "end": min(start + step, size),
                }
            )
    return out


def _read_range(path: str, start: int, end: int) -> tuple[bytes, int]:
    """The whole lines that start in ``[start, end)`` and the byte offset of the first one."""
    with open_bytes(path) as f:
        pos = 0
        if start > 0:
            f.seek(start - 1)
            pos = (
                start - 1 + len(f.readline())
            )  # the line holding byte start-1 belongs to the range before
        if pos >= end:
            return b"", pos
        f.seek(pos)
        data = f.read(end - pos)
        if data and not data.endswith(b"\n"):
            data += f.readline()
        return data, pos


def _lines_before(path: str, pos: int) -> int:
    """Newlines in the first ``pos`` bytes (only to name the line of an error)."""
    n = 0
    with open_bytes(path) as f:
        while pos > 0:
            chunk = f.read(min(pos, 1 << 24))
            if not chunk:
                break
            n += chunk.count(b"\n")
            pos -= len(chunk)
    return n


def _tokenizer(tok_json: str) -> Any:
    from datamill.core.fingerprint import fingerprint_obj

    key = fingerprint_obj(tok_json)
    if key not in _TOKENIZERS:
        from tokenizers import Tokenizer

        _TOKENIZERS.clear()
        _TOKENIZERS[key] = resolve_tokenizer(Tokenizer.from_str(tok_json))
    return _TOKENIZERS[key]


_SCHEMA = pa.schema(
    [
        ("block", pa.int64()),
        ("file", pa.int64()),
        ("breaks", pa.int64()),
        ("sentences", pa.int64()),
        ("content", pa.bool_()),
        ("groups", pa.int64()),
        ("first_doc", pa.int64()),
        ("last_doc", pa.int64()),
        ("tokens", pa.int64()),
        ("kept", pa.int64()),
        ("error", pa.binary()),
        ("ids", pa.large_list(pa.int32())),
        ("sent_len", pa.large_list(pa.int64())),
        ("doc_sents", pa.large_list(pa.int64())),
        ("doc_tokens", pa.large_list(pa.int64())),
    ]
)
_LISTS = ("ids", "sent_len", "doc_sents", "doc_tokens")


def _tokenize_range(r: dict[str, Any], tok_json: str, sentence_split: str) -> dict[str, Any]:
    data, pos = _read_range(r["path"], r["start"], r["end"])
    try:
        sentences, doc, breaks = split_block(data, 1, r["path"], sentence_split=sentence_split)
    except DataFileError as err:  # name the line in the whole file
        line = (err.line or 1) + _lines_before(r["path"], pos)
        raise DataFileError(
            err.msg, path=display_name(r["path"]), line=line, hint=err.hint
        ) from err
    flat, offsets = _tokenizer(tok_json).encode(sentences)
    lengths = np.diff(offsets).astype(np.int64)
    keep = lengths > 0  # as tokenize_documents: sentences that tokenise to nothing are dropped
    sent_len, docs = lengths[keep], doc[keep]
    starts = (
        np.flatnonzero(np.concatenate([[True], docs[1:] != docs[:-1]]))
        if len(docs)
        else np.zeros(0, np.int64)
    )
    doc_sents = np.diff(np.concatenate([starts, [len(docs)]])).astype(np.int64)
    doc_tokens = (
        np.add.reduceat(sent_len, starts).astype(np.int64) if len(starts) else np.zeros(0, np.int64)
    )
    return {
        "breaks": breaks,
        "sentences": len(sentences),
        "content": bool(data) and not data.isspace(),
        "groups": len(starts),
        "first_doc": int(docs[0]) if len(docs) else -1,
        "last_doc": int(docs[-1]) if len(docs) else -1,
        "tokens": int(sent_len.sum()),
        "kept": len(sent_len),
        "ids": np.asarray(flat, np.int32),
        "sent_len": sent_len,
        "doc_sents": doc_sents,
        "doc_tokens": doc_tokens,
    }


def _split_tokenize(batch: pa.Table, tok_json: str, sentence_split: str) -> pa.Table:
    """``map_batches``: each row (a byte range) -> its sentences' token ids and document counts.

    A :class:`~datamill.core.errors.DatamillError` (a bad byte, a missing file) travels in the row's
    ``error`` column, so the driver raises it as it is (Ray Data would wrap it) and in block order.
    """
    rows = []
    for r in batch.to_pylist():
        try:
            row = _tokenize_range(r, tok_json, sentence_split)
        except DatamillError as err:
            row = {"error": pickle.dumps(err)}
        rows.append(
            {
                **{name: 0 for name in _SCHEMA.names},
                "first_doc": -1,
                "last_doc": -1,
                "content": False,
                "error": None,
                **{name: np.zeros(0, np.int64) for name in _LISTS},
                **row,
                "block": r["block"],
                "file": r["file"],
            }
        )
    columns: list[pa.Array] = []
    for fld in _SCHEMA:
        if fld.name in _LISTS:
            parts = [row[fld.name] for row in rows]
            offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
            values = pa.array(np.concatenate(parts) if parts else [], fld.type.value_type)
            columns.append(pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values))
        else:
            columns.append(pa.array([row[fld.name] for row in rows], fld.type))
    return pa.Table.from_arrays(columns, schema=_SCHEMA)


def tokenize_blocks(
    ray: Any, blocks: list[dict[str, Any]], tok_json: str, *, sentence_split: str
) -> Any:
    """The materialized Ray Dataset of tokenised blocks (one row per byte range, in order)."""
    ds = ray.data.from_items(blocks, override_num_blocks=len(blocks))
    return ds.map_batches(
        _split_tokenize,
        batch_size=1,
        batch_format="pyarrow",
        fn_kwargs={"tok_json": tok_json, "sentence_split": sentence_split},
    ).materialize()


@dataclass
class DocumentIndex:
    """What the driver knows about the corpus: per-block scalars and the document blocks (tasks)."""

    documents: int = 0
    sentences: int = 0  # split sentences, before dropping those that tokenise to nothing
    tokens: int = 0
    merge: list[bool] = field(
        default_factory=list
    )  # block b's first document continues the one before
    shards: list[tuple[int, int]] = field(default_factory=list)  # the local engine's plan_shards


def build_index(tokenized: Any, paths: list[PathLike]) -> DocumentIndex:
    """Fold the blocks' small columns in block order (see the module docstring); check every file.

    Raises:
        DataFileError: a file is empty or holds no text line (as the local engine).
    """
    idx = DocumentIndex()
    step = shard_tokens()
    cuts: list[int] = []
    next_cut = 0  # the next multiple of SHARD_TOKENS to place
    raw_base = 0  # the local engine's raw document id at the start of the block
    last_raw: int | None = None
    current = (-1, False, 0)  # file, has content, sentences found
    expected = 0
    for batch in tokenized.select_columns(_SMALL).iter_batches(
        batch_format="pyarrow", batch_size=None
    ):
        doc_tokens = batch.column("doc_tokens").combine_chunks()
        offs = np.asarray(doc_tokens.offsets.to_numpy(), np.int64)
        values = np.asarray(doc_tokens.values.to_numpy(), np.int64)
        for i, r in enumerate(batch.drop_columns(["doc_tokens"]).to_pylist()):
            if (
                r["block"] != expected
            ):  # pragma: no cover - Ray Data keeps the order (preserve_order)
                raise RuntimeError(
                    f"tokenised blocks out of order: got {r['block']}, expected {expected}"
                )
            expected += 1
            if r["error"] is not None:  # the first failed block in order (a worker's DatamillError)
                raise pickle.loads(r["error"])  # written by this run's own tasks
            if r["file"] != current[0]:
                if current[0] >= 0:
                    check_file(paths[current[0]], empty=not current[1], found=current[2])
                    raw_base += 1  # a file end ends a document
                current = (r["file"], False, 0)
            current = (current[0], current[1] or r["content"], current[2] + r["sentences"])
            merge = r["groups"] > 0 and last_raw == raw_base + r["first_doc"]
            idx.merge.append(merge)
            starts = idx.tokens + np.concatenate(
                [[0], np.cumsum(values[offs[i] : offs[i + 1]])[:-1]]
            ).astype(np.int64)
            first_index = idx.documents - int(merge)
            if merge:
                starts, first_index = starts[1:], first_index + 1
            while (
                len(starts) and next_cut <= starts[-1]
            ):  # plan_shards: first document starting at a cut or after
                cuts.append(first_index + int(np.searchsorted(starts, next_cut, side="left")))
                next_cut += step
            idx.documents += r["groups"] - int(merge)
            idx.sentences += r["sentences"]
            idx.tokens += r["tokens"]
            if r["groups"] > 0:
                last_raw = raw_base + r["last_doc"]
            raw_base += r["breaks"]
    if current[0] >= 0:
        check_file(paths[current[0]], empty=not current[1], found=current[2])
    idx.shards = _shard_ranges(cuts, idx.documents)
    return idx


def _shard_ranges(cuts: list[int], documents: int) -> list[tuple[int, int]]:
    """The ``(first, end)`` documents of each shard (the local engine's ``plan_shards``) from the
    documents that start one (``cuts``); empty ranges left out."""
    bounds = np.unique(np.asarray([0, *cuts, documents], np.int64))
    return [(int(a), int(b)) for a, b in itertools.pairwise(bounds) if b > a]


class BlockedIds:
    """The corpus token ids as per-block arrays (zero-copy from the object store), indexed globally.

    Examples:
        >>> ids = BlockedIds(
        ...     [np.array([1, 2], np.int32), np.zeros(0, np.int32), np.array([3], np.int32)]
        ... )
        >>> len(ids), ids[np.array([2, 0, 1])].tolist()
        (3, [3, 1, 2])
    """

    def __init__(self, arrays: list[NDArray[np.int32]]) -> None:
        self.arrays = [a for a in arrays if len(a)]
        self.starts = np.concatenate([[0], np.cumsum([len(a) for a in self.arrays])]).astype(
            np.int64
        )

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: NDArray[np.int64]) -> NDArray[np.int32]:
        """``ids[index]`` of the concatenated corpus (one gather per block touched)."""
        index = np.asarray(index, dtype=np.int64)
        if len(self.arrays) == 1:
            return self.arrays[0][index]
        blk = np.searchsorted(self.starts, index, side="right") - 1
        out = np.empty(len(index), dtype=np.int32)
        if len(self.arrays) <= 16:  # a mask per block is cheaper than sorting
            for b, arr in enumerate(self.arrays):
                m = blk == b
                out[m] = arr[index[m] - self.starts[b]]
            return out
        order = np.argsort(blk, kind="stable")
        sorted_blk = blk[order]
        for part in np.split(order, np.flatnonzero(np.diff(sorted_blk)) + 1):
            if len(part):
                b = int(blk[part[0]])
                out[part] = self.arrays[b][index[part] - self.starts[b]]
        return out


def _row_arrays(tables: list[pa.Table], name: str, dtype: Any) -> list[NDArray[Any]]:
    out: list[NDArray[Any]] = []
    for t in tables:
        for chunk in t.column(name).chunks:
            offs = np.asarray(chunk.offsets.to_numpy(), np.int64)
            values = chunk.values.to_numpy(zero_copy_only=False)
            out.extend(np.asarray(values[offs[j] : offs[j + 1]], dtype) for j in range(len(chunk)))
    return out


def corpus_state(key: str, refs: list[Any], merge: list[bool]) -> Any:
    """The pair tasks' corpus (``engine.init_state``) from every tokenised block, once per worker
    process."""
    if key not in _STATES:
        import ray

        tables = [t.select(["ids", "sent_len", "doc_sents"]) for t in ray.get(refs)]
        sent_len = _row_arrays(tables, "sent_len", np.int64)
        doc_sents = _row_arrays(tables, "doc_sents", np.int64)
        sent_offsets = np.concatenate([[0], np.cumsum(np.concatenate(sent_len))]).astype(np.int64)
        base = np.concatenate([[0], np.cumsum([len(s) for s in sent_len])]).astype(np.int64)
        doc_starts = [
            b + np.concatenate([[0], np.cumsum(d)[:-1]]).astype(np.int64)[int(m) :]
            for b, d, m in zip(base[:-1], doc_sents, merge)
            if len(d)
        ]
        doc_offsets = np.concatenate([*doc_starts, base[-1:]]).astype(np.int64)
        ids = BlockedIds(_row_arrays(tables, "ids", np.int32))
        _STATES.clear()
        _STATES[key] = init_state(
            cast(NDArray[np.int32], ids), sent_offsets, doc_offsets
        )  # ids quacks as an array
    return _STATES[key]
