"""An unregistered ``scheme://`` (``gs://``) is refused alike by preprocessing, shards and the
loader: one ConfigError from the scheme table, naming the schemes datamill reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from datamill.core.errors import ConfigError
from datamill.loader.sources import open_source
from datamill.preprocessing import preprocess
from datamill.shards import ShardsetDataset

CONFIG = {
    "input_features": [{"name": "a", "type": "number"}],
    "output_features": [{"name": "b", "type": "number"}],
}
CALLS: dict[str, Callable[[], Any]] = {
    "preprocess": lambda: preprocess("gs://bucket/data.csv", config=CONFIG),
    "shards open": lambda: ShardsetDataset("gs://bucket/data.csv"),
    "shards create": lambda: ShardsetDataset.create(
        "gs://bucket/data.csv", pa.table({"u": [1]}), uid="u", shardset="s"
    ),
    "loader": lambda: open_source("gs://bucket/data.csv"),
}


@pytest.mark.parametrize("who", sorted(CALLS))
def test_an_unregistered_scheme_is_refused_identically(who: str) -> None:
    with pytest.raises(ConfigError) as err:
        CALLS[who]()
    assert str(err.value) == (
        "unknown storage scheme 'gs://' in 'gs://bucket/data.csv'; datamill reads file://, s3://, "
        "memory://"
    )
