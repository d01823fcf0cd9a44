"""What :func:`~datamill.preprocessing.api.preprocess` returns, whichever engine ran it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from datamill.core.errors import CacheError
from datamill.preprocessing.features.base import CSR
from datamill.preprocessing.hdf5 import read_hdf5
from datamill.preprocessing.meta import Metadata

__all__ = ["Preprocessed"]


@dataclass
class Preprocessed:
    """What :func:`preprocess` returns."""

    metadata: Metadata
    hdf5_path: Path | None
    meta_path: Path | None
    cached: bool
    num_rows: int
    seconds: float
    _data: dict[str, np.ndarray[Any, Any] | CSR] | None = field(default=None, repr=False)

    @property
    def data(self) -> dict[str, np.ndarray[Any, Any] | CSR]:
        """The tensors (read from the HDF5 on first access when they were saved)."""
        if self._data is None:
            if self.hdf5_path is None:  # pragma: no cover - skip_save always keeps data
                raise CacheError("no data: nothing was saved")
            self._data, _ = read_hdf5(self.hdf5_path)
        return self._data
