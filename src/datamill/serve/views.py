"""Read-only views of registered datasets (for the web UI and scripts): kind, statistics, checks, samples.

:class:`Inspector` does the work without HTTP; :data:`router` exposes it as JSON under ``/api/v1``
(``read`` keys, sent as a Bearer header or the UI's cookie):

* ``GET /api/v1/datasets/{id}/describe``: kind, counts, shardsets (``ShardsetDataset.describe()``),
  Parquet footer statistics, a preprocessed dataset's metadata, ``check`` violations;
* ``GET /api/v1/datasets/{id}/columns/{column}/values``: top values and a histogram, computed on
  demand (``{"status": "running", "done", "total"}`` until ready) and cached;
* ``GET /api/v1/datasets/{id}/samples?offset=&limit=&columns=``: a page of rows as typed cells.

No request names a file: images stored as paths are served by ``(dataset, row, column)`` and only
when the path resolves inside one of the server's roots.
"""

from __future__ import annotations

import base64
import os
import threading
import urllib.parse
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
from fastapi import APIRouter, Depends, Query, Request

from datamill.core.constants import HDF5_SUFFIX, META_SUFFIX
from datamill.core.errors import ConfigError, DatamillError, SchemaError
from datamill.core.source import Source
from datamill.serve.access import Reader, check_dataset
from datamill.serve.server import NotFoundError
from datamill.serve.ui.stats import ValueStats, footer_stats

__all__ = ["IMAGE_TYPES", "MAX_LIMIT", "Inspector", "inspector", "router"]

MAX_LIMIT = 200
MAX_INLINE = 256 * 1024
IMAGE_TYPES = {b"\x89PNG\r\n\x1a\n": "image/png", b"\xff\xd8\xff": "image/jpeg", b"GIF87a": "image/gif",
               b"GIF89a": "image/gif", b"RIFF": "image/webp"}
_IMAGE_EXT = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
              ".webp": "image/webp"}
_KINDS = {"ShardsetDataset": "shardset dataset", "HDF5Source": "preprocessed HDF5", "ParquetSource": "Parquet",
          "CorpusSource": "corpus", "BertParquetSource": "BERT Parquet"}


def sniff_image(data: bytes) -> str | None:
    """The image MIME type of ``data`` from its magic bytes, else ``None``.

    Examples:
        >>> sniff_image(b"\\x89PNG\\r\\n\\x1a\\n...."), sniff_image(b"hello")
        ('image/png', None)
    """
    for magic, mime in IMAGE_TYPES.items():
        if data.startswith(magic) and (magic != b"RIFF" or data[8:12] == b"WEBP"):
            return mime
    return None


class Inspector:
    """Open registered datasets (cached by path and modification time) and describe them.

    Args:
        state: the server's :class:`~datamill.serve.server.ServeState`.

    Examples:
        >>> import tempfile, pyarrow as pa
        >>> from pathlib import Path
        >>> from datamill.serve.server import ServeState
        >>> from datamill.shards.dataset import ShardsetDataset
        >>> root = Path(tempfile.mkdtemp())
        >>> ds = ShardsetDataset.create(root / "d", pa.table({"uid": [1, 2], "x": [3, 4]}), uid="uid", shardset="a",
        ...                             shard_size=2)
        >>> _ = ds.add("b", pa.table({"uid": [2], "y": ["z"]}), route=True)
        >>> state = ServeState(root / ".state", roots=[root], auth=False)
        >>> insp = Inspector(state)
        >>> ds_id = state.register("d", name="d")["id"]
        >>> insp.summary("d")["kind"], insp.detail("d")["describe"]["shardsets"][1]["missing"]
        ('shardset dataset', 1)
        >>> [[c["t"] for c in r["cells"]] for r in insp.samples("d", columns=["y"])["rows"]]
        [['missing'], ['value']]
        >>> state.close()
    """

    def __init__(self, state: Any) -> None:
        self.state = state
        self.values = ValueStats()
        self._lock = threading.Lock()
        self._open: dict[str, tuple[int, Source]] = {}
        self._checks: dict[str, list[dict[str, Any]]] = {}

    def row(self, ref: str) -> dict[str, Any]:
        """The journal row of a dataset (id or name)."""
        row: dict[str, Any] = self.state.dataset(ref)
        return row

    def source(self, ref: str) -> Source:
        """The opened source of a dataset (reopened when its folder or file changed)."""
        from datamill.sources import open_source

        path = Path(self.row(ref)["path"])
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            stamp = -1
        with self._lock:
            hit = self._open.get(str(path))
            if hit is not None and hit[0] == stamp:
                return hit[1]
        src = open_source(path)
        with self._lock:
            self._open[str(path)] = (stamp, src)
        return src

    def summary(self, ref: str) -> dict[str, Any]:
        """``id, name, path, kind, num_samples, num_shards, bytes, shardsets, columns`` (``error`` if unreadable)."""
        row = self.row(ref)
        real = Path(row["path"])
        rel = next((str(real.relative_to(r)) for r in self.state.roots if real == r or r in real.parents), real.name)
        out: dict[str, Any] = {"id": row["id"], "name": row["name"], "path": rel}
        try:
            src = self.source(ref)
        except DatamillError as exc:
            return {**out, "kind": "unreadable", "error": exc.one_line()}
        sizes = np.asarray(src.shard_sizes(), dtype=np.int64)
        out.update(kind=_KINDS.get(type(src).__name__, type(src).__name__), num_samples=int(sizes.sum()),
                   num_shards=int(src.num_shards), columns=list(src.columns), bytes=_size(Path(row["path"])),
                   shardsets=list(getattr(src, "shardsets", [])))
        return out

    def detail(self, ref: str) -> dict[str, Any]:
        """:meth:`summary` plus ``describe`` (shardsets), ``footer`` statistics, ``meta``, ``check``."""
        out = self.summary(ref)
        if "error" in out:
            return out
        src = self.source(ref)
        from datamill.shards.dataset import ShardsetDataset

        try:
            out["footer"] = footer_stats(src)
        except (DatamillError, OSError, pa.ArrowException) as exc:
            out["footer_error"] = exc.one_line() if isinstance(exc, DatamillError) else f"{type(exc).__name__}: {exc}"
        if isinstance(src, ShardsetDataset):
            out["describe"] = src.describe()
            out["check"] = self.check(ref, src)
        else:
            out["schema"] = [{"name": f.name, "type": str(f.type)} for f in _schema(src)]
        meta = self.meta(ref)
        if meta is not None:
            out["meta"] = meta
        return out

    def check(self, ref: str, src: Any) -> list[dict[str, Any]]:
        """``check_report`` of a shardset dataset, cached by its fingerprint."""
        from datamill.shards.check import check_report

        key = f"{self.row(ref)['path']}@{src.fingerprint()}"
        if key not in self._checks:
            self._checks[key] = check_report(src.loc)
        return self._checks[key]

    def meta(self, ref: str) -> dict[str, Any] | None:
        """The ``meta.json`` of a preprocessed HDF5 dataset (``None`` for other kinds)."""
        from datamill.preprocessing.meta import read_meta

        path = Path(self.row(ref)["path"])
        if path.suffix != HDF5_SUFFIX:
            return None
        meta_path = path.with_name(path.name.removesuffix(HDF5_SUFFIX) + META_SUFFIX)
        if not meta_path.is_file():
            return None
        return read_meta(meta_path)

    def vocabs(self, ref: str, src: Source) -> dict[str, Any]:
        """Column -> :class:`~datamill.vocab.Vocab` for columns holding token or category ids."""
        out: dict[str, Any] = {}
        meta = self.meta(ref)
        if meta is not None:
            from datamill.preprocessing.meta import Metadata

            m = Metadata(meta)
            for c in src.columns:
                try:
                    out[c] = m.vocab(c)
                except (KeyError, ConfigError):
                    pass
        corpus = getattr(src, "corpus", None)
        if corpus is not None and getattr(corpus, "vocab", None) is not None:
            out.update(x=corpus.vocab, y=corpus.vocab)
        return out

    def samples(self, ref: str, *, offset: int = 0, limit: int = 20,
                columns: list[str] | None = None) -> dict[str, Any]:
        """Rows ``[offset, offset + limit)`` of the joined dataset as typed cells.

        Each cell is ``{"t": "missing"}``, ``{"t": "image", "src", "mime"}``, ``{"t": "tokens", "text",
        "ids"}`` or ``{"t": "value", "v"}``.
        """
        src = self.source(ref)
        if not 1 <= limit <= MAX_LIMIT or offset < 0:
            raise ConfigError(f"need 0 <= offset and 1 <= limit <= {MAX_LIMIT}, got {offset}, {limit}")
        cols = list(src.columns) if not columns else columns
        unknown = [c for c in cols if c not in src.columns]
        if unknown:
            raise SchemaError(f"unknown column(s) {unknown}; columns: {list(src.columns)}", column=unknown[0])
        sizes = np.asarray(src.shard_sizes(), dtype=np.int64)
        total = int(sizes.sum())
        starts = np.concatenate([[0], np.cumsum(sizes)])
        stop = min(total, offset + limit)
        parts: list[pa.Table] = []
        k = int(np.searchsorted(starts, offset, side="right") - 1) if offset < total else len(sizes)
        while k < len(sizes) and starts[k] < stop:
            t = src.read_shard(k, columns=cols)
            lo, hi = max(offset, int(starts[k])) - int(starts[k]), min(stop, int(starts[k + 1])) - int(starts[k])
            parts.append(t.slice(lo, hi - lo).replace_schema_metadata(None))
            k += 1
        table = pa.concat_tables(parts) if parts else pa.table({c: pa.array([], pa.null()) for c in cols})
        vocabs = self.vocabs(ref, src)
        ds_id, path = self.row(ref)["id"], Path(self.row(ref)["path"])
        base = path if path.is_dir() else path.parent
        rows = []
        for i in range(table.num_rows):
            cells = [_cell(table.column(c)[i].as_py(), c, offset + i, ds_id, vocabs.get(c), base=base,
                           roots=self.state.roots) for c in cols]
            rows.append({"row": offset + i, "cells": cells})
        return {"offset": offset, "limit": limit, "total": total, "columns": cols, "all_columns": list(src.columns),
                "rows": rows}

    def cell_file(self, ref: str, *, row: int, column: str) -> tuple[bytes, str]:
        """``(bytes, mime)`` of the image a cell names by path, resolved inside the server's roots."""
        src = self.source(ref)
        if column not in src.columns:
            raise SchemaError(f"unknown column {column!r}; columns: {list(src.columns)}", column=column)
        if not 0 <= row < int(np.asarray(src.shard_sizes()).sum()):
            raise NotFoundError(f"no row {row}")
        value = _raw_value(src, row, column)
        if not isinstance(value, str):
            raise NotFoundError(f"row {row} column {column!r} holds no file path")
        base = Path(self.row(ref)["path"])
        base = base if base.is_dir() else base.parent
        target = Path(os.path.realpath(base / value))
        if not any(target == r or r in target.parents for r in self.state.roots):
            raise ConfigError(f"row {row} column {column!r} points outside the server's roots", column=column)
        mime = _IMAGE_EXT.get(target.suffix.lower())
        if mime is None or not target.is_file():
            raise NotFoundError(f"row {row} column {column!r}: no image file there", path=str(value))
        return target.read_bytes(), mime


def _raw_value(src: Source, row: int, column: str) -> Any:
    sizes = np.asarray(src.shard_sizes(), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    k = int(np.searchsorted(starts, row, side="right") - 1)
    return src.read_shard(k, columns=[column]).column(column)[row - int(starts[k])].as_py()


def _cell(value: Any, column: str, row: int, ds_id: str, vocab: Any, *, base: Path | None,
          roots: list[Path]) -> dict[str, Any]:
    if value is None:
        return {"t": "missing"}
    if isinstance(value, bytes):
        mime = sniff_image(value)
        if mime is not None and len(value) <= MAX_INLINE:
            return {"t": "image", "mime": mime, "src": f"data:{mime};base64,{base64.b64encode(value).decode()}"}
        return {"t": "value", "v": f"<{len(value):,} bytes>"}
    if isinstance(value, str) and Path(value).suffix.lower() in _IMAGE_EXT:
        if base is None:
            return {"t": "value", "v": value}
        target = Path(os.path.realpath(base / value))
        if not any(target == r or r in target.parents for r in roots) or not target.is_file():
            return {"t": "value", "v": value, "error": f"no image file at {value!r} under the server's roots"}
        return {"t": "image", "mime": _IMAGE_EXT[Path(value).suffix.lower()], "path": value,
                "src": f"/ui/datasets/{ds_id}/file?row={row}&column={urllib.parse.quote(column)}"}
    if vocab is not None and (isinstance(value, int) or (isinstance(value, list) and all(isinstance(v, int)
                                                                                         for v in value))):
        ids = value if isinstance(value, list) else [value]
        tokens = [str(t) for t in vocab.decode(np.asarray(ids, dtype=np.int64)).tolist()]
        pad = "<PAD>"
        return {"t": "tokens", "text": " ".join(t for t in tokens if t != pad), "ids": _short(ids)}
    return {"t": "value", "v": _short(value)}


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _schema(src: Source) -> list[pa.Field]:
    if src.num_shards == 0:
        return []
    return list(src.read_shard(0, columns=list(src.columns)).slice(0, 0).schema)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def inspector(request: Request) -> Inspector:
    """The app's :class:`Inspector` (a dependency)."""
    insp: Inspector = request.app.state.inspector
    return insp


router = APIRouter(prefix="/api/v1/datasets")
Insp = Annotated[Inspector, Depends(inspector)]


@router.get("/{ref}/describe")
def describe_route(who: Reader, ref: str, insp: Insp) -> dict[str, Any]:
    """A dataset's :meth:`Inspector.detail`."""
    check_dataset(who, insp.state, ref)
    return insp.detail(ref)


@router.get("/{ref}/columns/{column}/values")
def values_route(who: Reader, ref: str, column: str, insp: Insp) -> dict[str, Any]:
    """Top values and histogram of a column (``status`` ``running`` until computed)."""
    check_dataset(who, insp.state, ref)
    src = insp.source(ref)
    if column not in src.columns:
        raise SchemaError(f"unknown column {column!r}; columns: {list(src.columns)}", column=column)
    return insp.values.get(src.fingerprint(), column, lambda: src).view()


@router.get("/{ref}/samples")
def samples_route(who: Reader, ref: str, insp: Insp, offset: Annotated[int, Query(ge=0, le=1 << 40)] = 0,
                  limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 20,
                  columns: Annotated[str | None, Query(max_length=10_000)] = None) -> dict[str, Any]:
    """A page of samples (``columns`` comma-separated)."""
    check_dataset(who, insp.state, ref)
    return insp.samples(ref, offset=offset, limit=limit, columns=columns.split(",") if columns else None)
