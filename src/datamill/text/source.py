"""An LM corpus as a :class:`datamill.core.source.Source` of fixed-length examples (for the Loader).

Example ``i`` is ``x = ids[i*num_steps : (i+1)*num_steps]`` and ``y`` the same run shifted by one
token: the non-overlapping examples of random sampling at offset 0. Both columns are
``fixed_size_list<int32>[num_steps]``; a shard is ``shard_size`` consecutive examples. The loader
shuffles, splits across ranks and resumes; for the seed's per-epoch random offset use
:func:`datamill.text.random_batches` instead.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from datamill.core.errors import ConfigError, DataFileError
from datamill.core.fingerprint import fingerprint_obj
from datamill.core.source import FixedShards, check_read_args, register_source
from datamill.text.corpus import CORPUS_FILE, Corpus

__all__ = ["CorpusSource"]


class CorpusSource:
    """Fixed ``num_steps`` examples of a corpus, columns ``x`` and ``y``.

    Args:
        dir_or_corpus: a corpus folder or a :class:`Corpus`.
        num_steps: tokens per example. Defaults to ``35`` (the seed's).
        shard_size: examples per shard. Defaults to ``8192``.

    Examples:
        >>> src = CorpusSource(Corpus(np.arange(12)), num_steps=5, shard_size=1)
        >>> src.shard_sizes().tolist(), src.read_shard(1).to_pydict()
        ([1, 1], {'x': [[5, 6, 7, 8, 9]], 'y': [[6, 7, 8, 9, 10]]})
    """

    def __init__(
        self,
        dir_or_corpus: str | os.PathLike[str] | Corpus,
        *,
        num_steps: int = 35,
        shard_size: int = 8192,
    ) -> None:
        if num_steps < 1 or shard_size < 1:
            raise ConfigError(
                f"num_steps and shard_size must be >= 1, got {num_steps} and {shard_size}"
            )
        self.corpus = (
            dir_or_corpus if isinstance(dir_or_corpus, Corpus) else Corpus.load(dir_or_corpus)
        )
        self.num_steps, self.shard_size = int(num_steps), int(shard_size)
        self.num_examples = (len(self.corpus) - 1) // self.num_steps if len(self.corpus) else 0
        self._shards = FixedShards(self.num_examples, self.shard_size)
        self.uid_column: str | None = None
        if self.num_examples < 1:
            raise DataFileError(
                f"corpus has {len(self.corpus):,} tokens; expected at least num_steps + 1 = "
                f"{self.num_steps + 1}",
                path=self.corpus.name,
            )

    @property
    def columns(self) -> list[str]:
        return ["x", "y"]

    @property
    def num_shards(self) -> int:
        return self._shards.num_shards

    def shard_sizes(self) -> NDArray[np.int64]:
        return self._shards.sizes()

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        cols = check_read_args(self, index, columns, path=self.corpus.name)
        lo, hi = self._shards.bounds(index)
        ns, toks = self.num_steps, self.corpus.tokens
        data = {}
        for c in cols:
            shift = 1 if c == "y" else 0
            flat = np.ascontiguousarray(toks[lo * ns + shift : hi * ns + shift], dtype=np.int32)
            data[c] = pa.FixedSizeListArray.from_arrays(pa.array(flat), ns)
        return pa.table(data) if data else pa.table({}).slice(0, 0)

    def fingerprint(self) -> str:
        return fingerprint_obj(
            [
                "datamill.text.CorpusSource@1",
                self.corpus.fingerprint(),
                self.num_steps,
                self.shard_size,
            ]
        )

    def __repr__(self) -> str:
        return (
            f"CorpusSource({self.corpus.name!r}, num_steps={self.num_steps}, "
            f"examples={self.num_examples:,})"
        )


register_source(
    "corpus",
    marker=lambda p: p.is_dir() and (p / CORPUS_FILE).is_file(),
    opener=CorpusSource,
    priority=10,
)
