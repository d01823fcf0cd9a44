"""Import from the formats of the loaders users switch from: MDS, litData chunks, WebDataset, HF
datasets.

Each reader follows the format as its project documents and writes it (no peer library needed):

* ``mds`` - mosaicml-streaming: ``index.json`` lists shards (``column_names``, ``column_encodings``,
  ``column_sizes``, ``raw_data.basename``, no compression); a shard is ``uint32 n``, ``uint32[n +
  1]`` sample offsets from the file start, then the samples: a ``uint32`` size per variable-size
  column, then each column's bytes. Encodings read: the numeric ones, ``int``, ``bytes``, ``str``,
  ``json``, ``str_int``/``str_float``, ``ndarray:<dtype>[:<shape>]`` (a list column; with a fixed
  shape a ``fixed_size_list``), ``jpeg``/``png`` (kept as their encoded bytes). ``pkl`` is refused
  (unpickling runs code).
* ``litdata`` - litData ``optimize`` output: ``index.json`` (``config.data_format``, the column
  names in ``config.data_spec``'s dict context, ``chunks[].filename``); a chunk is ``uint32 n``,
  ``uint32[n + 1]`` item offsets, then the items: a ``uint32`` size per element, then each element.
  Formats read: ``int``, ``float``, ``bool``, ``str``, ``bytes``, ``no_header_numpy:<k>`` and
  ``numpy`` (its own dtype/shape header).
* ``webdataset`` - ``*.tar`` files (sorted by name); members ``<key>.<ext>`` grouped by key in tar
  order: a ``key`` column, one binary column per extension (``json``/``txt``/``cls`` stay bytes
      too).
* ``hf`` - a ``datasets`` ``save_to_disk`` folder: ``state.json``'s ``_data_files``, each an Arrow
  IPC stream, read as they are (zero-copy Arrow).

:func:`read_peer` gives one Arrow table (samples in the peer's order); :func:`from_peer` writes it
as a new shardset dataset (``datamill shards create ROOT --from FORMAT PATH``).
"""

from __future__ import annotations

import io
import itertools
import json
import os
import tarfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from datamill.core.errors import DataFileError, DataFileNotFoundError, SchemaError
from datamill.core.storage import filesystem_for, scheme_of, storage_error

__all__ = ["PEER_FORMATS", "from_peer", "read_peer"]

PEER_FORMATS = ("hf", "litdata", "mds", "webdataset")
"""The formats :func:`read_peer` reads."""

_MDS_SCALARS: dict[str, tuple[str, int]] = {
    "int": ("int64", 8),
    "uint8": ("uint8", 1),
    "uint16": ("uint16", 2),
    "uint32": ("uint32", 4),
    "uint64": ("uint64", 8),
    "int8": ("int8", 1),
    "int16": ("int16", 2),
    "int32": ("int32", 4),
    "int64": ("int64", 8),
    "float16": ("float16", 2),
    "float32": ("float32", 4),
    "float64": ("float64", 8),
}
_MDS_DTYPES = {
    8: "uint8",
    9: "int8",
    16: "uint16",
    17: "int16",
    18: "float16",
    32: "uint32",
    33: "int32",
    34: "float32",
    64: "uint64",
    65: "int64",
    66: "float64",
}
_MDS_SHAPE_DTYPES = {0: "uint8", 1: "uint16", 2: "uint32", 3: "uint64"}
_LITDATA_DTYPES = {
    0: "i1",
    1: "<i2",
    2: "<i4",
    3: "<i8",
    4: "u1",
    5: "<u2",
    6: "<u4",
    7: "<u8",
    8: "<f2",
    9: "<f4",
    10: "<f8",
    13: "?",
}


class _Folder:
    """A peer's dataset folder (or one file) on any registered storage scheme (a local path,
    ``s3://``...: :func:`~datamill.core.storage.filesystem_for`); names are relative to it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        text = os.fspath(path)
        self.display = text.rstrip("/") or text
        self.fs, self.path = filesystem_for(text)
        self.remote = scheme_of(text).remote

    def show(self, name: str = "") -> str:
        return f"{self.display}/{name}" if name else self.display

    def _join(self, name: str) -> str:
        return f"{self.path}/{name}" if name else self.path

    def kind(self, name: str = "") -> pafs.FileType:
        try:
            return self.fs.get_file_info(self._join(name)).type
        except OSError as exc:
            raise storage_error(exc, self.show(name)) from exc

    def read(self, name: str = "", *, missing: str) -> bytes:
        """The whole file; ``missing`` is the message when it is not there."""
        try:
            with self.fs.open_input_stream(self._join(name)) as f:
                return bytes(f.read())
        except FileNotFoundError as exc:
            raise DataFileNotFoundError(missing, path=self.show(name)) from exc
        except OSError as exc:
            raise storage_error(exc, self.show(name)) from exc

    def names(self, suffix: str) -> list[str]:
        """The files of the folder ending with ``suffix``, sorted."""
        sel = pafs.FileSelector(self.path, allow_not_found=True)
        try:
            infos = self.fs.get_file_info(sel)
        except OSError as exc:
            raise storage_error(exc, self.display) from exc
        return sorted(
            i.base_name
            for i in infos
            if i.type == pafs.FileType.File and i.base_name.endswith(suffix)
        )


def _load_json(root: _Folder, name: str, fmt: str) -> Any:
    if root.kind(name) != pafs.FileType.File:
        raise DataFileNotFoundError(
            f"no {name} here: not a {fmt} dataset folder", path=root.show(name)
        )
    try:
        return json.loads(root.read(name, missing=f"no {name}").decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise DataFileError(f"cannot read this {fmt} index ({exc})", path=root.show(name)) from exc


def _records(blob: bytes, path: str) -> list[memoryview]:
    """The items of an MDS shard / litData chunk: ``uint32 n``, ``uint32[n + 1]`` offsets, then the
    items."""
    mv = memoryview(blob)
    if len(blob) < 4:
        raise DataFileError("truncated file (no item count)", path=path)
    n = int(np.frombuffer(blob, np.uint32, 1)[0])
    if len(blob) < 4 * (n + 2):
        raise DataFileError(f"truncated file: {n} items announced, offsets missing", path=path)
    offsets = np.frombuffer(blob, np.uint32, n + 1, 4).astype(np.int64)
    if (np.diff(offsets) < 0).any() or offsets[-1] > len(blob):
        raise DataFileError(
            "corrupt item offsets (decreasing or past the end of the file)", path=path
        )
    return [mv[int(a) : int(b)] for a, b in itertools.pairwise(offsets.tolist())]


def _split(item: memoryview, sizes: list[int | None], path: str, row: int) -> list[memoryview]:
    """An item's fields: a uint32 size per variable field first, then the fields' bytes."""
    nvar = sum(s is None for s in sizes)
    var = np.frombuffer(item[: 4 * nvar], np.uint32).tolist() if nvar else []
    pos, out, vi = 4 * nvar, [], 0
    for s in sizes:
        if s is None:
            s = var[vi]
            vi += 1
        out.append(item[pos : pos + s])
        pos += s
    if pos != len(item):
        raise DataFileError(
            f"item {row} holds {len(item)} bytes, its fields {pos}", path=path, row=row
        )
    return out


def _column(values: list[Any], name: str, path: str) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowException, ValueError, TypeError) as exc:
        raise SchemaError(
            f"column {name!r} mixes types across samples ({exc})", path=path, column=name
        ) from exc


def _mds_decoder(enc: str, path: str, name: str) -> Callable[[memoryview], Any]:
    if enc in _MDS_SCALARS:
        dtype = np.dtype(_MDS_SCALARS[enc][0])
        return lambda b: np.frombuffer(b, dtype)[0].item()
    if enc in ("bytes", "jpeg", "png"):
        return bytes
    if enc == "str":
        return lambda b: bytes(b).decode("utf-8")
    if enc == "json":
        return lambda b: json.loads(bytes(b).decode("utf-8"))
    if enc == "str_int":
        return lambda b: int(bytes(b).decode("utf-8"))
    if enc == "str_float":
        return lambda b: float(bytes(b).decode("utf-8"))
    if enc.startswith("ndarray"):
        parts = enc.split(":")
        vdtype = parts[1] if len(parts) > 1 and parts[1] else None
        shape = tuple(int(d) for d in parts[2].split(",")) if len(parts) > 2 else None

        def nd(b: memoryview) -> Any:
            i, dt = 0, vdtype
            if dt is None:
                dt, i = _MDS_DTYPES[b[0]], 1
            shp = shape
            if shp is None:
                ndim, sdt = b[i] >> 2, _MDS_SHAPE_DTYPES[b[i] & 3]
                size = np.dtype(sdt).itemsize
                shp = tuple(np.frombuffer(b[i + 1 : i + 1 + ndim * size], sdt).tolist())
                i += 1 + ndim * size
            arr = np.frombuffer(b[i:], dt).reshape(shp)
            return (
                arr if arr.ndim == 1 else arr.tolist()
            )  # 1-d: a typed list (list<int32> stays int32)

        return nd
    raise SchemaError(
        f"MDS column {name!r} has encoding {enc!r}, which datamill does not import",
        path=path,
        column=name,
        hint="re-encode it as bytes, str, json, a number or an ndarray; "
        "pkl is refused on purpose (unpickling runs code)",
    )


def read_mds(path: str | os.PathLike[str]) -> pa.Table:
    """Every sample of an MDS dataset folder (``index.json`` + shards), in shard order."""
    root = _Folder(path)
    index = _load_json(root, "index.json", "MDS")
    tables = []
    for shard in index.get("shards", []):
        if shard.get("compression") or shard.get("format") != "mds":
            raise DataFileError(
                f"shard {shard.get('raw_data', {}).get('basename')} is "
                f"{shard.get('format')!r} with compression {shard.get('compression')!r}",
                path=root.show("index.json"),
                hint="write the MDS dataset with compression=None",
            )
        name = shard["raw_data"]["basename"]
        file = root.show(name)
        names, encs, sizes = shard["column_names"], shard["column_encodings"], shard["column_sizes"]
        decoders = [_mds_decoder(e, file, n) for n, e in zip(names, encs)]
        cols: list[list[Any]] = [[] for _ in names]
        for row, item in enumerate(_records(_read(root, name), file)):
            for c, (dec, field) in enumerate(zip(decoders, _split(item, sizes, file, row))):
                cols[c].append(dec(field))
        tables.append(pa.table({n: _column(v, n, file) for n, v in zip(names, cols)}))
    return _concat(tables, root.display)


def _read(root: _Folder, name: str) -> bytes:
    return root.read(name, missing="a shard the index lists is missing")


def _concat(tables: list[pa.Table], root: str) -> pa.Table:
    if not tables:
        raise DataFileError("the index lists no shards", path=root)
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except pa.ArrowException as exc:
        raise SchemaError(f"shards disagree on their columns ({exc})", path=root) from exc


def _litdata_decoder(fmt: str, path: str, name: str) -> Callable[[memoryview], Any]:
    fixed = {
        "int": "<i8",
        "float": "<f8",
        "bool": "?",
    }  # every element's size is in the item header
    if fmt in fixed:
        scalar = fixed[fmt]
        return lambda b: np.frombuffer(b, scalar)[0].item()
    if fmt == "str":
        return lambda b: bytes(b).decode("utf-8")
    if fmt == "bytes":
        return bytes
    if fmt.startswith("no_header_numpy:"):
        dt = _LITDATA_DTYPES[int(fmt.split(":")[1])]
        return lambda b: np.frombuffer(b, dt)
    if fmt == "numpy" or fmt.startswith("numpy:"):

        def nd(b: memoryview) -> Any:
            dt = _LITDATA_DTYPES[int(np.frombuffer(b[:4], np.uint32)[0])]
            ndim = int(np.frombuffer(b[4:8], np.uint32)[0])
            shape = tuple(np.frombuffer(b[8 : 8 + 4 * ndim], np.uint32).tolist())
            arr = np.frombuffer(b[8 + 4 * ndim :], dt).reshape(shape)
            return arr if arr.ndim == 1 else arr.tolist()

        return nd
    raise SchemaError(
        f"litData column {name!r} has data format {fmt!r}, which datamill does not import",
        path=path,
        column=name,
        hint="optimize() it as int, float, str, bytes or a numpy array",
    )


def read_litdata(path: str | os.PathLike[str]) -> pa.Table:
    """Every item of a litData ``optimize`` output folder (``index.json`` + chunks), in chunk
    order."""
    root = _Folder(path)
    index = _load_json(root, "index.json", "litData")
    cfg = index.get("config") or {}
    if cfg.get("compression") or cfg.get("encryption"):
        raise DataFileError(
            "compressed or encrypted litData chunks are not imported",
            path=root.show("index.json"),
            hint="optimize() again with compression=None",
        )
    formats = cfg.get("data_format") or []
    names = _litdata_names(cfg.get("data_spec"), len(formats))
    decoders = [_litdata_decoder(f, root.display, n) for f, n in zip(formats, names)]
    tables = []
    for chunk in index.get("chunks", []):
        file = root.show(chunk["filename"])
        cols: list[list[Any]] = [[] for _ in names]
        for row, item in enumerate(_records(_read(root, chunk["filename"]), file)):
            for c, (dec, field) in enumerate(
                zip(decoders, _split(item, [None] * len(formats), file, row))
            ):
                cols[c].append(dec(field))
        tables.append(pa.table({n: _column(v, n, file) for n, v in zip(names, cols)}))
    return _concat(tables, root.display)


def _litdata_names(spec: Any, count: int) -> list[str]:
    """The column names: the dict keys of litData's pytree spec (``[version, {"type":
    "builtins.dict", ...}]``)."""
    try:
        tree = json.loads(spec)[1]
        if tree.get("type") == "builtins.dict":
            names = [str(n) for n in json.loads(tree["context"])]
            if len(names) == count and all(not c["children_spec"] for c in tree["children_spec"]):
                return names
    except (TypeError, ValueError, KeyError, IndexError):
        pass
    return [f"item_{i}" for i in range(count)]  # a tuple or a single value per item


def read_webdataset(path: str | os.PathLike[str]) -> pa.Table:
    """The samples of WebDataset ``*.tar`` files (a file, or a folder's files sorted by name)."""
    root = _Folder(path)
    files = [""] if root.kind() == pafs.FileType.File else root.names(".tar")
    if not files:
        raise DataFileNotFoundError("no *.tar here", path=root.display)
    keys: list[str] = []
    fields: dict[str, dict[int, bytes]] = {}
    for file in files:
        data = root.read(file, missing="no such tar file")
        try:
            with tarfile.open(fileobj=io.BytesIO(data)) as tf:
                for m in tf:
                    if not m.isfile():
                        continue
                    base = m.name.rsplit("/", 1)[-1]
                    key, _, ext = base.partition(".")
                    key = m.name[: len(m.name) - len(base)] + key
                    if not ext:
                        continue
                    if not keys or keys[-1] != key:
                        keys.append(key)
                    f = tf.extractfile(m)
                    fields.setdefault(ext, {})[len(keys) - 1] = f.read() if f is not None else b""
        except (tarfile.TarError, OSError) as exc:
            raise DataFileError(f"not a readable tar file ({exc})", path=root.show(file)) from exc
    cols = {"key": pa.array(keys, pa.string())}
    for ext in sorted(fields):
        got = fields[ext]
        cols[ext] = pa.array([got.get(i) for i in range(len(keys))], pa.binary())
    return pa.table(cols)


def read_hf(path: str | os.PathLike[str]) -> pa.Table:
    """A Hugging Face ``save_to_disk`` folder's Arrow files (``state.json``), zero-copy."""
    root = _Folder(path)
    state = _load_json(root, "state.json", "Hugging Face datasets")
    tables = []
    for entry in state.get("_data_files", []):
        name, file = entry["filename"], root.show(entry["filename"])
        try:
            if root.remote:
                data = root.read(name, missing="an Arrow file state.json lists is missing")
                tables.append(pa.ipc.open_stream(pa.BufferReader(data)).read_all())
                continue
            with pa.memory_map(f"{root.path}/{name}") as src:  # local: zero-copy
                tables.append(pa.ipc.open_stream(src).read_all())
        except FileNotFoundError as exc:
            raise DataFileNotFoundError(
                "an Arrow file state.json lists is missing", path=file
            ) from exc
        except pa.ArrowException as exc:
            raise DataFileError(f"not an Arrow IPC stream ({exc})", path=file) from exc
    table = _concat(tables, root.display)
    if state.get("_indices_data_files"):
        raise DataFileError(
            "this saved dataset has an indices mapping (a shuffle or select not flattened)",
            path=root.display,
            hint="save it after `.flatten_indices()`",
        )
    return table.replace_schema_metadata(None)


_READERS: dict[str, Callable[[str | os.PathLike[str]], pa.Table]] = {
    "hf": read_hf,
    "litdata": read_litdata,
    "mds": read_mds,
    "webdataset": read_webdataset,
}


def read_peer(fmt: str, path: str | os.PathLike[str], /) -> pa.Table:
    """Every sample of a peer's dataset as one Arrow table, in the peer's order.

    Args:
        fmt: ``"hf"``, ``"litdata"``, ``"mds"`` or ``"webdataset"``.
        path: the peer's dataset folder (or one ``.tar``): a local path or a URL of a registered
            scheme (``s3://bucket/prefix``), read through :mod:`datamill.core.storage`.

    Raises:
        ConfigError: an unknown format. DataFileNotFoundError: no index or a missing shard.
        DataFileError: a truncated or compressed file. SchemaError: an encoding not imported.

    Examples:
        >>> import tempfile, tarfile, io
        >>> d = tempfile.mkdtemp()
        >>> with tarfile.open(d + "/a.tar", "w") as tf:
        ...     for name, data in (
        ...         ("s1.txt", b"hi"),
        ...         ("s1.cls", b"3"),
        ...         ("s2.txt", b"yo"),
        ...         ("s2.cls", b"1"),
        ...     ):
        ...         info = tarfile.TarInfo(name)
        ...         info.size = len(data)
        ...         tf.addfile(info, io.BytesIO(data))
        >>> read_peer("webdataset", d).to_pydict()
        {'key': ['s1', 's2'], 'cls': [b'3', b'1'], 'txt': [b'hi', b'yo']}
    """
    from datamill.core.errors import ConfigError

    reader = _READERS.get(fmt)
    if reader is None:
        raise ConfigError(f"unknown peer format {fmt!r}; expected one of {', '.join(PEER_FORMATS)}")
    return reader(path)


def from_peer(
    fmt: str,
    path: str | os.PathLike[str],
    root: str | os.PathLike[str],
    /,
    *,
    uid: str,
    shardset: str,
    shard_size: int,
    add_uid: bool = False,
    overwrite: bool = False,
) -> Any:
    """A peer's dataset (:func:`read_peer`) written as a new shardset dataset at ``root``.

    Args:
        fmt: the peer format. path: its folder. root: the new dataset.
        uid: the UID column (``add_uid`` adds it as row numbers when the data has none).
        shardset: the shardset's name. shard_size: rows per shard.
        add_uid: add ``uid`` as row numbers if absent. Defaults to ``False``.
        overwrite: replace a dataset at ``root``. Defaults to ``False``.

    Returns:
        The new :class:`~datamill.shards.ShardsetDataset`.
    """
    from datamill.shards.dataset import ShardsetDataset

    table = read_peer(fmt, path)
    return ShardsetDataset.create(
        root,
        table,
        uid=uid,
        shardset=shardset,
        shard_size=shard_size,
        add_uid=add_uid,
        overwrite=overwrite,
    )
