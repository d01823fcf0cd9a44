"""Scale-out on Ray Data: ``preprocess`` and ``build_bert_samples`` on a Ray cluster, same output as
one machine; ``read_dataset`` reads any datamill output as a ``ray.data.Dataset`` (blocks = shards).

Chosen with ``engine="ray"`` in :func:`datamill.preprocess` /
:func:`datamill.pretrain.bert.build_bert_samples` (or ``--engine ray [--address HOST:PORT]`` on the
command line); importing this package registers both jobs
(:func:`datamill.core.engine.register_engine`), the engine registry (:mod:`datamill.engines`)
imports it on first use, and ``ray`` itself is imported when a run starts.

Examples:
    >>> from datamill.ray import preprocess
    >>> callable(preprocess)
    True
"""

from __future__ import annotations

from datamill.core.engine import register_engine
from datamill.ray.bert import build_bert_samples
from datamill.ray.preprocess import RayPreprocessed, preprocess
from datamill.ray.read import read_dataset
from datamill.ray.tokenize import run_tasks as tokenize_tasks

__all__ = ["RayPreprocessed", "build_bert_samples", "preprocess", "read_dataset"]
assert sorted(__all__) == __all__

register_engine(
    "ray",
    preprocess=preprocess,
    build_bert_samples=build_bert_samples,
    tokenize=tokenize_tasks,
)
