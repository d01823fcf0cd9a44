"""``preprocess()`` and ``load()``: a dataset + config → ``<stem>.hdf5`` + ``<stem>.meta.json``.

:func:`preprocess` is the one-call form of the pipeline in :mod:`datamill.preprocessing.pipeline`:
``plan`` → (cache check) → read → ``prepare`` → ``fit`` → ``finalize`` → ``transform`` into a sink,
run by a :class:`~datamill.preprocessing.executors.LocalExecutor` (ordered worker threads,
``DATAMILL_THREADS``).

Cache: ``meta.json`` records ``fingerprint = chain(content hash of the input, TRANSFORM_VERSION,
{config, version, applied metadata}, stats of the image files an image feature reads)`` and the
HDF5's size/mtime/run id/content hash. A rerun with the same input content, images and config, whose
HDF5 still has the recorded content, returns the existing files without recomputing; anything else
recomputes. A new pair is written beside the old one and switched with renames, ``meta.json`` last
(:class:`~datamill.preprocessing.sinks.HDF5Sink`), so an interrupted run keeps the previous pair.
Output files that exist and are not a datamill preprocessing output (or are the input) are refused.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from datamill.core.checks import check_path
from datamill.core.constants import HDF5_SUFFIX, META_SUFFIX
from datamill.core.errors import CacheError, ConfigError
from datamill.core.fingerprint import fingerprint_file
from datamill.core.io import check_output, is_datamill_output
from datamill.core.objstore import fetch_input
from datamill.core.storage import scheme_of
from datamill.engines import LOCAL, check_engine, engine_job
from datamill.preprocessing.binding import with_image_files
from datamill.preprocessing.config import PreprocessConfig
from datamill.preprocessing.executors import LocalExecutor
from datamill.preprocessing.features.base import CSR
from datamill.preprocessing.hdf5 import read_hdf5
from datamill.preprocessing.meta import HEADER, Metadata, read_meta
from datamill.preprocessing.pipeline import cached, plan, run
from datamill.preprocessing.plans import Plan
from datamill.preprocessing.result import Preprocessed
from datamill.preprocessing.sinks import HDF5Sink, MemorySink, recover_interrupted_switch
from datamill.tables.read import is_table_url, local_copy

__all__ = ["Metadata", "Preprocessed", "load", "preprocess"]


def _guarded(p: Plan, dataset: Any, *, inputs: tuple[Any, ...], overwrite: bool) -> Plan:
    """Refuse output paths that hold a user's file or an input, repair an interrupted switch, and
    key the cache on the image files too."""
    if p.hdf5_path is None or p.meta_path is None:
        return p
    paths = [x for x in inputs if isinstance(x, (str, os.PathLike))]
    for path, what in (
        (p.hdf5_path, "preprocessed HDF5"),
        (p.meta_path, "preprocessing meta.json"),
    ):
        check_output(
            path, is_own=_is_preprocess_output, inputs=paths, what=what, overwrite=overwrite
        )
    recover_interrupted_switch(p.hdf5_path, p.meta_path)
    return with_image_files(p, dataset)


def _on_engine(
    engine: str,
    dataset: Any,
    config: Any,
    *,
    output_dir: Any,
    skip_save: bool,
    metadata: Any,
    overwrite: bool,
    options: dict[str, Any],
) -> Preprocessed:
    """Dispatch to another engine (``"ray"``: the optional :mod:`datamill.ray`, found through
    :mod:`datamill.engines`)."""
    check_engine(engine)
    if engine == LOCAL:
        raise ConfigError("engine_options apply to engine='ray' only")
    if skip_save:
        raise ConfigError(
            "skip_save is not supported with engine='ray' (it writes a shardset dataset)"
        )
    result: Preprocessed = engine_job(engine, "preprocess")(
        dataset, config, output_dir=output_dir, metadata=metadata, overwrite=overwrite, **options
    )
    return result


def _local_input(dataset: Any, output_dir: str | os.PathLike[str] | None) -> tuple[Any, Any]:
    """An ``s3://`` input becomes a checked local copy (:func:`~datamill.core.objstore.fetch_input`:
    downloaded once, reused while the object's size, mtime and ETag hold; the preprocessing cache
    key hashes the content), written by default to the current folder; anything else is
    unchanged."""
    if is_table_url(dataset):  # delta:// iceberg:// lance://: the version as one local Parquet
        return local_copy(os.fspath(dataset)), Path.cwd() if output_dir is None else output_dir
    # scheme_of, not is_remote: an unregistered scheme:// is refused, as shards and the loader do
    if isinstance(dataset, (str, os.PathLike)) and scheme_of(dataset).remote:
        return fetch_input(os.fspath(dataset)), Path.cwd() if output_dir is None else output_dir
    return dataset, output_dir


def preprocess(
    dataset: Any,
    config: PreprocessConfig | dict[str, Any] | str | os.PathLike[str] | None = None,
    *,
    output_dir: str | os.PathLike[str] | None = None,
    skip_save: bool = False,
    metadata: str | os.PathLike[str] | Metadata | dict[str, Any] | None = None,
    engine: str = "local",
    engine_options: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Preprocessed:
    """Preprocess ``dataset`` with a Ludwig-shaped ``config`` into tensors + metadata.

    Args:
        dataset: a CSV/TSV/Parquet/JSONL path (``archive.zip:member``, ``s3://…``), a DataFrame or
            an Arrow Table.
        config: config model, dict, or YAML/JSON path. Defaults to ``None`` (``metadata``'s config).
        output_dir: where ``<stem>.hdf5`` / ``<stem>.meta.json`` go. Defaults to ``None`` (beside
            the input).
        skip_save: compute in memory only, write nothing. Defaults to ``False``.
        metadata: a ``meta.json`` (path, :class:`Metadata` or dict) applied to unseen data (nothing
            refitted, no split). Defaults to ``None``.
        engine: ``"local"`` or ``"ray"`` (:func:`datamill.ray.preprocess`). Defaults to ``"local"``.
        engine_options: the engine's keyword arguments (Ray: ``address``, ``fmt``...). Defaults to
            ``None``.
        overwrite: also replace another kind of datamill output (never a user's file). Defaults to
            ``False``.

    Returns:
        :class:`Preprocessed` (``.data`` tensors, ``.metadata``, paths, ``.cached``).

    Raises:
        ConfigError: invalid config. SchemaError: a configured column is missing. OutputError: a
            full disk.
        DataFileError: unreadable input or value (located), or an output path holding a user's file.

    Examples:
        >>> import pyarrow as pa
        >>> t = pa.table({"color": ["red", "blue", "red", None], "size": [1.0, 2.0, 3.0, None]})
        >>> cfg = {
        ...     "input_features": [
        ...         {"name": "color", "type": "category"},
        ...         {
        ...             "name": "size",
        ...             "type": "number",
        ...             "preprocessing": {
        ...                 "normalization": "minmax",
        ...                 "missing_value_strategy": "fill_with_mean",
        ...             },
        ...         },
        ...     ],
        ...     "preprocessing": {"split": {"type": "none"}},
        ... }  # default: Ludwig's random 0.7/0.1/0.2
        >>> out = preprocess(t, cfg)
        >>> out.data["color"].tolist(), out.data["size"].tolist()
        ([1, 2, 1, 0], [0.0, 0.5, 1.0, 0.5])
        >>> out.metadata.decode("color", out.data["color"]).tolist()
        ['red', 'blue', 'red', '<UNK>']
    """
    if engine_options is not None and not isinstance(engine_options, dict):
        raise ConfigError(
            f"engine_options must be a dict of the engine's keyword arguments, "
            f"got {type(engine_options).__name__}",
            hint="e.g. engine='ray', engine_options={'address': 'auto'}",
        )
    if engine != "local" or engine_options:  # (Ray reads s3:// URIs on its nodes itself)
        return _on_engine(
            engine,
            dataset,
            config,
            output_dir=output_dir,
            skip_save=skip_save,
            metadata=metadata,
            overwrite=overwrite,
            options=engine_options or {},
        )
    start, (dataset, output_dir) = (
        time.perf_counter(),
        _local_input(dataset, output_dir),
    )  # s3:// -> local copy
    p = _guarded(
        plan(config, dataset, metadata=metadata, output_dir=output_dir, skip_save=skip_save),
        dataset,
        inputs=(dataset, config, metadata),
        overwrite=overwrite,
    )
    hit = _verified(p, cached(p))
    if hit is not None:
        return Preprocessed(
            hit,
            p.hdf5_path,
            p.meta_path,
            True,
            int(hit.header["num_rows"]),
            time.perf_counter() - start,
        )
    sink = HDF5Sink(p.hdf5_path, p.meta_path) if p.hdf5_path and p.meta_path else MemorySink()
    meta = run(p, dataset, executor=LocalExecutor(), sink=sink)
    data = sink.data if isinstance(sink, MemorySink) else None
    return Preprocessed(
        meta,
        p.hdf5_path,
        p.meta_path,
        False,
        int(meta.header["num_rows"]),
        time.perf_counter() - start,
        data,
    )


def _is_preprocess_output(path: Path) -> bool:
    return (
        path.is_file()
        and is_datamill_output(path)
        and path.name.endswith((HDF5_SUFFIX, META_SUFFIX))
    )


def _verified(p: Plan, hit: Metadata | None) -> Metadata | None:
    """A cache hit whose HDF5 still has the content recorded in its metadata (else a miss)."""
    if hit is None or p.hdf5_path is None:
        return hit
    recorded = hit.header.get("hdf5", {}).get("xxh3")
    try:
        return hit if recorded is not None and fingerprint_file(p.hdf5_path) == recorded else None
    except (OSError, CacheError):
        return None


def load(
    hdf5_path: str | os.PathLike[str],
) -> tuple[dict[str, np.ndarray[Any, Any] | CSR], Metadata]:
    """Read a preprocessed ``<stem>.hdf5`` and its ``<stem>.meta.json``.

    Returns:
        (arrays keyed like the HDF5: feature names, ``<text>_char``/``_word``, ``split``; sparse
        set/bag as :class:`~datamill.preprocessing.features.base.CSR`), :class:`Metadata`.

    Raises:
        DataFileNotFoundError: no such file. CacheError: metadata missing or from another run.

    Examples:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "pets.csv").write_text("kind,legs\\ncat,4\\nbird,2\\ncat,\\n")
        >>> cfg = {"input_features": [{"name": "kind", "type": "category"},
        ...        {"name": "legs", "type": "number", "preprocessing": {"normalization": None}}],
        ...        "preprocessing": {"split": {"type": "none"}}}
        >>> out = preprocess(d / "pets.csv", cfg)
        >>> data, meta = load(out.hdf5_path)
        >>> data["kind"].tolist(), meta.decode("kind", data["kind"]).tolist(), data["legs"].tolist()
        ([1, 2, 1], ['cat', 'bird', 'cat'], [4.0, 2.0, 0.0])
    """
    path = Path(check_path(hdf5_path, name="hdf5_path"))
    meta_path = path.with_name(path.name.removesuffix(HDF5_SUFFIX) + META_SUFFIX)
    recover_interrupted_switch(path, meta_path)  # a run killed between its two renames
    data, attrs = read_hdf5(path)
    meta = read_meta(meta_path)
    if meta[HEADER].get("hdf5", {}).get("run_id") != attrs.get("run_id"):
        raise CacheError(
            "the HDF5 file and its metadata come from different runs",
            path=meta_path,
            hint="preprocess the dataset again",
        )
    return data, Metadata(meta)
