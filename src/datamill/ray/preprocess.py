"""``preprocess(..., engine="ray")``: the preprocessing pipeline on a Ray cluster, same output as
one machine.

Steps (driver ↔ workers):

1. plan on the driver (:func:`~datamill.preprocessing.pipeline.plan`: config, applied metadata,
   fingerprint) and read the input into a Ray Dataset (a task per CSV/Parquet file, ``read_json``);
2. one task per *global* block (the local engine's ``BLOCK_ROWS`` rows) prepares it from the Ray
   blocks it overlaps (:mod:`datamill.ray._blocks`); prepared blocks stay in the object store;
3. :func:`~datamill.preprocessing.pipeline.fit` runs unchanged through
   :class:`~datamill.ray._blocks.RayExecutor`:
   per-block statistics on the workers, merged on the driver in block order, so vocabularies, fill
   values and normalisation are bit-identical to the local engine's; then ``finalize``;
4. one task per block transforms it (images are read there) and writes shard ``k`` of a shardset
   dataset through a picklable :class:`~datamill.shards.ShardsetWriter` sink; the driver commits
   (validate, rename, ``dataset.json`` last), optionally assembles the single HDF5 from the
   blocks in order, and writes ``<stem>.meta.json`` last.

Output in ``output_dir`` (default: beside the input): ``<stem>.shards/`` (a shardset dataset: UID
column = the input row index, or ``uid_column``; shardset ``features``; one shard per block),
``<stem>.meta.json`` and, with ``fmt="hdf5"``, ``<stem>.hdf5``. As with the local engine, the new
output is written beside the previous one and switched with renames, ``meta.json`` last
(:mod:`datamill.ray._output`): a failed or killed run leaves the previous output as it was, and the
next run removes what it left. A rerun whose inputs' content, config, applied metadata, image files
and UID column match the saved output returns it without starting Ray (``cached=True``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.constants import HDF5_SUFFIX, META_SUFFIX
from datamill.core.errors import ConfigError, DataFileError, DatamillError
from datamill.core.faults import fault_point
from datamill.core.fingerprint import chain, fingerprint_file, fingerprint_obj
from datamill.core.io import atomic_write
from datamill.preprocessing.binding import pre_columns, with_image_files
from datamill.preprocessing.features.base import CSR
from datamill.preprocessing.meta import HEADER, Metadata
from datamill.preprocessing.missing import Carry
from datamill.preprocessing.pipeline import (
    TRANSFORM_VERSION,
    bind,
    finalize,
    fit,
    plan,
    transform,
)
from datamill.preprocessing.plans import Block, Plan, Stats
from datamill.preprocessing.result import Preprocessed
from datamill.preprocessing.sinks import HDF5Sink
from datamill.ray._blocks import BlockHandle, RayExecutor, prepare_blocks, window
from datamill.ray._input import Input, read, resolve_input
from datamill.ray._output import (
    SHARDSET,
    cached_output,
    dataset_stamp,
    prepare_outputs,
    switch_back,
    switch_in,
    tmp_root,
)
from datamill.ray._runtime import MAX_RETRIES, Spread, connect, ordered_results, ray_module, unwrap
from datamill.ray._tables import arrays_to_table, table_to_arrays
from datamill.shards import ShardsetDataset, ShardsetWriter
from datamill.shards.writer import ShardSink

__all__ = ["FORMATS", "RayPreprocessed", "SHARDSET", "SHARDS_SUFFIX", "preprocess"]  # noqa: RUF022 - Python sorted() order (house rule)

FORMATS = ("shards", "hdf5")
SHARDS_SUFFIX = ".shards"


@dataclass
class RayPreprocessed(Preprocessed):
    """What the Ray engine returns: :class:`~datamill.preprocessing.api.Preprocessed` plus the
    shardset dataset."""

    dataset_path: Path | None = None
    uid_column: str = "uid"
    #: Ray node id of each block's prepare and transform task (in block order)
    nodes: list[tuple[str, str]] = field(default_factory=list)

    @property
    def data(self) -> dict[str, NDArray[Any] | CSR]:
        """The tensors, read back from the HDF5 when written, else from the shardset dataset."""
        if self._data is None and self.hdf5_path is None and self.dataset_path is not None:
            ds = ShardsetDataset(self.dataset_path)
            sizes = {
                key: int(m["vocab_size"])
                for m in self.metadata.to_dict().values()
                if isinstance(m, dict) and "vocab_size" in m
                for key in m.get("hdf5_keys", [])
            }
            parts = [
                table_to_arrays(ds.read_shard(k), uid=self.uid_column, vocab_sizes=sizes)
                for k in range(ds.num_shards)
            ]
            from datamill.preprocessing.sinks import MemorySink

            sink = MemorySink()
            for k, part in enumerate(parts):
                sink.write(k, 0, 0, part)
            sink.commit({})
            self._data = sink.data
        return super().data


def _multi_file_plan(p: Plan, inp: Input, output_dir: Path | None) -> Plan:
    from datamill.core.constants import VERSION as __version__

    fp_input = fingerprint_obj([fingerprint_file(f) for f in inp.files])
    fp = chain(
        fp_input,
        TRANSFORM_VERSION,
        {
            "config": p.config.to_dict(),
            "version": __version__,
            "metadata": fingerprint_obj({k: v for k, v in p.applied.items() if k != HEADER})
            if p.applied
            else None,
        },
    )
    src = Path(inp.origin.path or "dataset")
    stem = src.name.split("*")[0].rsplit(".", 1)[0] or "dataset"
    out = output_dir if output_dir is not None else (src.parent if src.name else Path())
    return replace(
        p,
        fingerprint=fp,
        input_fingerprint=fp_input,
        source=inp.origin.path,
        hdf5_path=out / f"{stem}{HDF5_SUFFIX}",
        meta_path=out / f"{stem}{META_SUFFIX}",
    )


def _transform_task(
    p: Plan,
    meta: Metadata,
    sink: ShardSink | None,
    uid_column: str | None,
    keep: bool,
    block: Block,
    carry: dict[str, Carry],
    uids: pa.Array | None,
) -> tuple[int, Any, str]:
    arrays = transform(p, block, meta, carry=carry)
    if sink is not None:
        if uids is None:
            uids = pa.array(
                block.rows
                if block.rows is not None
                else np.arange(block.lo, block.lo + block.num_rows, dtype=np.int64)
            )
        sink.write_shard(
            block.index,
            arrays_to_table(arrays, uid=uid_column or "uid", uids=uids),
            source=f"{block.origin.path or 'dataset'}, block {block.index}",
        )
    return (
        block.num_rows,
        (arrays if keep else None),
        ray_module().get_runtime_context().get_node_id(),
    )


def preprocess(
    dataset: Any,
    config: Any = None,
    *,
    output_dir: str | os.PathLike[str] | None = None,
    metadata: Any = None,
    address: str | None = None,
    fmt: str = "shards",
    uid_column: str | None = None,
    overwrite: bool = False,
) -> RayPreprocessed:
    """Preprocess ``dataset`` on Ray: the same metadata and tensors as the local engine, as a
    shardset dataset.

    Args:
        dataset: a CSV/TSV/Parquet/JSONL file, a folder of such files, a glob, a URI pyarrow reads,
            or an in-memory table / DataFrame (then ``output_dir`` is required).
        config: as :func:`datamill.preprocess`. Defaults to ``None`` (the one recorded in
            ``metadata``).
        output_dir: the output folder. Defaults to ``None``: beside the input.
        metadata: a ``meta.json`` to apply (nothing refitted, no split). Defaults to ``None``.
        address: the Ray cluster (``auto``, ``HOST:PORT``). Defaults to ``None``: a running
            connection, else a local instance.
        fmt: ``"shards"`` (the shardset dataset + ``meta.json``) or ``"hdf5"`` (also the single
            ``<stem>.hdf5``, assembled on the driver). Defaults to ``"shards"``.
        uid_column: an input column whose (unique) values are the UIDs. Defaults to ``None``: the
            input row index, in the column ``uid``.
        overwrite: also replace another kind of datamill output at the output paths (never an input
            or a file of yours). Defaults to ``False``.

    Returns:
        :class:`RayPreprocessed` (``dataset_path``, ``meta_path``, ``hdf5_path``, ``data``...).

    Raises:
        ConfigError, SchemaError, DataFileError: as the local engine (raised by the task that found
        them).
        ShardsetError: duplicate ``uid_column`` values.
        DataFileError: an output path holds a file of yours or an input (or, without ``overwrite``,
            another kind of datamill output).
        DatamillError: a Ray failure (a worker or node lost more often than Ray retries, no
            cluster).

    Examples:
        >>> preprocess("x.csv", {"input_features": [{"name": "x", "type": "number"}]}, fmt="zip")
        Traceback (most recent call last):
        datamill.core.errors.ConfigError: fmt must be one of ['shards', 'hdf5'], got 'zip'
    """
    if fmt not in FORMATS:
        raise ConfigError(f"fmt must be one of {list(FORMATS)}, got {fmt!r}")
    start = time.perf_counter()
    inp = resolve_input(dataset)
    if inp.table is not None and output_dir is None:
        raise ConfigError("an in-memory dataset needs output_dir= with engine='ray'")
    p = _input_plan(config, dataset, inp, metadata, output_dir)
    assert p.meta_path is not None and p.hdf5_path is not None
    name = _uid_name(p, uid_column)
    root = p.meta_path.with_name(p.meta_path.name.removesuffix(META_SUFFIX) + SHARDS_SUFFIX)
    prepare_outputs(
        p, root, fmt=fmt, inputs=[dataset, *inp.files, config, metadata], overwrite=overwrite
    )
    hit = cached_output(p, root, fmt=fmt, uid_column=name)
    if (
        hit is not None
    ):  # the same inputs, config and images: the saved output, without starting Ray
        return RayPreprocessed(
            hit,
            p.hdf5_path if fmt == "hdf5" else None,
            p.meta_path,
            True,
            int(hit.header["num_rows"]),
            time.perf_counter() - start,
            None,
            dataset_path=root,
            uid_column=name,
        )
    ray = connect(address)
    try:
        return _run(ray, p, inp, root, fmt=fmt, uid_column=uid_column, start=start)
    except DatamillError:
        raise
    except Exception as exc:
        raise unwrap(exc, what="preprocessing") from exc


def _input_plan(config: Any, dataset: Any, inp: Input, metadata: Any, output_dir: Any) -> Plan:
    """The local engine's plan of ``dataset`` (a multi-file input: its outputs named after the
    folder or glob), with the image files' statistics."""
    out = Path(output_dir) if output_dir is not None else None
    if inp.single_file and "://" not in inp.files[0]:
        p = plan(config, inp.files[0], metadata=metadata, output_dir=out)
    elif inp.table is not None:
        p = plan(config, inp.table, metadata=metadata, output_dir=out)
    else:
        p = _multi_file_plan(plan(config, dataset, metadata=metadata, skip_save=True), inp, out)
    p = replace(p, source=p.source if inp.table is not None or inp.single_file else inp.origin.path)
    for part in [inp.table] if inp.table is not None else [f for f in inp.files if "://" not in f]:
        p = with_image_files(p, part)  # as the local engine records (file by file)
    return p


def _uid_name(p: Plan, uid_column: str | None) -> str:
    """The output's UID column (``uid_column`` or ``uid``).

    Raises:
        ConfigError: it clashes with an output key.
    """
    name = uid_column or "uid"
    if (
        any(name in (f.name, f"{f.name}_char", f"{f.name}_word") for f in p.features)
        or name == "split"
    ):
        raise ConfigError(
            f"the UID column {name!r} clashes with an output key", hint="pass another uid_column"
        )
    return name


def _bind(ray: Any, p: Plan, ds: Any) -> Plan:
    """The local engine's :func:`~datamill.preprocessing.pipeline.bind` on the driver: the row count
    and only the few whole columns the split / sampling first pass needs (``pre_columns``)."""
    names = ds.schema().names
    needed = [c for c in pre_columns(p) if c in names]
    columns: dict[str, Any] = {}
    if needed:
        whole = pa.concat_tables(ray.get(ds.select_columns(needed).to_arrow_refs()))
        columns = {c: whole[c] for c in needed}
    return bind(p, int(ds.count()), columns)


# long (65 lines, 0 of docstring): the Ray stages in order (prepare blocks, fit, finalize, transform
# tasks into the shardset writer and the HDF5, switch, meta.json last) with their fault points; the
# ordering is the point
def _run(
    ray: Any, p: Plan, inp: Input, root: Path, *, fmt: str, uid_column: str | None, start: float
) -> RayPreprocessed:
    assert p.meta_path is not None and p.hdf5_path is not None
    uid = uid_column or "uid"
    ds = read(inp, p.wanted, extra=[uid_column] if uid_column else [], optional=p.optional)
    p = _bind(ray, p, ds)
    assert p.meta_path is not None and p.hdf5_path is not None
    refs = ds.to_arrow_refs()
    del ds
    handles = prepare_blocks(p, inp.origin, refs, uid_column=uid_column)
    del refs
    if sum(h.num_rows for h in handles) == 0 and p.applied is None:
        raise DataFileError("the dataset has a header but no rows", path=inp.origin.path)
    stats = fit(
        p, cast(list[Block], handles), executor=RayExecutor(), keep_tokens=False
    )  # handles quack as blocks
    meta = finalize(p, stats)
    p.meta_path.parent.mkdir(parents=True, exist_ok=True)
    new_root = tmp_root(
        root
    )  # the new output is written beside the old one, which stays until the switch
    hdf5 = HDF5Sink(p.hdf5_path, p.meta_path) if fmt == "hdf5" else None
    old: Path | None = None
    switched = False
    try:
        with ShardsetWriter(new_root, uid=uid, shardset=SHARDSET, name=root.name) as writer:
            nodes = _transform_blocks(ray, p, meta, writer, hdf5, handles, stats, uid_column)
        document = meta.to_dict()
        document[HEADER]["dataset"] = {
            "name": root.name,
            "shardset": SHARDSET,
            "uid_column": uid,
            "num_shards": len(handles),
            "num_samples": stats.num_rows,
            "stamp": dataset_stamp(new_root),
        }
        fault_point("ray.preprocess.before_switch")
        old, switched = switch_in(new_root, root), True
        fault_point(
            "ray.preprocess.before_meta"
        )  # killed here: the next run moves the old dataset back
        if hdf5 is not None:
            hdf5.commit(document)  # the HDF5, then meta.json: the new output is trusted from here
        else:
            with atomic_write(p.meta_path) as fh:
                json.dump(document, fh, ensure_ascii=False)
    except BaseException:
        if hdf5 is not None:
            hdf5.abort()
        if switched:
            switch_back(root, old)
        shutil.rmtree(new_root, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return RayPreprocessed(
        Metadata(document),
        p.hdf5_path if hdf5 is not None else None,
        p.meta_path,
        False,
        stats.num_rows,
        time.perf_counter() - start,
        None,
        dataset_path=root,
        uid_column=uid,
        nodes=nodes,
    )


def _transform_blocks(
    ray: Any,
    p: Plan,
    meta: Metadata,
    writer: ShardsetWriter,
    hdf5: HDF5Sink | None,
    handles: list[BlockHandle],
    stats: Stats,
    uid_column: str | None,
) -> list[tuple[str, str]]:
    """The transform tasks, one per block, into ``writer``'s shards (and rows of ``hdf5``, in
    order, as their results come back): ``(the block's node, the task's node)`` of each block."""
    meta_ref = ray.put(meta)
    task = ray.remote(max_retries=MAX_RETRIES)(_transform_task)
    spread = Spread()
    keep = hdf5 is not None
    if hdf5 is not None:
        hdf5.open(p, stats.num_rows)
    items = list(zip(handles, stats.carries))
    nodes: list[tuple[str, str]] = []
    lo = 0

    def submit(item: tuple[BlockHandle, dict[str, Carry]]) -> Any:
        h, carry = item
        return task.options(scheduling_strategy=spread(h.index)).remote(
            p, meta_ref, writer.sink, uid_column, keep, h.ref, carry, h.uids
        )

    for (h, _), (rows, arrays, node) in zip(items, ordered_results(submit, items, window=window())):
        nodes.append((h.node, node))
        if hdf5 is not None:
            hdf5.write(h.index, lo, lo + rows, arrays)
        lo += rows
    return nodes
