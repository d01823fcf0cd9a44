"""Preprocessing as a pipeline: ``plan`` → ``prepare`` → ``fit`` → ``finalize`` → ``transform`` →
sink.

* :func:`plan` resolves the config (features, columns and input types wanted, split, seed), the
  applied metadata, the cache fingerprint and the output paths: everything decided before reading.
* :func:`prepare` turns one block of the input table (and its global row offset) into a
  :class:`Block`: split ids, ``drop_row`` rows removed, each feature's column cast.
* :func:`fit` runs two passes over the blocks through an
  :class:`~datamill.preprocessing.executors.Executor`:
  the missing-value statistics (mean, mode, the ``bfill``/``ffill`` edge values), then with the
  blocks filled, every handler's mergeable ``fit``; results are merged in block order →
  :class:`Stats`.
* :func:`finalize` turns the statistics into the :class:`~datamill.preprocessing.meta.Metadata`
  document.
* :func:`transform` maps one block to its output arrays; a
  :class:`~datamill.preprocessing.sinks.Sink` receives them in order (:func:`run` drives the whole
  for one machine).

Every per-block function is a picklable pure function of (plan, block, explicit carried state), so
a distributed executor runs the same code on blocks held elsewhere. The carried state is explicit:
the fill values, the values ``ffill``/``bfill`` carry across block boundaries
(:class:`~datamill.preprocessing.missing.Carry`), and, when the executor keeps them, each block's
tokens from ``fit`` for its ``transform``.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.constants import HDF5_SUFFIX, META_FORMAT, META_SUFFIX
from datamill.core.errors import CacheError, ConfigError, DataFileError
from datamill.core.fingerprint import chain, fingerprint_bytes, fingerprint_file, fingerprint_obj
from datamill.core.io import display_name, split_member
from datamill.core.progress import progress
from datamill.preprocessing.applied import check_applied
from datamill.preprocessing.balance import balance_copies
from datamill.preprocessing.binding import bind, pre_columns
from datamill.preprocessing.config import (
    PreprocessConfig,
    ResolvedFeature,
    SplitConfig,
    load_config,
    resolve_features,
)
from datamill.preprocessing.executors import Executor
from datamill.preprocessing.features import CSR, FeatureContext, handler_class
from datamill.preprocessing.fitting import _filled, fit
from datamill.preprocessing.meta import HEADER, Metadata, read_meta
from datamill.preprocessing.missing import (
    Carry,
)
from datamill.preprocessing.plans import Block, Origin, Plan, Stats
from datamill.preprocessing.reading import as_table, cast_column, read_dataset
from datamill.preprocessing.sinks import Sink
from datamill.preprocessing.split import (
    SPLIT_NAMES,
    assign_split,
    sample_mask,
)

__all__ = [
    "BLOCK_ROWS",
    "TRANSFORM_VERSION",
    "Block",
    "Origin",
    "Plan",
    "Stats",
    "bind",
    "cached",
    "finalize",
    "fit",
    "plan",
    "prepare",
    "run",
    "transform",
]  # Block, Origin, Plan, Stats: from plans

#: the version of what preprocessing outputs, part of the cache fingerprint (@2: block-wise random
# split; : @3: Ludwig's defaults: a default split with exact sizes, zscore inputs, drop_row outputs,
# stripped tokens; @4: Ludwig's hash split and sample rows)
TRANSFORM_VERSION = "datamill.preprocess@4"
#: rows per block (fit statistics are merged across blocks)
BLOCK_ROWS = (
    1 << 16
)  # 64k rows: bounded transform temporaries (1<<19 tripled peak RSS on text at 600k rows)


def _version() -> str:
    from datamill.core.constants import VERSION as __version__

    return __version__


def _input_fingerprint(dataset: Any) -> str:
    if isinstance(dataset, (str, os.PathLike)):
        return fingerprint_file(dataset)
    table = as_table(dataset)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return fingerprint_bytes(sink.getvalue())


def _stem_and_dir(dataset: Any) -> tuple[str, Path]:
    path, member = split_member(dataset)
    name = (Path(member).name if member else path.name).removesuffix(".gz")
    return (name.rsplit(".", 1)[0] if "." in name else name), path.parent


def plan(
    config: PreprocessConfig | dict[str, Any] | str | os.PathLike[str] | None,
    dataset: Any,
    *,
    metadata: str | os.PathLike[str] | Metadata | dict[str, Any] | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    skip_save: bool = False,
) -> Plan:
    """Resolve a config (or the one recorded in ``metadata``) for ``dataset`` into a :class:`Plan`.

    Args and their defaults are those of :func:`datamill.preprocessing.api.preprocess`; nothing is
    read but the config, the metadata and (when saving) the input's fingerprint.

    Raises:
        ConfigError: invalid or missing config, or a feature the applied metadata lacks.

    Examples:
        >>> p = plan(
        ...     {"input_features": [{"name": "x", "type": "number"}]}, "data.csv", skip_save=True
        ... )
        >>> p.wanted, p.hdf5_path, p.block_ranges(70_000)
        ({'x': 'float64'}, None, [(0, 65536), (65536, 70000)])
    """
    config, applied, applied_name = _recorded_config(config, metadata)
    if config is None:
        raise ConfigError("a config is required (or metadata= of an earlier run)")
    cfg, cfg_source = load_config(config)
    features = tuple(resolve_features(cfg, cfg_source))
    split = None
    if applied is not None:
        check_applied(applied, features, path=applied_name)
    else:
        _check_balancing(cfg, features, cfg_source)
        split = cfg.preprocessing.split or SplitConfig()  # Ludwig's default: random 0.7/0.1/0.2
        split = None if split.type == "none" else split
    optional = tuple(f.column for f in features if applied is not None and f.role == "output")
    in_memory = not isinstance(dataset, (str, os.PathLike))
    p = Plan(
        cfg,
        cfg_source,
        features,
        _wanted(features, split),
        split,
        cfg.preprocessing.seed,
        applied,
        None if in_memory else display_name(dataset),
        block_rows=BLOCK_ROWS,
        optional=optional,
    )
    if skip_save or (in_memory and output_dir is None):
        return p
    return _with_outputs(p, dataset, output_dir)


def _recorded_config(
    config: PreprocessConfig | dict[str, Any] | str | os.PathLike[str] | None,
    metadata: str | os.PathLike[str] | Metadata | dict[str, Any] | None,
) -> tuple[Any, dict[str, Any] | None, str]:
    """``(config, applied metadata, its name)``: the config is the one ``metadata`` records when
    ``config`` is None.

    Raises:
        ConfigError: neither ``config`` nor ``metadata`` holds a config.
    """
    name = display_name(metadata) if isinstance(metadata, (str, os.PathLike)) else "<metadata>"
    if metadata is None:
        return config, None, name
    applied = (
        metadata.to_dict()
        if isinstance(metadata, Metadata)
        else metadata
        if isinstance(metadata, dict)
        else read_meta(metadata)
    )
    if config is None and not isinstance(applied.get(HEADER, {}).get("config"), dict):
        raise ConfigError("the metadata records no config; pass --config", path=name)
    return (applied[HEADER]["config"] if config is None else config), applied, name


def _wanted(features: tuple[Any, ...], split: SplitConfig | None) -> dict[str, str]:
    """Input column → the type it is read as (``"raw"``: features of two input types share it)."""
    wanted: dict[str, str] = {}
    for f in features:
        t = handler_class(f.type).input_type
        wanted[f.column] = t if wanted.get(f.column, t) == t else "raw"
    if split is not None and split.split_column is not None:
        wanted.setdefault(split.split_column, "string")
    return wanted


def _check_balancing(
    cfg: PreprocessConfig, features: tuple[Any, ...], cfg_source: str | None
) -> None:
    """Class balancing needs an output feature (its classes are balanced)."""
    glob = cfg.preprocessing
    if (glob.oversample_minority or glob.undersample_majority) and not any(
        f.role == "output" for f in features
    ):
        raise ConfigError(
            "preprocessing: oversample_minority/undersample_majority balance the classes of the "
            "first output feature; the config has none",
            path=cfg_source,
        )


def _with_outputs(p: Plan, dataset: Any, output_dir: str | os.PathLike[str] | None) -> Plan:
    """``p`` with its fingerprint and output paths (beside the input, or in ``output_dir``)."""
    fp_input = _input_fingerprint(dataset)
    applied = p.applied
    fp = chain(
        fp_input,
        TRANSFORM_VERSION,
        {
            "config": p.config.to_dict(),
            "version": _version(),
            "metadata": fingerprint_obj({k: v for k, v in applied.items() if k != HEADER})
            if applied
            else None,
        },
    )
    in_memory = not isinstance(dataset, (str, os.PathLike))
    stem, base = _stem_and_dir(dataset) if not in_memory else ("dataset", Path())
    out_dir = Path(output_dir) if output_dir is not None else base
    return replace(
        p,
        fingerprint=fp,
        input_fingerprint=fp_input,
        hdf5_path=out_dir / f"{stem}{HDF5_SUFFIX}",
        meta_path=out_dir / f"{stem}{META_SUFFIX}",
    )


def cached(p: Plan) -> Metadata | None:
    """The metadata of a saved output that matches ``p`` exactly (fingerprint, HDF5 size and mtime),
    else None."""
    if p.hdf5_path is None or p.meta_path is None:
        return None
    try:
        data = read_meta(p.meta_path)
        h = data[HEADER]
        st = p.hdf5_path.stat()
        if (
            h["fingerprint"] == p.fingerprint
            and h["hdf5"]["size"] == st.st_size
            and h["hdf5"]["mtime_ns"] == st.st_mtime_ns
        ):
            return Metadata(data)
    except (CacheError, OSError, KeyError, TypeError):
        return None
    return None


def prepare(p: Plan, origin: Origin, item: tuple[int, int, pa.Table]) -> Block:
    """Block ``index`` of the input (``table``: its rows, ``lo``: the global row of the first) →
    :class:`Block`.

    Raises:
        DataFileError: a bad split value or an unparsable number (file, line/row, column named).
    """
    index, lo, table = item
    n = table.num_rows
    table = _blank_images_missing(p, table)
    split = _block_split(p, origin, lo, table)
    rows = None
    drop = list(
        dict.fromkeys(f.column for f in p.features if f.missing_value_strategy == "drop_row")
    )
    cut = p.sample_cut if p.sample_cut is not None else np.inf
    if drop or cut != np.inf or p.balance is not None:
        keep = sample_mask(p.seed, lo, lo + n, cut, num_rows=p.sample_rows)
        for column in drop:
            keep &= ~np.asarray(table[column].is_null().to_numpy(zero_copy_only=False), dtype=bool)
        copies = keep.astype(np.int64)
        if p.balance is not None:
            copies *= balance_copies(p.balance, table[p.balance.column], split, seed=p.seed, lo=lo)
        take = np.repeat(np.arange(n, dtype=np.int64), copies)
        table = table.take(pa.array(take))
        split = split[take] if split is not None else None
        rows = lo + take
    columns = {
        f.name: cast_column(
            table[f.column],
            handler_class(f.type).input_type,
            name=origin.path,
            column=f.column,
            line_offset=origin.line_offset,
            row_offset=lo,
            rows=rows,
        )
        for f in p.features
    }
    return Block(index, lo, table.num_rows, columns, split, rows, origin)


def _blank_images_missing(p: Plan, table: pa.Table) -> pa.Table:
    """``table`` with its blank image paths null: an empty path is a missing image."""
    for column in sorted({f.column for f in p.features if f.type == "image"}):
        c = table[column]
        if pa.types.is_string(c.type) or pa.types.is_large_string(c.type):
            blank = pc.equal(pc.utf8_trim_whitespace(c), "")
            table = table.set_column(
                table.column_names.index(column),
                column,
                pc.if_else(blank, pa.scalar(None, c.type), c),
            )
    return table


def _block_split(p: Plan, origin: Origin, lo: int, table: pa.Table) -> NDArray[np.int8] | None:
    """The split of each row of the block whose first row is ``lo`` (None: no split)."""
    if p.split is None:
        return None
    if p.split_state is None:
        raise ConfigError(
            "internal: the plan's split is not bound to the input (call pipeline.bind first)"
        )
    col = table[p.split.split_column] if p.split.split_column is not None else None
    return assign_split(
        p.split,
        p.split_state,
        seed=p.seed,
        lo=lo,
        hi=lo + table.num_rows,
        column=col,
        path=origin.path,
        line_offset=origin.line_offset,
    )


def finalize(p: Plan, stats: Stats) -> Metadata:
    """The metadata document: every feature's finalized metadata (or the applied one) and the
    header.

    Raises:
        ConfigError: two features write the same output key.

    Examples:
        >>> from datamill.preprocessing.executors import LocalExecutor
        >>> p = plan({"input_features": [{"name": "c", "type": "category",
        ...           "preprocessing": {"missing_value_strategy": "ffill"}}],
        ...           "preprocessing": {"split": {"type": "none"}}}, pa.table({}))
        >>> blocks = [prepare(p, Origin(None, None, None), (0, 0, pa.table({"c": ["a", "b"]}))),
        ...           prepare(p, Origin(None, None, None), (1, 2, pa.table({"c": [None, "b"]})))]
        >>> st = fit(p, blocks, executor=LocalExecutor(threads=1), keep_tokens=False)
        >>> meta = finalize(p, st)
        >>> meta["c"]["idx2str"], meta["c"]["hdf5_keys"], meta.header["num_rows"]
        (['<UNK>', 'b', 'a'], ['c'], 4)
    """
    metas: dict[str, Any] = {}
    owners = {"split": "the split"}
    o = stats.origin
    for f in p.features:
        h = handler_class(f.type)()
        if p.applied is not None:
            meta = dict(p.applied[f.name])
        else:
            ctx = FeatureContext(f.name, f.column, o.path, o.base_dir, 0, o.line_offset)
            meta = {
                "type": f.type,
                "column": f.column,
                "role": f.role,
                **h.finalize(stats.features[f.name], f.params, ctx),
            }
            meta["preprocessing"] = {
                **f.params.model_dump(mode="json"),
                **meta.get("preprocessing", {}),  # what the handler stores as Ludwig does
                "missing_value_strategy": f.missing_value_strategy,
                "computed_fill_value": stats.fills[f.name],
            }
        meta["hdf5_keys"] = h.keys(f.name, f.params)
        for key in meta["hdf5_keys"]:
            if key in owners:
                raise ConfigError(
                    f"features {owners[key]!r} and {f.name!r} both write the HDF5 key {key!r}; "
                    "rename one"
                )
            owners[key] = f.name
        metas[f.name] = meta
    cfg = p.config.to_dict()
    header: dict[str, Any] = {
        "format": META_FORMAT,
        "version": _version(),
        "fingerprint": p.fingerprint,
        "config": cfg,
        "config_fingerprint": fingerprint_obj(cfg),
        "num_rows": stats.num_rows,
        "source": p.source,
    }
    if p.applied is not None:
        header["applied_metadata"] = p.applied[HEADER].get("fingerprint")
    if stats.split_counts is not None:
        header["split"] = dict(zip(SPLIT_NAMES, stats.split_counts))
    if p.input_fingerprint is not None:
        header["input_fingerprint"] = p.input_fingerprint
    return Metadata({HEADER: header, **metas})


def transform(
    p: Plan,
    block: Block,
    meta: Metadata,
    *,
    carry: dict[str, Carry] | None = None,
    tokens: dict[str, Any] | None = None,
) -> dict[str, NDArray[Any] | CSR]:
    """One block's output arrays (feature keys in config order, then ``split``).

    ``carry``: the block's ``ffill``/``bfill`` carries from :func:`fit` (``Stats.carries[i]``);
    ``tokens``: its tokens from :func:`fit` (``Stats.tokens[i]``), else the block is tokenised here.

    Examples:
        >>> from datamill.preprocessing.executors import LocalExecutor
        >>> p = plan({"input_features": [{"name": "c", "type": "category",
        ...           "preprocessing": {"missing_value_strategy": "ffill"}}],
        ...           "preprocessing": {"split": {"type": "none"}}}, pa.table({}))
        >>> blocks = [prepare(p, Origin(None, None, None), (0, 0, pa.table({"c": ["a", "b"]}))),
        ...           prepare(p, Origin(None, None, None), (1, 2, pa.table({"c": [None, "b"]})))]
        >>> st = fit(p, blocks, executor=LocalExecutor(threads=1), keep_tokens=False)
        >>> transform(p, blocks[1], finalize(p, st), carry=st.carries[1])[
        ...     "c"
        ... ].tolist()  # "b" carried in
        [1, 1]
    """
    out: dict[str, NDArray[Any] | CSR] = {}
    for f in p.features:
        h = handler_class(f.type)()
        fm = meta[f.name]
        t = tokens.get(f.name) if tokens else None
        if t is None:
            fill = fm.get("preprocessing", {}).get("computed_fill_value")
            t = _filled(f, h, block, fill, (carry or {}).get(f.name))
        out.update(h.transform(t, fm, f.params, block.context(f)))
    if block.split is not None:
        out["split"] = block.split
    return out


def _transform_item(
    p: Plan, meta: Metadata, item: tuple[Block, dict[str, Carry], dict[str, Any] | None]
) -> dict[str, NDArray[Any] | CSR]:
    block, carry, tokens = item
    return transform(p, block, meta, carry=carry, tokens=tokens)


def _warn_inf(f: ResolvedFeature, blocks: list[Block], name: str) -> None:
    """Warn when the zscore-normalized number feature ``f`` meets inf (for
    :func:`warn_dubious_rows`'s caller)."""
    infs = sum(
        int(pc.sum(pc.is_inf(b.columns[f.name])).as_py() or 0)
        for b in blocks
        if f.name in b.columns and pa.types.is_floating(b.columns[f.name].type)
    )
    if infs:
        warnings.warn(
            f'{name}, column "{f.column}": {infs:,} inf values under zscore normalization stay '
            "inf (the statistics skip them); clip them or mark them missing",
            UserWarning,
            stacklevel=4,
        )


def warn_dubious_rows(p: Plan, blocks: list[Block], num_rows: int, name: str | None) -> None:
    """Warn (once each) when ``drop_row`` removed every row, the split gave no training rows, or
    zscore meets inf."""
    name = name or "<table>"
    for f in p.features:
        if f.type == "number" and getattr(f.params, "normalization", None) == "zscore":
            _warn_inf(f, blocks, name)
    kept = sum(b.num_rows for b in blocks)
    if kept == 0:
        cols = sorted({f.column for f in p.features if f.missing_value_strategy == "drop_row"})
        warnings.warn(
            f"{name}: missing_value_strategy drop_row removed all {num_rows:,} rows (columns "
            f"{cols} are "
            "empty in every row); the output is empty",
            UserWarning,
            stacklevel=3,
        )
        return
    if p.applied is None and p.split is not None:
        train = sum(int(np.count_nonzero(b.split == 0)) for b in blocks if b.split is not None)
        if train == 0:
            warnings.warn(
                f"{name}: the split leaves no training rows ({kept:,} rows); vocabularies and "
                "statistics are fitted on nothing",
                UserWarning,
                stacklevel=3,
            )


def run(p: Plan, dataset: Any, *, executor: Executor, sink: Sink) -> Metadata:
    """Read ``dataset`` and run the whole pipeline on this machine, writing to ``sink`` (committed
    last).

    Raises:
        DataFileError: unreadable input, no rows, a value that does not parse. SchemaError: a column
            is missing.
    """
    ds = read_dataset(dataset, p.wanted, optional=p.optional, fmt=p.config.preprocessing.format)
    num_rows = ds.table.num_rows
    if num_rows == 0:
        raise DataFileError("the dataset has a header but no rows", path=ds.name)
    p = bind(p, num_rows, {c: ds.table[c] for c in pre_columns(p) if c in ds.table.column_names})
    origin = Origin(ds.name, ds.base_dir, ds.line_offset)
    ranges = p.block_ranges(num_rows)
    slices = [(i, lo, ds.table.slice(lo, hi - lo)) for i, (lo, hi) in enumerate(ranges)]
    ds.table = pa.table({})
    blocks: list[Block | None] = list(executor.map_ordered(partial(prepare, p, origin), slices))
    del slices
    warn_dubious_rows(p, [b for b in blocks if b is not None], num_rows, ds.name)
    stats = fit(p, [b for b in blocks if b is not None], executor=executor)
    meta = finalize(p, stats)

    def items() -> Iterator[tuple[Block, dict[str, Carry], dict[str, Any] | None]]:
        for i, block in enumerate(blocks):  # handed over one by one, so written blocks are freed
            assert block is not None
            blocks[i] = None
            yield block, stats.carries[i], stats.tokens[i] if stats.tokens else None
            if stats.tokens:
                stats.tokens[i] = {}

    sink.open(p, stats.num_rows)
    try:
        done = executor.map_ordered(partial(_transform_item, p, meta), items())
        bar = (
            progress(range(len(ranges)), total=len(ranges), desc="transform")
            if len(ranges) > 1
            else range(1)
        )
        lo = 0
        for i, arrays in zip(bar, done):
            n = len(next(iter(arrays.values()))) if arrays else 0
            sink.write(i, lo, lo + n, arrays)
            lo += n
            del arrays
        sink.commit(meta.to_dict())
    except BaseException:
        sink.abort()
        raise
    return meta
