"""bag → float32 rows of token frequencies (Ludwig's bag feature).

Same tokenisation, vocabulary (``<PAD>`` 0, ``<UNK>`` 1, ``most_common``) and dense/CSR layout rule
as :mod:`datamill.preprocessing.features.set_`, but entry ``[i, j]`` is how many times token ``j``
occurs in row ``i`` (float32). In the CSR layout the counts are the group's ``values`` dataset.
Metadata key for the longest row: ``max_set_size`` (Ludwig uses the same name for bags).
"""

from __future__ import annotations

import builtins
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from datamill.preprocessing.features import set_
from datamill.preprocessing.features.set_ import LUDWIG_SPECIALS, SetParams

__all__ = ["BagParams", "Handler"]


class BagParams(SetParams):
    """``preprocessing:`` of a bag feature (same keys as set)."""


class Handler(set_.Handler):
    """Bag feature handler.

    Examples:
        >>> import pyarrow as pa
        >>> from datamill.preprocessing.features import FeatureContext
        >>> h, ctx = Handler(), FeatureContext("words", "words", None, None)
        >>> p = h.Params()
        >>> meta = h.finalize(h.fit(pa.array(["a a b"]), p, ctx), p, ctx)
        >>> h.transform(pa.array(["a a b", "b x"]), meta, p, ctx)["words"].tolist()
        [[0.0, 0.0, 2.0, 1.0], [0.0, 1.0, 0.0, 1.0]]
    """

    type_name: ClassVar[str] = "bag"
    Params: ClassVar[builtins.type[BagParams]] = BagParams
    defaults_key: ClassVar[str] = "bag"
    dtype: ClassVar[builtins.type[np.generic]] = np.float32

    def _ludwig_layout(self, frequent: list[str]) -> tuple[list[str], list[str]]:
        """Ludwig 0.17's bag vocabulary (and its specials): ``<EOS>``, ``<SOS>``, ``<PAD>``,
        ``<UNK>`` at 0-3, then the most frequent."""
        tokens = [t for t in frequent if t not in LUDWIG_SPECIALS]
        return [*LUDWIG_SPECIALS, *tokens], list(LUDWIG_SPECIALS)

    def _dense(self, key: NDArray[np.int64], n: int, size: int) -> NDArray[Any]:
        counts = np.bincount(key, minlength=n * size).astype(np.float32)
        return counts.reshape(n, size)
