"""``build_bert_samples(..., engine="ray")``: BERT samples on Ray, the local engine's samples as a shardset dataset.

1. The driver splits the raw text into documents and sentences (the local engine's
   ``split_documents``) and trains the WordPiece tokenizer once (or loads the given one).
2. Sentences are tokenised in Ray Data ``map_batches`` (each worker rebuilds the tokenizer from its
   JSON once); the driver assembles the corpus exactly as ``tokenize_documents`` does and puts it
   in the object store once.
3. One task per ``(dupe, document block)`` (the local engine's ``plan_tasks``: blocks of about
   ``SHARD_TOKENS`` tokens) builds pairs, truncation and masking with generators derived from
   ``(seed, dupe, block)``, the random "other document" drawn from the global document index, so
   the samples do not depend on the number of workers, and writes shard ``task`` of a shardset
   dataset (UID ``sample`` = ``task << 32 | row``).

The samples, in shard order, equal the rows of the local engine's Parquet file for the same seed
and block size. The tokenizer is written beside the dataset as ``<out>.tokenizer.json``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa

from datamill.core.constants import BERT_FORMAT
from datamill.core.errors import ConfigError, DataFileError, DatamillError
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.io import PathLike, atomic_write, display_name
from datamill.pretrain.bert.engine import (
    BertSamples,
    BertTokenizer,
    MaskConfig,
    TaskConfig,
    TokenizedDocuments,
    bert_schema,
    check_params,
    init_state,
    plan_tasks,
    read_documents,
    resolve_tokenizer,
    run_task,
    tokenize_documents,
)
from datamill.ray._runtime import MAX_RETRIES, Spread, connect, ordered_results, unwrap
from datamill.shards import ShardsetWriter
from datamill.shards.writer import KEEP_META, ShardSink

__all__ = ["SHARDSET", "UID", "build_bert_samples"]

SHARDSET = "bert"
UID = "sample"

_TOKENIZERS: dict[str, BertTokenizer] = {}
_CORPORA: dict[str, Any] = {}


def _tokenizer(tok_json: str) -> BertTokenizer:
    key = fingerprint_obj(tok_json)
    if key not in _TOKENIZERS:
        from tokenizers import Tokenizer

        tok = resolve_tokenizer(Tokenizer.from_str(tok_json))
        assert tok is not None
        _TOKENIZERS.clear()
        _TOKENIZERS[key] = tok
    return _TOKENIZERS[key]


def _encode_batch(batch: pa.Table, tok_json: str) -> pa.Table:
    flat, offsets = _tokenizer(tok_json).encode(batch.column("sentence").combine_chunks())
    return pa.table({"ids": pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(flat, pa.int32()))})


class _Encoded:
    """Stands in for the tokenizer in ``tokenize_documents``: the encodings made on the workers."""

    def __init__(self, flat: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any]) -> None:
        self.flat, self.offsets = flat, offsets

    def encode(self, texts: Any) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        return self.flat, self.offsets


def _tokenize_on_ray(ray: Any, sentences: pa.Array, sent_doc: np.ndarray[Any, Any], tok_json: str) -> TokenizedDocuments:
    ds = ray.data.from_arrow(pa.table({"sentence": sentences}))
    ds = ds.map_batches(_encode_batch, batch_format="pyarrow", batch_size=8192, fn_kwargs={"tok_json": tok_json})
    flats, lengths = [], []
    for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        col = batch.column("ids").combine_chunks()
        offs = np.asarray(col.offsets.to_numpy(), np.int64)
        flats.append(np.asarray(col.values.to_numpy(), np.int32)[offs[0]:offs[-1]])
        lengths.append(np.diff(offs))
    flat = np.concatenate(flats) if flats else np.zeros(0, np.int32)
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths) if lengths else [])]).astype(np.int64)
    return tokenize_documents(sentences, sent_doc, cast(BertTokenizer, _Encoded(flat, offsets)))


def _bert_task(corpus: tuple[str, np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]],
               cfg: TaskConfig, sink: ShardSink, meta_json: str, index: int,
               task: tuple[int, int, int, int]) -> tuple[int, int, str]:
    import ray

    key, ids, sent_offsets, doc_offsets = corpus
    if key not in _CORPORA:  # one list conversion per worker process and corpus
        _CORPORA.clear()
        _CORPORA[key] = init_state(ids, sent_offsets, doc_offsets)
    res = run_task(_CORPORA[key], cfg, *task)
    schema = bert_schema(cfg.mask.layout).with_metadata({KEEP_META: meta_json.encode()})
    table = pa.Table.from_batches([b.replace_schema_metadata(schema.metadata) for b in res.batches], schema=schema)
    table = table.add_column(0, UID, pa.array((np.int64(index) << 32) + np.arange(table.num_rows, dtype=np.int64)))
    sink.write_shard(index, table)
    return res.samples, res.tokens, ray.get_runtime_context().get_node_id()


def build_bert_samples(source: PathLike | Sequence[PathLike], /, *, out: PathLike, tokenizer: Any = None,
                       vocab_size: int = 30000, max_seq_length: int = 512, dupe_factor: int = 10,
                       mask_prob: float = 0.15, max_predictions_per_seq: int = 20, short_seq_prob: float = 0.1,
                       seed: int = 0, layout: str = "padded", sentence_split: str = "line", pairing: str = "seed",
                       address: str | None = None) -> BertSamples:
    """:func:`datamill.pretrain.bert.build_bert_samples` on Ray; ``out`` is the shardset dataset folder.

    Arguments are those of the local builder (``workers`` aside: Ray schedules), plus ``address``
    (the Ray cluster; defaults to ``None``: a running connection, else a local instance).

    Raises:
        ConfigError, DataFileError: as the local builder. ShardsetError: ``out`` holds another dataset.
        DatamillError: a Ray failure after Ray's retries (nothing is committed).

    Examples:
        >>> build_bert_samples("raw.txt", out="bert", dupe_factor=0)
        Traceback (most recent call last):
        datamill.core.errors.ConfigError: dupe_factor must be >= 1, got 0
    """
    check_params(max_seq_length, dupe_factor, mask_prob, max_predictions_per_seq, short_seq_prob,
                  vocab_size, layout, None, sentence_split, pairing)
    paths = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not paths:
        raise ConfigError("source must name at least one text file")
    start = time.perf_counter()
    tok, sentences, sent_doc, timings = read_documents(paths, tokenizer, vocab_size=vocab_size,
                                                       sentence_split=sentence_split)
    ray = connect(address)
    try:
        return _build(ray, paths, Path(out), tok, sentences, sent_doc, timings, start, seed=seed,
                      max_seq_length=max_seq_length, dupe_factor=dupe_factor, mask_prob=mask_prob,
                      max_predictions_per_seq=max_predictions_per_seq, short_seq_prob=short_seq_prob,
                      layout=layout, sentence_split=sentence_split, pairing=pairing)
    except DatamillError:
        raise
    except Exception as exc:
        raise unwrap(exc, what="building BERT samples") from exc


def _build(ray: Any, paths: list[PathLike], root: Path, tok: BertTokenizer, sentences: pa.Array,
           sent_doc: np.ndarray[Any, Any], timings: dict[str, float], start: float, *, seed: int,
           max_seq_length: int, dupe_factor: int, mask_prob: float, max_predictions_per_seq: int,
           short_seq_prob: float, layout: str, sentence_split: str, pairing: str) -> BertSamples:
    t = time.perf_counter()
    tok_json = tok.to_json()
    corpus = _tokenize_on_ray(ray, sentences, sent_doc, tok_json)
    n_sentences = len(sentences)
    timings["tokenize"] = time.perf_counter() - t
    where = display_name(paths[0]) if len(paths) == 1 else f"{display_name(paths[0])} (+{len(paths) - 1} files)"
    if corpus.num_documents < 2:
        raise DataFileError(f"found {corpus.num_documents} document(s); next-sentence pairs need at least two",
                            path=where, hint="separate documents with blank lines or '= Title =' lines")
    cfg = TaskConfig(seed=seed, max_num_tokens=max_seq_length - 3, short_seq_prob=short_seq_prob,
                     mask=MaskConfig(max_seq_length=max_seq_length, mask_prob=mask_prob,
                                     max_predictions=max_predictions_per_seq, pad=tok.pad, cls=tok.cls,
                                     sep=tok.sep, mask=tok.mask, special_ids=tok.special_ids,
                                     vocab_size=tok.vocab_size, layout=layout), pairing=pairing)
    tok_path = root.with_name(root.name + ".tokenizer.json")
    meta = {"format": BERT_FORMAT, "layout": layout, "max_seq_length": max_seq_length, "mask_prob": mask_prob,
            "max_predictions_per_seq": max_predictions_per_seq, "short_seq_prob": short_seq_prob,
            "dupe_factor": dupe_factor, "seed": seed, "sentence_split": sentence_split, "pairing": pairing,
            "special_ids": {"pad": tok.pad, "cls": tok.cls, "sep": tok.sep, "mask": tok.mask, "unk": tok.unk},
            "vocab_size": tok.vocab_size, "tokenizer_file": tok_path.name,
            "tokenizer_fingerprint": fingerprint_obj(tok_json), "sources": [display_name(p) for p in paths],
            "documents": corpus.num_documents, "sentences": n_sentences}
    tasks = plan_tasks(corpus, dupe_factor)
    key = fingerprint_obj([tok_json, len(corpus.ids), corpus.doc_offsets.tolist()[:64]])
    corpus_ref = ray.put((key, corpus.ids, corpus.sent_offsets, corpus.doc_offsets))
    remote = ray.remote(max_retries=MAX_RETRIES)(_bert_task)
    spread = Spread()
    samples = tokens = 0
    nodes: set[str] = set()
    t = time.perf_counter()
    with ShardsetWriter(root, uid=UID, shardset=SHARDSET) as writer:
        meta_json = json.dumps(meta, sort_keys=True)

        def submit(item: tuple[int, tuple[int, int, int, int]]) -> Any:
            return remote.options(scheduling_strategy=spread(item[0])).remote(corpus_ref, cfg, writer.sink, meta_json,
                                                                              item[0], item[1])

        window = max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
        for n, k, node in ordered_results(submit, list(enumerate(tasks)), window=window):
            samples, tokens = samples + n, tokens + k
            nodes.add(node)
    with atomic_write(tok_path) as f:
        f.write(tok_json)
    timings["samples_write"] = time.perf_counter() - t
    timings["nodes"] = float(len(nodes))
    return BertSamples(path=root, tokenizer_path=tok_path, layout=layout, documents=corpus.num_documents,
                       sentences=n_sentences, samples=samples, tokens=tokens,
                       seconds=time.perf_counter() - start, timings=timings)
