"""``build_bert_samples(..., engine="ray")``: BERT samples on Ray, the local engine's samples as a
shardset dataset.

1. The driver trains the WordPiece tokenizer once (reading the text like the local engine), or
   loads the given one; it reads nothing else.
2. The raw files are split into documents and sentences and tokenised in Ray Data ``map_batches``,
   one byte range of whole lines per batch (:mod:`datamill.ray._bert_docs`: the local engine's
   document rule and tokenizer); the tokens stay in the object store. The driver folds per-block
   counts into the global document index and the local engine's document blocks (about
   ``SHARD_TOKENS`` tokens each), never holding the tokens.
3. One task per ``(dupe, document block)`` (the local engine's ``plan_tasks``) builds pairs,
   truncation and masking with generators derived from ``(seed, dupe, block)``, the random "other
   document" drawn from the global document index (each worker assembles it once from the blocks'
   counts and reads token ids across blocks zero-copy), so the samples do not depend on the
   number of workers, and writes shard ``task`` of a shardset dataset (UID ``sample`` = ``task << 32
   | row``).

The samples, in shard order, equal the rows of the local engine's Parquet file for the same seed,
block size and tokenizer. The dataset is written beside an earlier one and switched in when
complete (:func:`datamill.core.io.atomic_dir`); the tokenizer is written beside it as
``<out>.tokenizer.json``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from datamill.core.constants import DATASET_MANIFEST
from datamill.core.errors import ConfigError, DatamillError
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.io import PathLike, atomic_dir, atomic_write, check_output, display_name
from datamill.pretrain.bert.engine import (
    BertConfig,
    BertSamples,
    BertTokenizer,
    TaskConfig,
    bert_schema,
    build_metadata,
    check_documents,
    read_documents,
    resolve_tokenizer,
    run_task,
    task_config,
)
from datamill.ray._bert_docs import build_index, corpus_state, plan_text_blocks, tokenize_blocks
from datamill.ray._runtime import MAX_RETRIES, Spread, connect, ordered_results, unwrap
from datamill.shards import ShardsetWriter
from datamill.shards.writer import KEEP_META, ShardSink

__all__ = ["SHARDSET", "UID", "build_bert_samples"]

SHARDSET = "bert"
UID = "sample"


def _bert_task(
    corpus: tuple[str, list[Any], list[bool]],
    cfg: TaskConfig,
    sink: ShardSink,
    meta_json: str,
    index: int,
    task: tuple[int, int, int, int],
) -> tuple[int, int, str]:
    import ray

    res = run_task(corpus_state(*corpus), cfg, *task)
    schema = bert_schema(cfg.mask.layout).with_metadata({KEEP_META: meta_json.encode()})
    table = pa.Table.from_batches(
        [b.replace_schema_metadata(schema.metadata) for b in res.batches], schema=schema
    )
    table = table.add_column(
        0, UID, pa.array((np.int64(index) << 32) + np.arange(table.num_rows, dtype=np.int64))
    )
    sink.write_shard(index, table)
    return res.samples, res.tokens, ray.get_runtime_context().get_node_id()


def _is_own(root: Path) -> bool:
    """A shardset dataset this engine wrote (one shardset, :data:`SHARDSET`)."""
    try:
        manifest = json.loads((root / DATASET_MANIFEST).read_text(encoding="utf-8"))
        return root.is_dir() and [s.get("name") for s in manifest.get("shardsets", [])] == [
            SHARDSET
        ]
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def _check_outputs(root: Path, paths: list[PathLike], tokenizer: Any, *, overwrite: bool) -> Path:
    """Refuse output paths holding a user's file, an input or (without ``overwrite``) another
    datamill output."""
    tok_path = root.with_name(root.name + ".tokenizer.json")
    inputs = [*paths, *([tokenizer] if isinstance(tokenizer, (str, os.PathLike)) else [])]
    check_output(
        root, is_own=_is_own, inputs=inputs, what="BERT shardset dataset", overwrite=overwrite
    )

    def own_tokenizer(p: Path) -> bool:  # the copy an earlier run wrote beside its dataset
        try:
            entry = json.loads((root / DATASET_MANIFEST).read_text(encoding="utf-8"))["shardsets"][
                0
            ]
            return (
                _is_own(root)
                and json.loads(entry["source_metadata"]).get("tokenizer_file") == p.name
            )
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return False

    check_output(
        tok_path, is_own=own_tokenizer, inputs=inputs, what="tokenizer copy of a BERT dataset"
    )
    return tok_path


def build_bert_samples(
    source: PathLike | Sequence[PathLike],
    /,
    *,
    out: PathLike,
    config: BertConfig | None = None,
    address: str | None = None,
    **options: Any,
) -> BertSamples:
    """:func:`datamill.pretrain.bert.build_bert_samples` on Ray; ``out`` is the shardset dataset
    folder.

    Arguments are those of the local builder (the same :class:`BertConfig`; ``workers`` aside: Ray
    schedules; ``engine`` is ignored: this is the engine), plus ``address``
    (the Ray cluster; defaults to ``None``: a running connection, else a local instance). An earlier
    BERT dataset at ``out`` is replaced when the new one is complete; ``overwrite`` also replaces
    another kind of datamill output (never an input or a file of yours). Defaults to ``False``.

    Raises:
        ConfigError, DataFileError: as the local builder; DataFileError also for an output path
            holding a file of yours or an input.
        DatamillError: a Ray failure after Ray's retries (nothing is committed; an earlier output
            stays).

    Examples:
        >>> build_bert_samples("raw.txt", out="bert", dupe_factor=0)
        Traceback (most recent call last):
        datamill.core.errors.ConfigError: dupe_factor must be an int in [1, 10,000], got 0
    """
    conf = BertConfig.of(config, **options)
    tokenizer, vocab_size, sentence_split = conf.tokenizer, conf.vocab_size, conf.sentence_split
    paths = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not paths:
        raise ConfigError("source must name at least one text file")
    root = Path(out)
    tok_path = _check_outputs(root, paths, tokenizer, overwrite=conf.overwrite)
    start = time.perf_counter()
    tok = resolve_tokenizer(tokenizer)
    timings: dict[str, float] = {}
    if tok is None:  # trained once, on the driver, on the text read as the local engine reads it
        tok, _sentences, _docs, timings = read_documents(
            paths, None, vocab_size=vocab_size, sentence_split=sentence_split
        )
        del _sentences, _docs
    ray = connect(address)
    try:
        return _build(
            ray,
            paths,
            root,
            tok_path,
            tok,
            timings,
            start,
            conf,
        )
    except DatamillError:
        raise
    except Exception as exc:
        raise unwrap(exc, what="building BERT samples") from exc


# long (62 lines): the Ray engine's stages in order (read, tokenise, pair, mask, write); split, they
# would pass the same dozen values around
def _build(
    ray: Any,
    paths: list[PathLike],
    root: Path,
    tok_path: Path,
    tok: BertTokenizer,
    timings: dict[str, float],
    start: float,
    conf: BertConfig,
) -> BertSamples:
    layout, dupe_factor, sentence_split = conf.layout, conf.dupe_factor, conf.sentence_split
    t = time.perf_counter()
    tok_json = tok.to_json()
    tokenized = tokenize_blocks(
        ray, plan_text_blocks(paths), tok_json, sentence_split=sentence_split
    )
    index = build_index(tokenized, paths)
    timings["read_split_tokenize"] = time.perf_counter() - t
    check_documents(index.documents, paths)
    cfg = task_config(conf, tok)
    meta = build_metadata(
        conf,
        tok,
        tokenizer_file=tok_path.name,
        tokenizer_fingerprint=fingerprint_obj(tok_json),
        sources=[display_name(p) for p in paths],
        documents=index.documents,
        sentences=index.sentences,
    )
    # the local engine's plan_tasks: every (dupe, document block) in output order
    tasks = [(d, s, lo, hi) for d in range(dupe_factor) for s, (lo, hi) in enumerate(index.shards)]
    refs = tokenized.to_arrow_refs()
    corpus = (
        fingerprint_obj([tok_json, [r.hex() for r in refs]]),
        refs,
        index.merge,
    )  # refs nested: got once per worker
    remote = ray.remote(max_retries=MAX_RETRIES)(_bert_task)
    spread = Spread()
    samples = tokens = 0
    nodes: set[str] = set()
    t = time.perf_counter()
    with (
        atomic_dir(root) as tmp,
        ShardsetWriter(tmp, uid=UID, shardset=SHARDSET, name=root.name) as writer,
    ):
        meta_json = json.dumps(meta, sort_keys=True)

        def submit(item: tuple[int, tuple[int, int, int, int]]) -> Any:
            return remote.options(scheduling_strategy=spread(item[0])).remote(
                corpus, cfg, writer.sink, meta_json, item[0], item[1]
            )

        window = max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
        for n, k, node in ordered_results(submit, list(enumerate(tasks)), window=window):
            samples, tokens = samples + n, tokens + k
            nodes.add(node)
    with atomic_write(tok_path) as f:
        f.write(tok_json)
    timings["samples_write"] = time.perf_counter() - t
    timings["nodes"] = float(len(nodes))
    return BertSamples(
        path=root,
        tokenizer_path=tok_path,
        layout=layout,
        documents=index.documents,
        sentences=index.sentences,
        samples=samples,
        tokens=tokens,
        seconds=time.perf_counter() - start,
        timings=timings,
    )
