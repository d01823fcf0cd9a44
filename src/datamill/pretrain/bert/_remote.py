"""``build_bert_samples(..., out="s3://bucket/x.parquet")``: build locally, then upload.

The Parquet file and its tokenizer copy are written to a local scratch folder by the local builder
(atomic as ever), then uploaded: the tokenizer copy first, the Parquet file last (each PUT is
atomic, so a reader sees the previous file or the new one, never a part). House rules hold on S3:
an object at ``out`` is replaced only when it is datamill's BERT Parquet (its footer carries the
``datamill`` key), the tokenizer object only when that earlier file names it; anything else is
refused, with or without ``overwrite``.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from datamill.core.errors import DataFileError, DatamillError
from datamill.core.storage import filesystem_for, publish, scheme_of, storage_error

__all__ = ["build_to_s3"]

META_KEY = b"datamill"


def _earlier_bert(fs: pafs.FileSystem, key: str, url: str) -> dict[bytes, bytes] | None:
    """The footer metadata of datamill's BERT Parquet at ``key``; ``None`` when nothing is there."""
    info = fs.get_file_info(key)
    if info.type == pafs.FileType.NotFound:
        return None
    if info.type != pafs.FileType.File:
        raise DataFileError(
            "a prefix (folder) of objects is there, not a BERT Parquet file",
            path=url,
            hint="choose another --out (datamill never writes over objects of yours)",
        )
    try:
        with fs.open_input_file(key) as f:
            meta = pq.ParquetFile(f).metadata.metadata or {}
    except pa.ArrowException:
        meta = {}
    if META_KEY not in meta:
        raise DataFileError(
            "the object there is not a BERT Parquet file written by datamill; refusing to replace "
            "it",
            path=url,
            hint="choose another --out (datamill never writes over objects of yours)",
        )
    return dict(meta)


def build_to_s3(
    build: Callable[..., Any], source: Any, *, out: str, options: dict[str, Any]
) -> Any:
    """Run ``build(source, out=<local scratch file>, **options)`` and upload its two files to
    ``out``."""
    fs, key = filesystem_for(out)
    prefix = scheme_of(out).prefix
    if not key.endswith((".parquet", ".pq")) or "/" not in key:
        raise DataFileError(f"expected {prefix}bucket/path/name.parquet", path=out)
    tok_key = str(PurePosixPath(key).with_suffix(".tokenizer.json"))
    tok_url = f"{prefix}{tok_key}"
    try:
        earlier = _earlier_bert(fs, key, out)
        if fs.get_file_info(tok_key).type != pafs.FileType.NotFound:
            import json

            named = (
                json.loads(earlier.get(META_KEY, b"{}")).get("tokenizer_file") if earlier else None
            )
            if named != PurePosixPath(tok_key).name:
                raise DataFileError(
                    "an object that is not the tokenizer copy of an earlier BERT Parquet file is "
                    "there; refusing to replace it",
                    path=tok_url,
                    hint="choose another --out (datamill never writes over objects of yours)",
                )
        with tempfile.TemporaryDirectory(prefix="datamill-bert-upload-") as scratch:
            local = Path(scratch) / PurePosixPath(key).name
            result = build(source, out=local, **options)
            # the Parquet file is the commit marker, published last; the tokenizer copy is kept on
            # failure (it replaced the copy an earlier Parquet file there names)
            publish(
                fs, [(result.tokenizer_path, tok_key)], (result.path, key), url=out, keep=[tok_key]
            )
    except DatamillError:
        raise
    except OSError as exc:
        raise storage_error(exc, out) from exc
    return dataclasses.replace(result, path=Path(key), tokenizer_path=Path(tok_key), url=out)
