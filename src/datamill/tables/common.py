"""What the table sources share: a table snapshot as a list of Parquet data files read as shards.

An Iceberg or Delta snapshot is an immutable list of Parquet files plus deletes: the same thing as a
datamill shardset manifest. :class:`ParquetFilesSource` reads such a list as a
:class:`~datamill.core.source.Source`:

* each data file is a shard, or each of its row groups: ``shard_by="auto"`` (the default) splits
  files over :data:`LARGE_FILE_BYTES` by row group, ``"file"`` and ``"row_group"`` do one or the
  other for every file;
* columns are matched to the snapshot's schema by Iceberg field id (when the format has them) or
  by name; a column added after a file was written reads as nulls (schema evolution by snapshot),
  a partition column as its constant value;
* deleted rows (a keep mask per file: Delta deletion vectors, Iceberg positional deletes) are
  dropped, and ``shard_sizes()`` counts the rows kept;
* on object storage (``s3://``) files are read through the checked local shard cache
  (:class:`~datamill.core.objstore.ShardFileCache`): table data files never change in place, so a
  cached copy stays valid for every snapshot that lists it.

The snapshot is resolved once, when the source opens; its identity is in the fingerprint
(``"delta@v3-<hash>"``), which the loader's resume state, the run record and a served iteration's
record keep: :func:`pinned_version` reads it back.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from numpy.typing import NDArray

from datamill.core.errors import (
    ConfigError,
    DataFileError,
    DataFileNotFoundError,
    DatamillError,
    ResumeStateError,
    SchemaError,
)
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.objstore import ShardFileCache, default_cache_dir
from datamill.core.parquet import open_parquet
from datamill.core.source import SchemaColumns, check_read_args
from datamill.core.storage import SCHEMES, filesystem_for, scheme_of, storage_error

__all__ = [
    "LARGE_FILE_BYTES",
    "TABLE_KINDS",
    "ParquetFilesSource",
    "TableFile",
    "TableURL",
    "lance_version_of",
    "parse_table_url",
    "pinned_table_url",
    "pinned_version",
    "s3_env_options",
]

TABLE_KINDS = ("delta", "iceberg", "lance")
"""The table formats, each a URL scheme: ``delta:///path``, ``delta+s3://bucket/path``..."""

FIELD_ID = b"PARQUET:field_id"
ShardBy = Literal["auto", "file", "row_group"]
LARGE_FILE_BYTES = 256 << 20
"""``shard_by="auto"``: a data file larger than this is cut into its row groups (one shard each)."""
_FINGERPRINT = re.compile(r"^(delta|iceberg|lance)@v?(-?\d+)-[0-9a-f]+$")
_FOOTER_THREADS = 16


@dataclass(frozen=True)
class TableURL:
    """A parsed table URL: its format, where the table is (a local path or a storage URL) and the
    pinned version (``None``: the latest)."""

    kind: str
    location: str
    version: int | None
    uid_column: str | None = None


def parse_table_url(url: str) -> TableURL:
    """``delta:///abs/path?version=3``, ``iceberg+s3://bucket/wh/db/t?snapshot_id=5``,
    ``lance://rel/path.lance`` -> :class:`TableURL`.

    After ``<format>://`` comes a local path; ``<format>+<scheme>://`` names a storage scheme
    (``s3``). ``?version=N`` (Delta, Lance) or ``?snapshot_id=N`` (Iceberg) pins a version;
    ``?uid=COLUMN`` names the column identifying a sample.

    Raises:
        ConfigError: not a table URL, an unknown storage scheme or a bad query.

    Examples:
        >>> parse_table_url("delta:///data/t?version=3")
        TableURL(kind='delta', location='/data/t', version=3, uid_column=None)
        >>> parse_table_url("iceberg+s3://bucket/wh/db/t").location
        's3://bucket/wh/db/t'
    """
    head, sep, rest = url.partition("://")
    kind, _, store = head.partition("+")
    if not sep or kind not in TABLE_KINDS:
        raise ConfigError(
            f"not a table URL: {url!r}",
            hint="write delta:///path, iceberg+s3://bucket/path, lance://relative/path...",
        )
    if store and store not in SCHEMES:
        raise ConfigError(
            f"unknown storage scheme {store!r} in {url!r}; datamill reads " + ", ".join(SCHEMES)
        )
    path, _, query = rest.partition("?")
    params = urllib.parse.parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    want = "snapshot_id" if kind == "iceberg" else "version"
    extra = sorted(set(params) - {want, "uid"})
    if extra or any(len(v) != 1 for v in params.values()):
        raise ConfigError(f"{url!r}: a {kind} URL takes ?{want}=N and ?uid=COLUMN, got {query!r}")
    version = None
    if want in params:
        try:
            version = int(params[want][0])
        except ValueError as exc:
            raise ConfigError(f"{url!r}: {want} must be an integer") from exc
    if not path:
        raise ConfigError(f"{url!r} names no table")
    location = f"{store}://{path}" if store and store != "file" else path
    return TableURL(kind, location, version, params["uid"][0] if "uid" in params else None)


def lance_version_of(manifest: Path) -> int:
    """The version a Lance manifest file holds (``3.manifest``; the V2 naming scheme stores
    ``u64::MAX - version``).

    Examples:
        >>> lance_version_of(Path("_versions/3.manifest"))
        3
        >>> lance_version_of(Path(f"{2**64 - 4}.manifest"))
        3
    """
    n = int(manifest.stem)
    return 2**64 - 1 - n if n > 2**63 else n


def pinned_version(state: Mapping[str, Any] | str, /) -> tuple[str, int]:
    """The table format and version a resume state, run record or fingerprint was taken on.

    Args:
        state: a loader state (``Loader.state_dict()``), a run record, or a table source's
            fingerprint.

    Raises:
        ResumeStateError: the state is not of a table source.

    Examples:
        >>> pinned_version({"dataset_fingerprint": "delta@v3-9f2c"})
        ('delta', 3)
    """
    fp = state if isinstance(state, str) else state.get("dataset_fingerprint")
    m = _FINGERPRINT.match(fp) if isinstance(fp, str) else None
    if m is None:
        raise ResumeStateError(
            f"the dataset fingerprint {fp!r} is not a table source's",
            hint="pass the state of a Loader over a DeltaSource, IcebergSource or LanceSource",
        )
    return m.group(1), int(m.group(2))


def s3_env_options(location: str, names: Mapping[str, str]) -> dict[str, str]:
    """A table library's storage options for ``location``: on ``s3://``, from the ``AWS_*``
    variables datamill's own S3 filesystem reads (:func:`~datamill.core.s3.s3_filesystem`).

    ``names`` maps what the variables give (``region``; ``endpoint``; ``allow_http``, ``"true"``
    for an ``http://`` endpoint; ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_SESSION_TOKEN``) to the library's option names; what it does not name is left out.

    Examples:
        >>> s3_env_options("/tmp/table", {"region": "region"})
        {}
    """
    if scheme_of(location).name != "s3":
        return {}
    env = os.environ
    given = {"region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        given["endpoint"] = endpoint
        if endpoint.startswith("http://"):
            given["allow_http"] = "true"
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        if env.get(key):
            given[key] = env[key]
    return {names[k]: v for k, v in given.items() if k in names}


def pinned_table_url(kind: str, location: str, query: str) -> str:
    """A URL of the ``kind`` table at ``location`` with ``query`` (the version it pins).

    Examples:
        >>> pinned_table_url("delta", "s3://bucket/t", "version=3")
        'delta+s3://bucket/t?version=3'
    """
    scheme = scheme_of(location)
    where = (
        f"{kind}+{scheme.name}://{location.removeprefix(scheme.prefix)}"
        if scheme.remote
        else f"{kind}://{os.path.abspath(location)}"
    )
    return f"{where}?{query}"


def table_fingerprint(kind: str, version: int, content: Any) -> str:
    """``"<kind>@v<version>-<hash of content>"``: readable in a resume state, stable across
    opens."""
    return f"{kind}@v{version}-{fingerprint_obj(['datamill.tables@1', kind, version, content])}"


@dataclass(frozen=True)
class TableFile:
    """One data file of a snapshot."""

    path: str
    """On the table's filesystem (a local absolute path, or ``bucket/key``)."""
    size: int
    rows: int
    """Rows in the file (before deletes)."""
    keep: NDArray[np.bool_] | None = None
    """The rows kept (``None``: every row)."""
    constants: tuple[tuple[str, Any], ...] = ()
    """Partition values: columns stored in the metadata, not in the file."""
    deletes: str = field(default="")
    """What the deletes are (for the fingerprint): a delete file name or a descriptor."""

    @property
    def kept(self) -> int:
        """Rows left after deletes."""
        return self.rows if self.keep is None else int(np.count_nonzero(self.keep))


def _plain(t: pa.DataType) -> pa.DataType:
    """``t`` with 32-bit offsets and unnamed list items (what two spellings of one type share)."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(_plain(t.value_type))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_plain(t.value_type), t.list_size)
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain(f.type), f.nullable) for f in t])
    return t


def adopt_file_types(
    schema: pa.Schema, file_schema: pa.Schema, names: Mapping[str, str | None]
) -> pa.Schema:
    """``schema`` with each column typed as the data file stores it when the two are spellings of
    the same type (``large_string`` for ``string``, a list's item named ``element`` or ``item``):
    reads then need no cast. Types that hold other values (a fixed-size list where the table says
    list) and view types keep the table's type.

    Examples:
        >>> element = pa.list_(pa.field("element", pa.int32()))
        >>> table = pa.schema([("s", pa.large_string()), ("l", element)])
        >>> stored = pa.schema([("s", pa.string()), ("l", pa.list_(pa.int32()))])
        >>> adopt_file_types(table, stored, {"s": "s", "l": "l"}) == stored
        True
    """
    fields = []
    for f in schema:
        phys = names.get(f.name)
        stored = file_schema.field(phys).type if phys in file_schema.names else None
        same = (
            stored is not None
            and stored != f.type
            and _plain(stored) == _plain(f.type)
            and "_view" not in str(stored)  # view types: not every kernel takes them
        )
        fields.append(pa.field(f.name, stored, f.nullable) if same else f.remove_metadata())
    return pa.schema(fields)


def _nulls_or_constant(value: Any, n: int, typ: pa.DataType, *, constant: bool) -> pa.Array:
    if not constant or value is None:
        return pa.nulls(n, typ)
    one = pa.array([value]).cast(typ)
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), one).cast(typ)


_PINNED = {"delta": ("Delta", "version"), "iceberg": ("Iceberg", "snapshot")}
"""Format -> (its name, what a pinned version is called) in messages."""


class ParquetFilesSource(SchemaColumns):
    """A snapshot's Parquet data files as shards (see the module docstring); the base of
    :class:`~datamill.tables.DeltaSource` and :class:`~datamill.tables.IcebergSource`.

    Args:
        location: the table's location (messages name it).
        files: the data files, in shard order.
        schema: the snapshot's schema (what ``columns`` lists, and the types read).
        fs: the filesystem the files are on.
        root: the table's root on ``fs`` (the fingerprint holds the files' paths below it).
        table: ``(format, version, table id)``: with the schema, ``shard_by`` and the files (path
            below ``root``, size, rows, deletes) they make the fingerprint
            (:func:`table_fingerprint`). A file missing is the error of a vacuumed version; a
            file without a row count (``rows < 0``) gets it from its footer.
        field_ids: column name -> Iceberg field id (files' columns matched by id), or ``None``
            (by name).
        shard_by: ``"auto"``, ``"file"`` or ``"row_group"``.
        cache_dir: remote only: the local shard cache. Defaults to ``None``
            (:func:`~datamill.core.objstore.default_cache_dir`).
        cache_limit: remote only: bytes the cache keeps at most. Defaults to ``None``.
        uid_column: the column identifying a sample (``datamill diff`` and ``trace`` key by it).
            Defaults to ``None``.
    """

    def __init__(
        self,
        location: str,
        files: Sequence[TableFile],
        schema: pa.Schema,
        *,
        fs: pafs.FileSystem,
        root: str,
        table: tuple[str, int, str],
        field_ids: Mapping[str, int] | None = None,
        shard_by: ShardBy = "auto",
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        uid_column: str | None = None,
    ) -> None:
        if shard_by not in ("auto", "file", "row_group"):
            raise ConfigError(f"shard_by must be 'auto', 'file' or 'row_group', got {shard_by!r}")
        self.location, self.schema, self.fs, self.shard_by = location, schema, fs, shard_by
        self.files = self._present(files, root, table)
        kind, version, table_id = self._table = table
        listed = [[f.path.removeprefix(root), f.size, f.rows, f.deletes] for f in self.files]
        content = [table_id, schema.to_string(), shard_by, listed]
        self._fingerprint = table_fingerprint(kind, version, content)
        self.field_ids = dict(field_ids) if field_ids is not None else None
        if self.files:  # the stored spelling of each type (the first file's footer): no casts
            stored = self._footer(self.files[0]).schema.to_arrow_schema()
            self.schema = adopt_file_types(schema, stored, self._physical(stored, schema.names))
        self.uid_column = check_uid_column(uid_column, schema, location)
        self.remote = scheme_of(location).remote
        self.cache = (
            ShardFileCache(
                fs,
                cache_dir if cache_dir is not None else default_cache_dir(),
                cache_limit=cache_limit,
            )
            if self.remote
            else None
        )
        self._shards = self._cut(shard_by)

    def _present(
        self, files: Sequence[TableFile], root: str, table: tuple[str, int, str]
    ) -> list[TableFile]:
        """``files``, each with its row count (from its footer when the log has none), once
        they are all found: a version whose files were removed is a located error."""
        gone = missing_files(self.fs, root, [f.path for f in files])
        if gone:
            name, unit = _PINNED.get(table[0], (table[0], "version"))
            raise vacuumed_error(name, f"{unit} {table[1]}", self.location, gone)
        return [f if f.rows >= 0 else replace(f, rows=self._footer(f).num_rows) for f in files]

    def _cut(self, shard_by: ShardBy) -> list[tuple[int, int | None, int, int]]:
        """``(file, row group or None, first row in the file, rows kept)`` per shard."""
        split = [
            shard_by == "row_group" or (shard_by == "auto" and f.size > LARGE_FILE_BYTES)
            for f in self.files
        ]
        cut = [f for f, s in zip(self.files, split) if s]
        with ThreadPoolExecutor(max_workers=max(1, min(_FOOTER_THREADS, len(cut)))) as ex:
            footers = iter(list(ex.map(self._footer, cut)))
        shards: list[tuple[int, int | None, int, int]] = []
        for i, (f, s) in enumerate(zip(self.files, split)):
            if not s:
                shards.append((i, None, 0, f.kept))
                continue
            md, start = next(footers), 0
            for g in range(md.num_row_groups):
                n = md.row_group(g).num_rows
                kept = n if f.keep is None else int(np.count_nonzero(f.keep[start : start + n]))
                shards.append((i, g, start, kept))
                start += n
        return shards

    def _footer(self, f: TableFile) -> pq.FileMetaData:
        try:
            with self.fs.open_input_file(f.path) as h:
                return pq.ParquetFile(h).metadata
        except (OSError, pa.ArrowException) as exc:
            raise DataFileError(f"not a readable Parquet file ({exc})", path=f.path) from exc

    # ------------------------------------------------------------------ the Source protocol
    @property
    def num_shards(self) -> int:
        """Data files (or row groups)."""
        return len(self._shards)

    def shard_sizes(self) -> NDArray[np.int64]:
        """Rows per shard, deleted rows not counted."""
        return np.array([s[3] for s in self._shards], dtype=np.int64)

    def shard_nbytes(self) -> NDArray[np.int64]:
        """Bytes of each shard's file (what it costs to fetch and cache)."""
        return np.array([self.files[s[0]].size for s in self._shards], dtype=np.int64)

    pin = "version"
    """The name of what pins the table (``version``, ``snapshot_id``) in :attr:`pinned_url` and
    ``repr``."""

    @property
    def pinned_url(self) -> str:
        """A URL that opens this version again (``delta:///path?version=3``,
        ``iceberg:///path?snapshot_id=N``)."""
        return pinned_table_url(self._table[0], self.location, f"{self.pin}={self._table[1]}")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.location!r}, {self.pin}={self._table[1]}, "
            f"shards={self.num_shards}, rows={int(self.shard_sizes().sum())})"
        )

    def fingerprint(self) -> str:
        """``"<format>@v<version>-<hash>"``: the pinned version and the files it lists."""
        return self._fingerprint

    def expect_reads(self, shards: Sequence[int]) -> None:
        """The shards a build reads next: a bounded cache evicts in that plan's order."""
        if self.cache is not None:
            self.cache.expect([self.files[self._shards[int(k)][0]].path for k in shards])

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        """Shard ``index`` with the chosen columns, deleted rows dropped."""
        cols = check_read_args(self, index, columns, path=self.location)
        i, group, start, _ = self._shards[index]
        f = self.files[i]
        try:
            pf = self._open(f)
            names = self._physical(pf.schema_arrow, cols)
            want = sorted({n for n in names.values() if n is not None})
            raw = pf.read(columns=want) if group is None else pf.read_row_group(group, columns=want)
        except DatamillError:
            raise
        except (OSError, pa.ArrowException) as exc:
            raise DataFileError(
                f"cannot read data file ({exc})", path=self._url(f), shard=index
            ) from exc
        return self._conform(raw, cols, names, f, start, index)

    # ------------------------------------------------------------------ reading
    def _url(self, f: TableFile) -> str:
        return f"{scheme_of(self.location).prefix}{f.path}" if self.remote else f.path

    def _open(self, f: TableFile) -> pq.ParquetFile:
        if self.cache is None:
            return open_parquet(f.path, memory_map=True)
        info = pafs.FileInfo(f.path, pafs.FileType.File, size=f.size)
        try:
            data = self.cache.read_buffer(f.path, info=info)
        except DatamillError as exc:
            exc.add_note(f"a data file of the table at {self.location}")
            raise
        except OSError as exc:
            raise storage_error(exc, self._url(f)) from exc
        return open_parquet(pa.BufferReader(data))

    def _physical(self, file_schema: pa.Schema, cols: list[str]) -> dict[str, str | None]:
        """Column -> the file's column holding it (``None``: not in the file)."""
        if self.field_ids is None:
            have = set(file_schema.names)
            return {c: c if c in have else None for c in cols}
        by_id = {}
        for fld in file_schema:
            meta = fld.metadata or {}
            if FIELD_ID in meta:
                by_id[int(meta[FIELD_ID])] = fld.name
        return {c: by_id.get(self.field_ids[c]) for c in cols}

    def _conform(
        self,
        raw: pa.Table,
        cols: list[str],
        names: Mapping[str, str | None],
        f: TableFile,
        start: int,
        index: int,
    ) -> pa.Table:
        """The file's columns as the snapshot's schema, deleted rows dropped."""
        n, constants = raw.num_rows, dict(f.constants)
        arrays = []
        for c in cols:
            typ = self.schema.field(c).type
            phys = names[c]
            if phys is None:
                arrays.append(_nulls_or_constant(constants.get(c), n, typ, constant=c in constants))
                continue
            col = raw.column(phys)
            if col.type != typ:
                try:
                    col = col.cast(typ)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise DataFileError(
                        f"column has type {col.type} in this file, the snapshot says {typ}",
                        path=self._url(f),
                        column=c,
                        shard=index,
                    ) from exc
            arrays.append(col)
        table = pa.Table.from_arrays(arrays, schema=pa.schema([self.schema.field(c) for c in cols]))
        if f.keep is not None:
            table = table.filter(pa.array(f.keep[start : start + n]))
        return table


def check_uid_column(uid_column: str | None, schema: pa.Schema, location: str) -> str | None:
    """``uid_column`` when the schema has it (``None`` stays ``None``)."""
    if uid_column is not None and uid_column not in schema.names:
        raise SchemaError(
            f"uid_column {uid_column!r} is not a column of the table (it has {schema.names})",
            path=location,
            column=uid_column,
        )
    return uid_column


def missing_files(fs: pafs.FileSystem, root: str, paths: Sequence[str]) -> list[str]:
    """The ``paths`` that do not exist: one recursive listing of ``root`` for those under it (a
    single request on object storage), a lookup each for the others."""
    under = [p for p in paths if p.startswith(root.rstrip("/") + "/")]
    other = [p for p in paths if p not in set(under)]
    present: set[str] = set()
    if under:
        sel = pafs.FileSelector(root, recursive=True, allow_not_found=True)
        present = {i.path for i in fs.get_file_info(sel) if i.type == pafs.FileType.File}
    gone = [p for p in under if p not in present]
    if other:
        gone += [i.path for i in fs.get_file_info(other) if i.type != pafs.FileType.File]
    return gone


def vacuumed_error(
    kind: str, what: str, location: str, gone: Sequence[str]
) -> DataFileNotFoundError:
    """The located error of a version whose data files were removed (vacuumed, expired)."""
    return DataFileNotFoundError(
        f"{kind} {what} needs {len(gone)} data file(s) that no longer exist (first: "
        f"{Path(gone[0]).name}): it was vacuumed or expired",
        path=location,
        shard=what,
        hint="resume from a version whose files still exist, or keep versions longer "
        "(vacuum/expire with a longer retention)",
    )


def location_fs(
    location: str, filesystem: pafs.FileSystem | None = None
) -> tuple[pafs.FileSystem, str]:
    """The filesystem and root path of a table location (a local path or a storage URL)."""
    fs, root = filesystem_for(location, filesystem=filesystem)
    return fs, root.rstrip("/") or "/"
