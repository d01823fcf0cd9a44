"""``ParquetSource``: a Parquet file, or a folder of them, as a
:class:`~datamill.core.source.Source`.

Shards are row groups (default) or whole files. BERT and word2vec samples and shardset shards are
Parquet; any table written with pyarrow reads through it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from datamill.core.checks import check_path
from datamill.core.errors import ConfigError, DataFileError, DataFileNotFoundError, SchemaError
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.source import SchemaColumns, check_read_args, register_source

__all__ = ["ParquetSource", "decode_pool", "open_parquet", "tail_hash"]

_TAIL = 1 << 16


_DECODE_POOL: list[pa.MemoryPool | None] = []


def decode_pool() -> pa.MemoryPool | None:
    """The memory pool shards are decoded into: jemalloc when this pyarrow has it, else ``None``
    (the default pool)."""
    if not _DECODE_POOL:
        try:
            _DECODE_POOL.append(pa.jemalloc_memory_pool())
        except (NotImplementedError, pa.ArrowNotImplementedError):
            _DECODE_POOL.append(None)
    return _DECODE_POOL[0]


def open_parquet(
    source: str | os.PathLike[str] | pa.NativeFile,
    *,
    metadata: pq.FileMetaData | None = None,
    memory_map: bool = False,
) -> pq.ParquetFile:
    """``pq.ParquetFile(source)`` whose reads decode into :func:`decode_pool`.

    A shard's decoded columns are the largest buffers an epoch allocates, one set per shard; the
    default pool (mimalloc) returned freed memory to the system within milliseconds in the earlier
    measurements, so each shard landed on fresh pages the kernel had to zero first (up to 40% of a
    binary epoch's CPU, and the spread between runs: ``benchmarks/RESULTS.md``; with pyarrow 26 it
    reuses them, but a new process's first epoch then varies with the 2 MiB pages it takes).
    jemalloc keeps part of the freed pages for the next shard, all of them when the process starts
    with ``JE_ARROW_MALLOC_CONF`` set as ``docs/loading.md`` says. Only these reads use it (the
    process's default pool is not changed). ``ParquetFile`` takes no memory pool and its reader
    does, so the reader is pyarrow's own class, opened as ``ParquetFile`` opens it; another pyarrow
    without it reads into the default pool.

    Examples:
        >>> import io
        >>> sink = io.BytesIO(); pq.write_table(pa.table({"x": [1, 2], "y": ["a", "b"]}), sink)
        >>> open_parquet(pa.BufferReader(sink.getvalue())).read(columns=["y"]).to_pydict()
        {'y': ['a', 'b']}
    """
    pf = pq.ParquetFile(source, metadata=metadata, memory_map=memory_map)
    pool = decode_pool()
    if pool is not None:
        try:
            from pyarrow._parquet import ParquetReader

            reader = ParquetReader(memory_pool=pool)
            reader.open(
                source,
                use_memory_map=memory_map,
                metadata=pf.metadata,
                arrow_extensions_enabled=True,  # as ParquetFile opens it
            )
            pf.reader = reader
        except (ImportError, TypeError, AttributeError):  # another pyarrow: the default pool
            pass
    return pf


def tail_hash(path: Path) -> str:
    """xxh3-128 of the last 64 KiB of ``path`` (with its size, a cheap content identity)."""
    import xxhash

    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - _TAIL))
        return xxhash.xxh3_128_hexdigest(f.read())


class ParquetSource(SchemaColumns):
    """A Parquet file, or every ``*.parquet`` file of a folder (sorted by name), as shards.

    Args:
        path: a ``.parquet`` file or a folder.
        shard_by: ``"row_group"`` (each row group a shard) or ``"file"``. Defaults to
            ``"row_group"``.

    Raises:
        DataFileNotFoundError: the path (or any Parquet file in the folder) does not exist.
        DataFileError: a file is not Parquet. SchemaError: files of a folder disagree on the schema.

    Examples:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "a.parquet"
        >>> pq.write_table(pa.table({"x": list(range(5))}), p, row_group_size=2)
        >>> src = ParquetSource(p)
        >>> src.num_shards, src.shard_sizes().tolist(), src.read_shard(1).to_pydict()
        (3, [2, 2, 1], {'x': [2, 3]})
    """

    def __init__(
        self, path: str | os.PathLike[str], *, shard_by: Literal["row_group", "file"] = "row_group"
    ) -> None:
        root = Path(check_path(path))
        if not root.exists():
            raise DataFileNotFoundError("no such Parquet file or folder", path=root)
        if shard_by not in ("row_group", "file"):
            raise ConfigError(f"shard_by must be 'row_group' or 'file', got {shard_by!r}")
        files = (
            sorted(p for p in root.rglob("*.parquet") if p.is_file()) if root.is_dir() else [root]
        )
        if not files:
            raise DataFileNotFoundError("folder holds no *.parquet file", path=root)
        self.path, self.files, self.shard_by = root, files, shard_by
        self._meta: list[pq.FileMetaData] = []
        schema: pa.Schema | None = None
        shards: list[tuple[int, int | None, int]] = []  # (file, row group or None, rows)
        for i, f in enumerate(files):
            try:
                md = pq.read_metadata(f)
            except (OSError, pa.ArrowException) as exc:
                raise DataFileError(f"not a readable Parquet file ({exc})", path=f) from exc
            s = md.schema.to_arrow_schema()
            if schema is None:
                schema = s
            elif not s.equals(schema, check_metadata=False):
                raise SchemaError(f"schema differs from {files[0].name}'s: {s} vs {schema}", path=f)
            self._meta.append(md)
            if shard_by == "file":
                shards.append((i, None, md.num_rows))
            else:
                shards += [(i, g, md.row_group(g).num_rows) for g in range(md.num_row_groups)]
        assert schema is not None
        self.schema = schema
        self._shards = shards

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    def shard_sizes(self) -> NDArray[np.int64]:
        return np.array([n for _, _, n in self._shards], dtype=np.int64)

    def shard_nbytes(self) -> NDArray[np.int64]:
        """Bytes of each shard's data in its file (its row groups' compressed column chunks, from
        the footers already read: no I/O).

        Examples:
            >>> import tempfile
            >>> p = Path(tempfile.mkdtemp()) / "a.parquet"
            >>> pq.write_table(pa.table({"x": list(range(500))}), p, row_group_size=200)
            >>> nbytes = ParquetSource(p).shard_nbytes()
            >>> len(nbytes), bool((nbytes > 0).all()), int(nbytes[0]) > int(nbytes[2])
            (3, True, True)
        """

        def group_bytes(md: pq.FileMetaData, g: int) -> int:
            rg = md.row_group(g)
            return sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))

        out = []
        for i, group, _ in self._shards:
            md = self._meta[i]
            groups = range(md.num_row_groups) if group is None else (group,)
            out.append(sum(group_bytes(md, g) for g in groups))
        return np.asarray(out, dtype=np.int64)

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        cols = check_read_args(self, index, columns, path=self.path)
        i, group, _ = self._shards[index]
        try:
            pf = open_parquet(self.files[i], metadata=self._meta[i], memory_map=True)
            table = (
                pf.read(columns=cols) if group is None else pf.read_row_group(group, columns=cols)
            )
        except (OSError, pa.ArrowException) as exc:
            raise DataFileError(
                f"cannot read {'row group ' + str(group) if group is not None else 'file'} ({exc})",
                path=self.files[i],
                shard=index,
            ) from exc
        return table.replace_schema_metadata(None)

    def fingerprint(self) -> str:
        return fingerprint_obj(
            [
                self.shard_by,
                self.schema.remove_metadata().to_string(),
                [[f.name, f.stat().st_size, tail_hash(f)] for f in self.files],
            ]
        )

    def __repr__(self) -> str:
        return (
            f"ParquetSource({os.fspath(self.path)!r}, shards={self.num_shards}, "
            f"rows={int(self.shard_sizes().sum())})"
        )


register_source(
    "parquet",
    marker=lambda p: p.suffix in (".parquet", ".pq") or (p.is_dir() and any(p.glob("*.parquet"))),
    opener=ParquetSource,
    priority=-10,
)
