"""``preprocess()`` and ``load()``: a dataset + config → ``<stem>.hdf5`` + ``<stem>.meta.json``.

Steps: read the needed columns (typed) → split → drop rows / compute fill values on the fit rows
→ per feature ``fit`` per block + ``merge`` + ``finalize`` on the fit (train) rows → ``transform``
block by block into a chunked HDF5 (temp file + rename) → ``meta.json`` written last (atomic).

Cache: ``meta.json`` records ``fingerprint = chain(content hash of the input, "datamill.preprocess@1",
{config, version, applied metadata})`` and the HDF5's size/mtime/run id. A rerun with the same input
content and config returns the existing files without recomputing; anything else recomputes. The old
``meta.json`` is deleted before a new HDF5 is written, so a crash never leaves a trusted pair.
"""

from __future__ import annotations

import collections
import io
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from datamill.core.constants import HDF5_SUFFIX, META_FORMAT, META_SUFFIX
from datamill.core.errors import CacheError, ConfigError, DataFileError
from datamill.core.fingerprint import chain, fingerprint_bytes, fingerprint_file, fingerprint_obj
from datamill.core.io import atomic_path, atomic_write
from datamill.core.memory import release_memory
from datamill.core.progress import progress
from datamill.preprocess.config import (
    PreprocessConfig,
    ResolvedFeature,
    load_config,
    resolve_features,
)
from datamill.preprocess.features import (
    CSR,
    FeatureContext,
    FeatureHandler,
    get_handler,
    handler_class,
)
from datamill.preprocess.hdf5 import H5Writer, read_hdf5
from datamill.preprocess.meta import HEADER, Metadata, read_meta
from datamill.preprocess.missing import apply_fill, compute_fill
from datamill.preprocess.reading import cast_column, read_dataset
from datamill.preprocess.split import SPLIT_NAMES, compute_split

__all__ = ["Metadata", "Preprocessed", "load", "preprocess"]

TRANSFORM_VERSION = "datamill.preprocess@1"
#: rows per fit/transform block (fit statistics are merged across blocks)
BLOCK_ROWS = 1 << 16  # 64k rows: bounded transform temporaries (1<<19 tripled peak RSS on text at 600k rows)


@dataclass
class Preprocessed:
    """What :func:`preprocess` returns."""

    metadata: Metadata
    hdf5_path: Path | None
    meta_path: Path | None
    cached: bool
    num_rows: int
    seconds: float
    _data: dict[str, np.ndarray[Any, Any] | CSR] | None = field(default=None, repr=False)

    @property
    def data(self) -> dict[str, np.ndarray[Any, Any] | CSR]:
        """The tensors (read from the HDF5 on first access when they were saved)."""
        if self._data is None:
            if self.hdf5_path is None:  # pragma: no cover - skip_save always keeps data
                raise CacheError("no data: nothing was saved")
            self._data, _ = read_hdf5(self.hdf5_path)
        return self._data


def _version() -> str:
    from datamill import __version__

    return __version__


def _input_fingerprint(dataset: Any, table: pa.Table | None = None) -> str:
    if isinstance(dataset, (str, os.PathLike)):
        return fingerprint_file(dataset)
    if table is None:
        table = dataset if isinstance(dataset, pa.Table) else pa.Table.from_pandas(dataset, preserve_index=False)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return fingerprint_bytes(sink.getvalue())


#: worker threads that fit and transform blocks (numpy and Arrow release the GIL in the heavy parts);
#: None: the environment variable ``DATAMILL_THREADS`` (1: no threads), else the cores, at most 4
THREADS: int | None = None


def thread_count() -> int:
    """How many worker threads :func:`preprocess` uses (see :data:`THREADS`).

    Raises:
        ConfigError: ``DATAMILL_THREADS`` is not a positive integer.
    """
    if THREADS is not None:
        return THREADS
    raw = os.environ.get("DATAMILL_THREADS", "").strip()
    if not raw:
        return max(1, min(4, os.cpu_count() or 1))
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"DATAMILL_THREADS must be a positive integer, got {raw!r}")
    return int(raw)


def _in_order(fn: Callable[[Any], Any], items: list[Any], threads: int | None = None) -> Iterator[Any]:
    """``fn`` over ``items`` in worker threads, results in order, at most ``threads`` ahead of the consumer."""
    threads = thread_count() if threads is None else threads
    if threads <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="datamill-block") as pool:
        pending: collections.deque[Future[Any]] = collections.deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= threads:
                yield pending.popleft().result()
                release_memory()  # the workers' glibc arenas keep freed blocks otherwise (+15% peak RSS)
        while pending:
            yield pending.popleft().result()


def _blocks(n: int) -> Iterator[tuple[int, int]]:
    for start in range(0, max(n, 1), BLOCK_ROWS):
        yield start, min(n, start + BLOCK_ROWS)


def _cache_hit(meta_path: Path, hdf5_path: Path, fp: str) -> dict[str, Any] | None:
    try:
        data = read_meta(meta_path)
        h = data[HEADER]
        st = hdf5_path.stat()
        if h["fingerprint"] == fp and h["hdf5"]["size"] == st.st_size and h["hdf5"]["mtime_ns"] == st.st_mtime_ns:
            return data
    except (CacheError, OSError, KeyError, TypeError):
        return None
    return None


def preprocess(
    dataset: Any,
    config: PreprocessConfig | dict[str, Any] | str | os.PathLike[str] | None = None,
    *,
    output_dir: str | os.PathLike[str] | None = None,
    skip_save: bool = False,
    metadata: str | os.PathLike[str] | Metadata | dict[str, Any] | None = None,
) -> Preprocessed:
    """Preprocess ``dataset`` with a Ludwig-shaped ``config`` into tensors + metadata.

    Args:
        dataset: a CSV/TSV/Parquet/JSONL path (or ``archive.zip:member``), a pandas DataFrame or a
            pyarrow Table.
        config: config model, dict, or YAML/JSON path. Defaults to ``None``: only allowed with
            ``metadata`` (its recorded config is used).
        output_dir: where ``<stem>.hdf5`` / ``<stem>.meta.json`` go. Defaults to ``None``: beside
            the input file (in-memory data is then not saved).
        skip_save: compute in memory only, write nothing. Defaults to ``False``.
        metadata: a ``meta.json`` (path, :class:`Metadata` or dict) to apply to unseen data: its
            vocabularies, fill values and normalization statistics are used, nothing is refitted,
            no split is made. Defaults to ``None``.

    Returns:
        :class:`Preprocessed` (``.data`` tensors, ``.metadata``, paths, ``.cached``).

    Raises:
        ConfigError: invalid config. SchemaError: a configured column is missing.
        DataFileError: unreadable input, a value that does not parse (file, line/row, column named).

    Examples:
        >>> import pyarrow as pa
        >>> t = pa.table({"color": ["red", "blue", "red", None], "size": [1.0, 2.0, 3.0, None]})
        >>> cfg = {"input_features": [{"name": "color", "type": "category"},
        ...        {"name": "size", "type": "number",
        ...         "preprocessing": {"normalization": "minmax", "missing_value_strategy": "fill_with_mean"}}]}
        >>> out = preprocess(t, cfg)
        >>> out.data["color"].tolist(), out.data["size"].tolist()
        ([1, 2, 1, 0], [0.0, 0.5, 1.0, 0.5])
        >>> out.metadata.decode("color", out.data["color"]).tolist()
        ['red', 'blue', 'red', '<UNK>']
    """
    start = time.perf_counter()
    meta_in: dict[str, Any] | None = None
    if metadata is not None:
        if isinstance(metadata, Metadata):
            meta_in = metadata.to_dict()
        elif isinstance(metadata, dict):
            meta_in = metadata
        else:
            meta_in = read_meta(metadata)
        if config is None:
            config = meta_in[HEADER]["config"]
    if config is None:
        raise ConfigError("a config is required (or metadata= of an earlier run)")
    cfg, cfg_source = load_config(config)
    features = resolve_features(cfg, cfg_source)
    if meta_in is not None:
        for f in features:
            if f.name not in meta_in:
                raise ConfigError(f"feature {f.name!r} is not in the metadata being applied",
                                  hint="use the config the metadata was made with")

    in_memory = not isinstance(dataset, (str, os.PathLike))
    save = not skip_save and not (in_memory and output_dir is None)
    split_cfg = cfg.preprocessing.split if meta_in is None else None

    wanted: dict[str, str] = {}
    for f in features:
        t = handler_class(f.type).input_type
        wanted[f.column] = t if wanted.get(f.column, t) == t else "raw"
    if split_cfg is not None and split_cfg.type == "fixed":
        if split_cfg.column is None:
            raise ConfigError("preprocessing.split.column: split type 'fixed' needs a column", path=cfg_source)
        wanted.setdefault(split_cfg.column, "string")

    fp = ""
    hdf5_path = meta_path = None
    if save:
        fp_input = _input_fingerprint(dataset)
        fp = chain(fp_input, TRANSFORM_VERSION, {
            "config": cfg.to_dict(), "version": _version(),
            "metadata": fingerprint_obj({k: v for k, v in meta_in.items() if k != HEADER}) if meta_in else None})
        stem, base = _stem_and_dir(dataset) if not in_memory else ("dataset", Path(output_dir or "."))
        out_dir = Path(output_dir) if output_dir is not None else base
        hdf5_path = out_dir / f"{stem}{HDF5_SUFFIX}"
        meta_path = out_dir / f"{stem}{META_SUFFIX}"
        hit = _cache_hit(meta_path, hdf5_path, fp)
        if hit is not None:
            return Preprocessed(Metadata(hit), hdf5_path, meta_path, True, int(hit[HEADER]["num_rows"]),
                                time.perf_counter() - start)

    ds = read_dataset(dataset, wanted)
    table = ds.table
    n = table.num_rows
    if n == 0:
        raise DataFileError("the dataset has a header but no rows", path=ds.name)

    split = None
    if split_cfg is not None:
        split = compute_split(n, split_cfg, seed=cfg.preprocessing.seed,
                              column=table[split_cfg.column] if split_cfg.type == "fixed" else None,
                              path=ds.name, line_offset=ds.line_offset)
    drop = [f for f in features if f.missing_value_strategy == "drop_row"]
    kept: np.ndarray[Any, Any] | None = None
    if drop:
        keep = np.ones(n, dtype=bool)
        for f in drop:
            keep &= ~np.asarray(table[f.column].is_null().to_numpy(zero_copy_only=False), dtype=bool)
        table = table.filter(pa.array(keep))
        split = split[keep] if split is not None else None
        n = table.num_rows
        kept = np.flatnonzero(keep)
    fit_mask = pa.array(split == 0) if split is not None else None

    handlers: dict[str, FeatureHandler] = {}
    columns: dict[str, pa.Array] = {}
    metas: dict[str, dict[str, Any]] = {}
    out_data: dict[str, np.ndarray[Any, Any] | CSR] | None = None
    run_id = uuid.uuid4().hex
    uses = collections.Counter(f.column for f in features)
    with _original_rows(kept, ds.line_offset):
        for f in features:
            h = handlers[f.name] = get_handler(f.type)
            ctx = FeatureContext(f.name, f.column, ds.name, ds.base_dir, 0, ds.line_offset)
            col = cast_column(table[f.column], h.input_type, name=ds.name, column=f.column, line_offset=ds.line_offset)
            uses[f.column] -= 1
            if not uses[f.column]:  # last use: free the raw column now that its cast copy exists
                table = ds.table = table.drop_columns([f.column])
                release_memory()
            false_string = getattr(f.params, "false_strings", ("false",))[0]
            if meta_in is None:
                fill = compute_fill(col.filter(fit_mask) if fit_mask is not None else col,
                                    f.missing_value_strategy, f.fill_value, f.type, false_string)
            else:
                fill = meta_in[f.name].get("preprocessing", {}).get("computed_fill_value")
            col = columns[f.name] = apply_fill(col, f.missing_value_strategy, fill, f.type)
            if meta_in is None:
                metas[f.name] = _fit(h, f, col.filter(fit_mask) if fit_mask is not None else col, ctx, fill)
            else:
                metas[f.name] = dict(meta_in[f.name])

        if save:
            assert hdf5_path is not None and meta_path is not None
            meta_path.unlink(missing_ok=True)  # the old pair is no longer trusted from here on
            import h5py

            with atomic_path(hdf5_path) as tmp, h5py.File(tmp, "w") as f5:
                f5.attrs["format"] = META_FORMAT
                f5.attrs["run_id"] = run_id
                writer = H5Writer(f5, n)
                blocks = list(_blocks(n))
                done = _in_order(lambda b: list(_transform_block(features, handlers, columns, metas, ds, *b)), blocks)
                bar = progress(blocks, total=len(blocks), desc="transform") if len(blocks) > 1 else blocks
                for (lo, hi), arrays in zip(bar, done):
                    for key, value in arrays:
                        writer.write(key, value)
                    del arrays
                    if split is not None:
                        writer.write("split", split[lo:hi])
        else:
            out_data = dict(_transform_block(features, handlers, columns, metas, ds, 0, n))
            if split is not None:
                out_data["split"] = split

    header: dict[str, Any] = {
        "format": META_FORMAT, "version": _version(), "fingerprint": fp, "config": cfg.to_dict(),
        "config_fingerprint": fingerprint_obj(cfg.to_dict()), "num_rows": n, "source": ds.name,
    }
    if meta_in is not None:
        header["applied_metadata"] = meta_in[HEADER].get("fingerprint")
    if split is not None:
        header["split"] = {name: int((split == i).sum()) for i, name in enumerate(SPLIT_NAMES)}
    document = {HEADER: header, **metas}
    if save:
        assert hdf5_path is not None and meta_path is not None
        st = hdf5_path.stat()
        header["input_fingerprint"] = fp_input
        header["hdf5"] = {"name": hdf5_path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "run_id": run_id}
        with atomic_write(meta_path) as fh:
            json.dump(document, fh, ensure_ascii=False)
    return Preprocessed(Metadata(document), hdf5_path, meta_path, False, n, time.perf_counter() - start, out_data)


@contextmanager
def _original_rows(kept: np.ndarray[Any, Any] | None, line_offset: int | None) -> Iterator[None]:
    """After ``drop_row``, re-raise data errors with the line/row of the original file."""
    try:
        yield
    except DataFileError as exc:
        if kept is None or (exc.line is None and exc.row is None) or exc.uid is not None:
            raise
        local = exc.line - (line_offset or 0) if exc.line is not None else exc.row
        if local is None or not 0 <= local < len(kept):
            raise
        orig = int(kept[local])
        line, row = (orig + (line_offset or 0), None) if exc.line is not None else (None, orig)
        raise DataFileError(exc.msg, path=exc.path, line=line, row=row, column=exc.column,
                            hint=exc.hint) from exc


def _stem_and_dir(dataset: Any) -> tuple[str, Path]:
    from datamill.core.io import split_member

    path, member = split_member(dataset)
    name = Path(member).name if member else path.name
    for suffix in (".gz",):
        name = name.removesuffix(suffix)
    stem = name.rsplit(".", 1)[0] if "." in name else name
    return stem, path.parent


def _fit(h: FeatureHandler, f: ResolvedFeature, col: pa.Array, ctx: FeatureContext, fill: Any) -> dict[str, Any]:
    stats: Any = None

    def fit(block: tuple[int, int]) -> Any:
        lo, hi = block
        block_ctx = FeatureContext(ctx.name, ctx.column, ctx.path, ctx.base_dir, lo, ctx.line_offset)
        return h.fit(col.slice(lo, hi - lo), f.params, block_ctx)

    for s in _in_order(fit, list(_blocks(len(col)))):  # mergeable statistics, merged in block order
        stats = s if stats is None else h.merge(stats, s)
    meta = {"type": f.type, "column": f.column, "role": f.role, **h.finalize(stats, f.params, ctx)}
    meta["preprocessing"] = {**f.params.model_dump(mode="json"),
                             "missing_value_strategy": f.missing_value_strategy,
                             "computed_fill_value": fill}
    return meta


def _transform_block(features: list[ResolvedFeature], handlers: dict[str, FeatureHandler],
                     columns: dict[str, pa.Array], metas: dict[str, dict[str, Any]], ds: Any,
                     lo: int, hi: int) -> Iterator[tuple[str, np.ndarray[Any, Any] | CSR]]:
    """Transform rows ``lo:hi`` feature by feature (so a writer holds one feature's arrays at a time)."""
    keys: dict[str, str] = {"split": "the split"}
    for f in features:
        ctx = FeatureContext(f.name, f.column, ds.name, ds.base_dir, lo, ds.line_offset)
        arrays = handlers[f.name].transform(columns[f.name].slice(lo, hi - lo), metas[f.name], f.params, ctx)
        metas[f.name]["hdf5_keys"] = sorted(arrays)
        for key in arrays:
            if key in keys:
                raise ConfigError(f"features {keys[key]!r} and {f.name!r} both write the HDF5 key {key!r}; rename one")
            keys[key] = f.name
        yield from arrays.items()
        del arrays


def load(hdf5_path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray[Any, Any] | CSR], Metadata]:
    """Read a preprocessed ``<stem>.hdf5`` and its ``<stem>.meta.json``.

    Returns:
        (arrays keyed like the HDF5: feature names, ``<text>_char``/``_word``, ``split``; sparse
        set/bag as :class:`~datamill.preprocess.features.base.CSR`), :class:`Metadata`.

    Raises:
        DataFileNotFoundError: no such file. CacheError: metadata missing or from another run.

    Examples:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "pets.csv").write_text("kind,legs\\ncat,4\\nbird,2\\ncat,\\n")
        >>> cfg = {"input_features": [{"name": "kind", "type": "category"}, {"name": "legs", "type": "number"}]}
        >>> out = preprocess(d / "pets.csv", cfg)
        >>> data, meta = load(out.hdf5_path)
        >>> data["kind"].tolist(), meta.decode("kind", data["kind"]).tolist(), data["legs"].tolist()
        ([1, 2, 1], ['cat', 'bird', 'cat'], [4.0, 2.0, 0.0])
    """
    path = Path(hdf5_path)
    meta_path = path.with_name(path.name.removesuffix(HDF5_SUFFIX) + META_SUFFIX)
    data, attrs = read_hdf5(path)
    meta = read_meta(meta_path)
    if meta[HEADER].get("hdf5", {}).get("run_id") != attrs.get("run_id"):
        raise CacheError("the HDF5 file and its metadata come from different runs", path=meta_path,
                         hint="preprocess the dataset again")
    return data, Metadata(meta)
