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
