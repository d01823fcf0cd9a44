"""A dataset's rows as a person reads them: the web UI's samples page and
``datamill describe SOURCE --rows``.

* :func:`sample_page`: rows ``[offset, offset + limit)`` (or of the rows where a column shows as a
  value, :func:`matching_rows`) as typed cells: token ids decoded with the dataset's vocabulary
  (:func:`column_vocabs`), floats rounded for reading, long lists cut, image bytes as images;
* :func:`row_of`: the row of a sample named by its UID (a shardset dataset) or its row number.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.errors import ConfigError, DatamillError, NotFoundError, SchemaError
from datamill.core.source import Source, take_rows, uid_from_text
from datamill.loader.describe import number_text, preprocessed_meta

__all__ = [
    "IMAGE_EXT",
    "IMAGE_TYPES",
    "MAX_FILTER",
    "MAX_LIMIT",
    "MAX_SCAN",
    "column_vocabs",
    "matching_rows",
    "row_of",
    "sample_page",
    "sniff_image",
]

MAX_LIMIT = 200
"""Most rows one page holds."""
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
"""The magic bytes of the image formats shown inline, and their MIME types."""
IMAGE_EXT = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
}
"""The file name endings of the image files a path cell may name, and their MIME types."""
ImageCell = Callable[[str, int, str], dict[str, Any]]
"""``(path, row, column) -> cell`` of a cell naming an image file (the web UI serves the file)."""


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


def column_vocabs(source: Source, *, path: str | Path) -> dict[str, Any]:
    """Column -> :class:`~datamill.vocab.Vocab` (or a BERT file's tokenizer) for the columns of
    ``source`` (read from ``path``) that hold token or category ids."""
    out: dict[str, Any] = {}
    meta = preprocessed_meta(path)
    if meta is not None:
        from datamill.preprocessing.meta import Metadata

        m = Metadata(meta)
        for c in source.columns:
            try:
                out[c] = m.vocab(c)
            except (KeyError, ConfigError):
                pass
    corpus = getattr(source, "corpus", None)
    if corpus is not None and getattr(corpus, "vocab", None) is not None:
        out.update(x=corpus.vocab, y=corpus.vocab)
    from datamill.pretrain.bert import BertParquetSource, load_tokenizer

    if isinstance(source, BertParquetSource):  # its token ids: the tokenizer the file stores
        try:
            tok = load_tokenizer(path)
        except (DatamillError, ImportError):  # none stored, or no `tokenizers`: ids shown
            return out
        out.update({c: tok for c in ("tokens", "masked_labels") if c in source.columns})
    return out


def sample_page(
    source: Source,
    *,
    path: str | Path,
    offset: int = 0,
    limit: int = 20,
    columns: Sequence[str] | None = None,
    where: tuple[str, str] | None = None,
    image: ImageCell | None = None,
) -> dict[str, Any]:
    """Rows ``[offset, offset + limit)`` of ``source`` (read from ``path``), or of the rows where
    column ``where[0]`` shows as ``where[1]``, as typed cells.

    Each cell is ``{"t": "missing"}``, ``{"t": "image", "src", "mime"}`` (image bytes),
    ``{"t": "tokens", "text", "ids"}``, ``{"t": "list", "head", "all", "n"}`` or ``{"t": "value",
    "v"}`` (with ``"full"``, the whole value, when ``"v"`` rounds or cuts it). A text naming an
    image file is ``image(text, row, column)``'s cell (a value when ``image`` is ``None``). A filter
    scans at most :data:`MAX_SCAN` rows (``complete`` says whether it saw them all).

    Raises:
        ConfigError: ``offset`` < 0 or ``limit`` outside ``1..MAX_LIMIT``.
        SchemaError: an unknown column, or a filter on a column that has no text form.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> src = TableSource(pa.table({"x": [0.123456, None], "y": [[1, 2], [3]]}), shard_size=2)
        >>> page = sample_page(src, path=".", limit=2)
        >>> [[c.get("v", c["t"]) for c in r["cells"]] for r in page["rows"]]
        [['0.1235', '[1, 2]'], ['missing', '[3]']]
    """
    if not 1 <= limit <= MAX_LIMIT or offset < 0:
        raise ConfigError(f"need 0 <= offset and 1 <= limit <= {MAX_LIMIT}, got {offset}, {limit}")
    cols = list(source.columns) if not columns else list(columns)
    unknown = [c for c in cols + ([where[0]] if where else []) if c not in source.columns]
    if unknown:
        raise SchemaError(
            f"unknown column(s) {unknown}; columns: {list(source.columns)}", column=unknown[0]
        )
    complete = True
    if where is None:
        total = int(np.asarray(source.shard_sizes(), dtype=np.int64).sum())
        wanted = np.arange(offset, min(total, offset + limit), dtype=np.int64)
    else:
        matches, complete = matching_rows(source, where[0], where[1])
        total = len(matches)
        wanted = matches[offset : offset + limit]
    table = take_rows(source, wanted, cols)
    vocabs = column_vocabs(source, path=path)
    uid_col = getattr(source, "uid_column", None)
    rows = []
    for i in range(table.num_rows):
        row = int(wanted[i])
        cells = [
            _cell(
                table.column(c)[i].as_py(),
                vocabs.get(c),
                at=(row, c),
                image=image,
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
        "all_columns": list(source.columns),
        "rows": rows,
        "complete": complete,
        "uid_column": uid_col,
    }


def row_of(source: Source, text: str, *, name: str = "the dataset") -> int:
    """The row of a sample named by ``text``: its UID (a shardset dataset) or its row number.

    Raises:
        NotFoundError: no sample of ``name`` has that UID or row.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> row_of(TableSource(pa.table({"x": [1, 2, 3]}), shard_size=2), " 2")
        2
    """
    total = int(np.asarray(source.shard_sizes(), dtype=np.int64).sum())
    uids = getattr(source, "uids", None)
    text = text.strip()[:MAX_FILTER]
    key = uid_from_text(text, None if uids is None else uids.type)
    if uids is not None:
        try:
            found = -1 if key is None else pc.index(uids, pa.scalar(key, uids.type)).as_py()
        except (OverflowError, pa.ArrowException):  # no UID of that type
            found = -1
        if found < 0:
            raise NotFoundError(f"no sample with UID {text!r} in {name}")
        return int(found)
    if key is None:
        raise NotFoundError(f"{text!r} is not a row number (0 to {total - 1:,})")
    row = int(key)
    if not 0 <= row < total:
        raise NotFoundError(f"no row {row:,}: rows are 0 to {total - 1:,}")
    return row


def _value_type(t: pa.DataType) -> pa.DataType:
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return t


def matching_rows(source: Source, column: str, value: str) -> tuple[NDArray[np.int64], bool]:
    """Rows whose ``column`` shows as ``value`` (compared as text), scanning at most
    :data:`MAX_SCAN` rows: ``(rows, whether every row was scanned)``.

    Raises:
        SchemaError: the column has no text form (it cannot be compared as text).
    """
    found: list[NDArray[np.int64]] = []
    start = 0
    for k, n in enumerate(np.asarray(source.shard_sizes(), dtype=np.int64).tolist()):
        if start >= MAX_SCAN:
            return np.concatenate(found) if found else np.zeros(0, np.int64), False
        col = source.read_shard(k, columns=[column]).column(column)
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


def _cell(
    value: Any, vocab: Any, *, at: tuple[int, str], image: ImageCell | None, float32: bool
) -> dict[str, Any]:
    """One value (of row and column ``at``) as a typed cell (see :func:`sample_page`)."""
    if value is None:
        return {"t": "missing"}
    if isinstance(value, bytes):
        return _bytes_cell(value)
    if isinstance(value, str) and image is not None and Path(value).suffix.lower() in IMAGE_EXT:
        return image(value, *at)
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
    """A float rounded for reading; the full value is in the cell's ``full``.

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
