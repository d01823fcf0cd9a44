"""Read-only views of registered datasets for the web UI: kind, statistics, checks
(:mod:`datamill.loader.describe`, which ``datamill describe`` prints too), samples.

:class:`Inspector` opens and caches the server's datasets; :data:`router` exposes it as JSON under
``/api/v1`` (``read`` keys, sent as a Bearer header or the UI's cookie):

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fastapi import APIRouter, Depends, Query, Request
from numpy.typing import NDArray

from datamill.core.errors import ConfigError, DatamillError, SchemaError
from datamill.core.source import Source, take_rows, uid_from_text
from datamill.loader import describe
from datamill.loader.describe import column_values, number_text
from datamill.serve.http.access import Reader, check_dataset
from datamill.serve.server import NotFoundError
from datamill.shards.check import check_report
from datamill.shards.dataset import ShardsetDataset

__all__ = [
    "IMAGE_TYPES",
    "MAX_FILTER",
    "MAX_LIMIT",
    "MAX_SCAN",
    "Inspector",
    "LimitQuery",
    "OffsetQuery",
    "ValueJob",
    "ValueStats",
    "inspector",
    "router",
]

MAX_LIMIT = 200
MAX_FILTER = 200
"""Longest filter or lookup value accepted."""
MAX_SCAN = 2_000_000
"""Rows a column-value filter scans at most."""
LIST_SHOWN, LIST_ALL = 8, 4096
MAX_INLINE = 256 * 1024
IMAGE_TYPES = {
    b"\x89PNG\r\n\x1a\n": "image/png",
    b"\xff\xd8\xff": "image/jpeg",
    b"GIF87a": "image/gif",
    b"GIF89a": "image/gif",
    b"RIFF": "image/webp",
}
_IMAGE_EXT = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
}


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


@dataclass
class ValueJob:
    """One column's computation: ``done`` of ``total`` shards read, then ``result`` or ``error``."""

    total: int
    done: int = 0
    result: dict[str, Any] | None = None
    error: str | None = None

    def view(self) -> dict[str, Any]:
        """``{"status": "running"|"done"|"error", "done", "total", ...}`` as JSON."""
        status = "error" if self.error else "done" if self.result is not None else "running"
        return {"status": status} | {
            k: getattr(self, k) for k in ("done", "total", "error", "result")
        }


class ValueStats:
    """Compute :func:`~datamill.loader.describe.column_values` on a background thread (so the page
    can show progress) and cache it per ``(dataset fingerprint, column)``.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> vs = ValueStats()
        >>> job = vs.get("fp", "x", lambda: TableSource(pa.table({"x": [1, 1, 2]}), shard_size=2))
        >>> vs.wait("fp", "x", timeout=10).result["top"][0]
        {'value': 1, 'count': 2}
    """

    def __init__(self) -> None:
        self._jobs: dict[tuple[str, str], ValueJob] = {}
        self._events: dict[tuple[str, str], threading.Event] = {}
        self._lock = threading.Lock()

    def get(self, fingerprint: str, column: str, open_source: Callable[[], Source]) -> ValueJob:
        """The job of ``column`` (started now on a background thread if new)."""
        key = (fingerprint, column)
        with self._lock:
            job = self._jobs.get(key)
            if job is not None:
                return job
            source = open_source()
            job = self._jobs[key] = ValueJob(total=int(source.num_shards))
            event = self._events[key] = threading.Event()
        threading.Thread(
            target=self._run,
            args=(job, source, column, event),
            daemon=True,
            name=f"datamill-ui-stats-{column}",
        ).start()
        return job

    def wait(self, fingerprint: str, column: str, *, timeout: float) -> ValueJob:
        """The job after it finished (or after ``timeout`` seconds)."""
        self._events[(fingerprint, column)].wait(timeout)
        return self._jobs[(fingerprint, column)]

    @staticmethod
    def _run(job: ValueJob, source: Source, column: str, event: threading.Event) -> None:
        try:
            job.result = column_values(source, column, on_shard=lambda k: setattr(job, "done", k))
        except DatamillError as exc:
            job.error = exc.one_line()
        except (pa.ArrowException, ValueError, OSError) as exc:
            job.error = f"{type(exc).__name__}: {exc}"
        finally:
            event.set()


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
        >>> ds = ShardsetDataset.create(
        ...     root / "d",
        ...     pa.table({"uid": [1, 2], "x": [3, 4]}),
        ...     uid="uid",
        ...     shardset="a",
        ...     shard_size=2,
        ... )
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
        self.stats = ValueStats()
        self._lock = threading.Lock()
        self._open: dict[str, tuple[int, Source]] = {}
        self._checks: dict[str, list[dict[str, Any]]] = {}

    def source(self, ref: str, *, column: str | None = None) -> Source:
        """The opened source of a dataset (reopened when its folder or file changed), which must
        have ``column`` when one is named (:class:`SchemaError`)."""
        from datamill.sources import open_source

        path = Path(self.state.dataset(ref)["path"])
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            stamp = -1
        with self._lock:
            hit = self._open.get(str(path))
        src = hit[1] if hit is not None and hit[0] == stamp else open_source(path)
        with self._lock:
            self._open[str(path)] = (stamp, src)
        if column is not None and column not in src.columns:
            raise SchemaError(
                f"unknown column {column!r}; columns: {list(src.columns)}", column=column
            )
        return src

    def summary(self, ref: str) -> dict[str, Any]:
        """``id, name, path`` and :func:`~datamill.loader.describe.summary` (``kind: unreadable``
        and ``error`` if unreadable)."""
        row = self.state.dataset(ref)
        out = {"id": row["id"], "name": row["name"], "path": self.state.relative(row["path"])}
        try:
            return out | describe.summary(self.source(ref), path=row["path"])
        except DatamillError as exc:
            return {**out, "kind": "unreadable", "error": exc.one_line()}

    def detail(self, ref: str) -> dict[str, Any]:
        """:meth:`summary` plus :func:`~datamill.loader.describe.details` (a shardset dataset's
        ``check`` cached by its fingerprint)."""
        out = self.summary(ref)
        if "error" in out:
            return out
        src, path = self.source(ref), self.state.dataset(ref)["path"]
        out |= describe.details(src, path=path, check=False)
        if isinstance(src, ShardsetDataset):
            key = f"{path}@{src.fingerprint()}"
            if key not in self._checks:
                self._checks[key] = check_report(src.loc)
            out["check"] = self._checks[key]
        return out

    def vocabs(self, ref: str, src: Source) -> dict[str, Any]:
        """Column -> :class:`~datamill.vocab.Vocab` (or a BERT file's tokenizer) for columns holding
        token or category ids."""
        out: dict[str, Any] = {}
        meta = describe.preprocessed_meta(self.state.dataset(ref)["path"])
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
        from datamill.pretrain.bert import BertParquetSource, load_tokenizer

        if isinstance(src, BertParquetSource):  # its token ids: the tokenizer the file stores
            try:
                tok = load_tokenizer(self.state.dataset(ref)["path"])
            except (DatamillError, ImportError):  # none stored, or no `tokenizers`: ids shown
                return out
            out.update({c: tok for c in ("tokens", "masked_labels") if c in src.columns})
        return out

    def samples(
        self,
        ref: str,
        *,
        offset: int = 0,
        limit: int = 20,
        columns: list[str] | None = None,
        where: tuple[str, str] | None = None,
    ) -> dict[str, Any]:
        """Rows ``[offset, offset + limit)`` of the joined dataset (or of the rows where column
        ``where[0]`` shows as ``where[1]``) as typed cells.

        Each cell is ``{"t": "missing"}``, ``{"t": "image", "src", "mime"}``, ``{"t": "tokens",
        "text", "ids"}``, ``{"t": "list", "head", "all", "n"}`` or ``{"t": "value", "v"}``. A filter
        scans at most :data:`MAX_SCAN` rows (``complete`` says whether it saw them all).
        """
        src = self.source(ref)
        if not 1 <= limit <= MAX_LIMIT or offset < 0:
            raise ConfigError(
                f"need 0 <= offset and 1 <= limit <= {MAX_LIMIT}, got {offset}, {limit}"
            )
        cols = list(src.columns) if not columns else columns
        unknown = [c for c in cols + ([where[0]] if where else []) if c not in src.columns]
        if unknown:
            raise SchemaError(
                f"unknown column(s) {unknown}; columns: {list(src.columns)}", column=unknown[0]
            )
        sizes = np.asarray(src.shard_sizes(), dtype=np.int64)
        complete = True
        if where is None:
            total = int(sizes.sum())
            wanted = np.arange(offset, min(total, offset + limit), dtype=np.int64)
        else:
            matches, complete = _matching_rows(src, where[0], where[1], sizes)
            total = len(matches)
            wanted = matches[offset : offset + limit]
        table = take_rows(src, wanted, cols)
        vocabs = self.vocabs(ref, src)
        ds_id = self.state.dataset(ref)["id"]
        uid_col = getattr(src, "uid_column", None)
        rows = []
        for i in range(table.num_rows):
            row = int(wanted[i])
            cells = [
                _cell(
                    table.column(c)[i].as_py(),
                    c,
                    row,
                    ds_id,
                    vocabs.get(c),
                    inside=lambda value: self._inside(ref, value),
                    float32=pa.types.is_float32(_value_type(table.column(c).type)),
                )
                for c in cols
            ]
            uid = table.column(uid_col)[i].as_py() if uid_col in cols else None
            rows.append({"row": row, "uid": uid, "cells": cells})
        return {
            "offset": offset,
            "limit": limit,
            "total": total,
            "columns": cols,
            "all_columns": list(src.columns),
            "rows": rows,
            "complete": complete,
            "uid_column": uid_col,
        }

    def locate(self, ref: str, value: str) -> int:
        """The row of a sample: its UID (shardset datasets) or its row number.

        Raises:
            NotFoundError: no sample has that UID or row.
        """
        src = self.source(ref)
        total = int(np.asarray(src.shard_sizes(), dtype=np.int64).sum())
        uids = getattr(src, "uids", None)
        value = value.strip()[:MAX_FILTER]
        key = uid_from_text(value, None if uids is None else uids.type)
        if uids is not None:
            try:
                found = -1 if key is None else pc.index(uids, pa.scalar(key, uids.type)).as_py()
            except (OverflowError, pa.ArrowException):  # no UID of that type
                found = -1
            if found < 0:
                raise NotFoundError(
                    f"no sample with UID {value!r} in {self.state.dataset(ref)['name']}"
                )
            return int(found)
        if key is None:
            raise NotFoundError(f"{value!r} is not a row number (0 to {total - 1:,})")
        row = int(key)
        if not 0 <= row < total:
            raise NotFoundError(f"no row {row:,}: rows are 0 to {total - 1:,}")
        return row

    def values(self, ref: str, column: str) -> dict[str, Any]:
        """Top values and histogram of a column (:meth:`ValueStats.get`'s job as JSON: ``status``
        ``running`` until computed)."""
        src = self.source(ref, column=column)
        return self.stats.get(src.fingerprint(), column, lambda: src).view()

    def cell_file(self, ref: str, *, row: int, column: str) -> tuple[bytes, str]:
        """``(bytes, mime)`` of the image a cell names by path, resolved inside the server's
        roots."""
        src = self.source(ref, column=column)
        if not 0 <= row < int(np.asarray(src.shard_sizes()).sum()):
            raise NotFoundError(f"no row {row}")
        value = take_rows(src, [row], [column]).column(column)[0].as_py()
        if not isinstance(value, str):
            raise NotFoundError(f"row {row} column {column!r} holds no file path")
        target = self._inside(ref, value)
        if target is None:
            raise ConfigError(
                f"row {row} column {column!r} points outside the server's roots", column=column
            )
        mime = _IMAGE_EXT.get(target.suffix.lower())
        if mime is None or not target.is_file():
            raise NotFoundError(
                f"row {row} column {column!r}: no image file there", path=str(value)
            )
        return target.read_bytes(), mime

    def _inside(self, ref: str, value: str) -> Path | None:
        """The file a cell's path names (from the dataset's folder) if it lies under a root."""
        base = Path(self.state.dataset(ref)["path"])
        target = Path(os.path.realpath((base if base.is_dir() else base.parent) / value))
        return target if any(r == target or r in target.parents for r in self.state.roots) else None


def _value_type(t: pa.DataType) -> pa.DataType:
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return t


def _matching_rows(
    src: Source, column: str, value: str, sizes: NDArray[np.int64]
) -> tuple[NDArray[np.int64], bool]:
    """Rows whose ``column`` shows as ``value`` (compared as text), scanning at most
    :data:`MAX_SCAN` rows."""
    found: list[NDArray[np.int64]] = []
    start = 0
    for k, n in enumerate(sizes.tolist()):
        if start >= MAX_SCAN:
            return np.concatenate(found) if found else np.zeros(0, np.int64), False
        col = src.read_shard(k, columns=[column]).column(column)
        try:
            text = pc.cast(col, pa.string())
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            raise SchemaError(
                f"column {column!r} ({col.type}) cannot be filtered by value", column=column
            ) from None
        hits = np.flatnonzero(
            pc.fill_null(pc.equal(text, value), False).to_numpy(zero_copy_only=False)
        )
        found.append(hits.astype(np.int64) + start)
        start += int(n)
    return np.concatenate(found) if found else np.zeros(0, np.int64), True


# long (61 lines): one branch per kind of cell (image bytes, image path, tokens, float, list)
def _cell(
    value: Any,
    column: str,
    row: int,
    ds_id: str,
    vocab: Any,
    *,
    inside: Callable[[str], Path | None],
    float32: bool = False,
) -> dict[str, Any]:
    if value is None:
        return {"t": "missing"}
    if isinstance(value, bytes):
        return _bytes_cell(value)
    if isinstance(value, str) and Path(value).suffix.lower() in _IMAGE_EXT:
        return _image_path_cell(value, column, row, ds_id, target=inside(value))
    if vocab is not None and (
        isinstance(value, int)
        or (isinstance(value, list) and all(isinstance(v, int) for v in value))
    ):
        return _tokens_cell(value, vocab)
    if isinstance(value, float):
        return {"t": "value", "v": _float(value, float32=float32), "full": repr(value)}
    if isinstance(value, list):
        return _list_cell(value, float32=float32)
    return {"t": "value", "v": _short(value)}


def _bytes_cell(value: bytes) -> dict[str, Any]:
    """An image's bytes inline (small enough), else the byte count."""
    mime = sniff_image(value)
    if mime is not None and len(value) <= MAX_INLINE:
        return {
            "t": "image",
            "mime": mime,
            "src": f"data:{mime};base64,{base64.b64encode(value).decode()}",
        }
    return {"t": "value", "v": f"<{len(value):,} bytes>"}


def _image_path_cell(
    value: str, column: str, row: int, ds_id: str, *, target: Path | None
) -> dict[str, Any]:
    """An image file's path: the image (served by the file route) when it lies under a root."""
    if target is None or not target.is_file():
        # a path column whose files are elsewhere (the demo's cifar): its text, not an error
        note = f"{value} (no image file there under the server's roots)"
        return {"t": "value", "v": value, "full": note}
    return {
        "t": "image",
        "mime": _IMAGE_EXT[Path(value).suffix.lower()],
        "path": value,
        "src": f"/ui/datasets/{ds_id}/file?row={row}&column={urllib.parse.quote(column)}",
    }


def _tokens_cell(value: int | list[int], vocab: Any) -> dict[str, Any]:
    """Token ids decoded with the dataset's vocabulary (padding left out), and the ids."""
    ids = value if isinstance(value, list) else [value]
    if hasattr(vocab, "id_to_token"):  # a BERT file's tokenizers.Tokenizer
        tokens = [t if (t := vocab.id_to_token(i)) is not None else f"<id {i}>" for i in ids]
    else:
        tokens = [str(t) for t in vocab.decode(np.asarray(ids, dtype=np.int64)).tolist()]
    text = " ".join(t for t in tokens if t not in ("<PAD>", "[PAD]"))
    return {"t": "tokens", "text": text, "ids": _short(ids)}


def _list_cell(value: list[Any], *, float32: bool) -> dict[str, Any]:
    """A list: whole when short, else its head, its length and its first :data:`LIST_ALL` items."""
    shown = [
        _float(v, float32=float32)
        if isinstance(v, float)
        else repr(v)
        if v is not None
        else "missing"
        for v in value[:LIST_SHOWN]
    ]
    if len(value) <= LIST_SHOWN:
        return {"t": "value", "v": "[" + ", ".join(shown) + "]"}
    every = [
        number_text(v, float32=float32) if isinstance(v, float) else repr(v)
        for v in value[:LIST_ALL]
    ]
    return {
        "t": "list",
        "head": "[" + ", ".join(shown) + ", …]",
        "n": len(value),
        "all": "[" + ", ".join(every) + (", …" if len(value) > LIST_ALL else "") + "]",
    }


def _float(v: float, *, float32: bool) -> str:
    """A float rounded for reading; the full value is in the cell's tooltip.

    Examples:
        >>> (
        ...     _float(208500.0, float32=False),
        ...     _float(1872.0, float32=False),
        ...     _float(0.123456789, float32=True),
        ...     _float(1.5e-7, float32=False),
        ... )
        ('208,500', '1872', '0.1235', '1.500e-07')
    """
    if not np.isfinite(v):
        return str(v)
    x = float(np.float32(v)) if float32 else v
    if abs(x) >= 1000:
        sep = "," if abs(x) >= 10_000 else ""  # a year stays 1872
        return f"{x:{sep}.0f}" if x == round(x) else f"{x:{sep}.1f}"
    if x == 0 or abs(x) >= 1e-3:
        return f"{x:.4g}"
    return f"{x:.3e}"


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def inspector(request: Request) -> Inspector:
    """The app's :class:`Inspector` (a dependency)."""
    insp: Inspector = request.app.state.inspector
    return insp


router = APIRouter(prefix="/api/v1/datasets")
Insp = Annotated[Inspector, Depends(inspector)]
OffsetQuery = Annotated[int, Query(ge=0, le=1 << 40)]  # a page's first sample (UI and API)
LimitQuery = Annotated[int, Query(ge=1, le=MAX_LIMIT)]  # a page's samples (UI and API)


@router.get("/{ref}/describe")
def describe_route(who: Reader, ref: str, insp: Insp) -> dict[str, Any]:
    """A dataset's :meth:`Inspector.detail`."""
    check_dataset(who, insp.state, ref)
    return insp.detail(ref)


@router.get("/{ref}/columns/{column}/values")
def values_route(who: Reader, ref: str, column: str, insp: Insp) -> dict[str, Any]:
    """Top values and histogram of a column (``status`` ``running`` until computed)."""
    check_dataset(who, insp.state, ref)
    return insp.values(ref, column)


@router.get("/{ref}/samples")
def samples_route(
    who: Reader,
    ref: str,
    insp: Insp,
    offset: OffsetQuery = 0,
    limit: LimitQuery = 20,
    columns: Annotated[str | None, Query(max_length=10_000)] = None,
) -> dict[str, Any]:
    """A page of samples (``columns`` comma-separated)."""
    check_dataset(who, insp.state, ref)
    return insp.samples(
        ref, offset=offset, limit=limit, columns=columns.split(",") if columns else None
    )
