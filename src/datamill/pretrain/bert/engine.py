"""The BERT builder's stages, for another engine (``datamill.ray``) that runs them elsewhere.

A public seam over the private stage modules: the same document split, tokenising, task plan
(``(dupe, document block)`` tasks with generators from ``rng_for(seed, "bert-*", dupe, block)``)
and task body as :func:`datamill.pretrain.bert.build_bert_samples`, so an engine that calls them
produces the same samples. Nothing here is new behaviour.

Examples:
    >>> from datamill.pretrain.bert.engine import plan_tasks, run_task
    >>> callable(plan_tasks) and callable(run_task)
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from datamill.core.constants import BERT_FORMAT
from datamill.core.errors import DataFileError
from datamill.core.io import PathLike, display_name
from datamill.pretrain.bert import _run
from datamill.pretrain.bert._docs import (
    TokenizedDocuments,
    check_file,
    read_documents,
    split_block,
    split_documents,
    tokenize_documents,
)
from datamill.pretrain.bert._mask import MaskConfig, bert_schema
from datamill.pretrain.bert._run import TaskConfig, TaskResult, plan_tasks
from datamill.pretrain.bert._run import _init_state as init_state
from datamill.pretrain.bert._run import _run_task as run_task
from datamill.pretrain.bert._tok import BertTokenizer, resolve_tokenizer, train_wordpiece
from datamill.pretrain.bert.config import BertConfig, BertSamples, check_params

__all__ = [
    "BertConfig",
    "BertSamples",
    "BertTokenizer",
    "MaskConfig",
    "TaskConfig",
    "TaskResult",
    "TokenizedDocuments",
    "bert_schema",
    "build_metadata",
    "check_documents",
    "check_file",
    "check_params",
    "init_state",
    "plan_tasks",
    "read_documents",
    "resolve_tokenizer",
    "run_task",
    "shard_tokens",
    "split_block",
    "split_documents",
    "task_config",
    "tokenize_documents",
    "train_wordpiece",
]
assert sorted(__all__) == __all__


def shard_tokens() -> int:
    """Corpus tokens per document block (task) of ``plan_tasks``, read when called.

    Examples:
        >>> shard_tokens() > 0
        True
    """
    return _run.SHARD_TOKENS


def task_config(conf: BertConfig, tok: BertTokenizer) -> TaskConfig:
    """The tasks' parameters (pairing and masking) of a build with ``conf`` and tokenizer
    ``tok``."""
    return TaskConfig(
        seed=conf.seed,
        max_num_tokens=conf.max_seq_length - 3,
        short_seq_prob=conf.short_seq_prob,
        mask=MaskConfig(
            max_seq_length=conf.max_seq_length,
            mask_prob=conf.mask_prob,
            max_predictions=conf.max_predictions_per_seq,
            pad=tok.pad,
            cls=tok.cls,
            sep=tok.sep,
            mask=tok.mask,
            special_ids=tok.special_ids,
            vocab_size=tok.vocab_size,
            layout=conf.layout,
        ),
        pairing=conf.pairing,
    )


#: the build's parameters its metadata records (the :class:`BertConfig` fields, in this order)
_META_PARAMS = (
    "layout",
    "max_seq_length",
    "mask_prob",
    "max_predictions_per_seq",
    "short_seq_prob",
    "dupe_factor",
    "seed",
    "sentence_split",
    "pairing",
)
#: the tokenizer's special ids the metadata records (``special_ids``)
_META_SPECIALS = ("pad", "cls", "sep", "mask", "unk")


def build_metadata(conf: BertConfig, tok: BertTokenizer, **more: Any) -> dict[str, Any]:
    """The output's metadata: the format, the build's parameters and the tokenizer's special ids,
    then ``more`` (tokenizer file and fingerprint, sources, counts) as the engine knows them."""
    return {
        "format": BERT_FORMAT,
        **{name: getattr(conf, name) for name in _META_PARAMS},
        "special_ids": {name: getattr(tok, name) for name in _META_SPECIALS},
        "vocab_size": tok.vocab_size,
        **more,
    }


def check_documents(count: int, paths: Sequence[PathLike]) -> None:
    """Next-sentence pairs need two documents or more: a located error naming the input(s)."""
    if count >= 2:
        return
    where = (
        display_name(paths[0])
        if len(paths) == 1
        else f"{display_name(paths[0])} (+{len(paths) - 1} files)"
    )
    raise DataFileError(
        f"found {count} document(s); next-sentence pairs need at least two "
        "(B is drawn from another document half of the time)",
        path=where,
        hint="separate documents with blank lines or '= Title =' lines, or add more text",
    )
