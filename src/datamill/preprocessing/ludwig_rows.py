"""The rows Ludwig 0.17 picks where its choice is deterministic: its hash split and its sample.

* **Hash split** (Ludwig's ``HashSplitter``): a row's split comes from the value of the split
  column as Ludwig read it, written as JSON (``json.dumps({"value": v}, sort_keys=True)``), hashed
  with MD5, the digest written in base64 (``__`` as the two extra characters) and that text hashed
  with CRC-32; the 32-bit hash is compared with ``p_train * 2**32`` and
  ``(p_train + p_val) * 2**32``. Ludwig reads CSV/TSV with ``dtype=object``, so there every value
  is hashed as the string written in the file (``"7"``, not ``7``); Parquet, JSON, Excel and
  in-memory tables keep their types (an integer column with missing values is a float column in
  pandas: ``7.0``). A missing key is pandas' ``NaN`` (Ludwig then drops the row; datamill keeps
  it, in the split ``NaN`` hashes to). One hash per *distinct* value (``hashlib``, C speed), then a
  gather.
* **Sample** (``sample_ratio``/``sample_size``, pandas' ``df.sample(frac, random_state=seed)``): the
  first ``round(ratio * n)`` rows of NumPy's legacy ``RandomState(seed).permutation(n)``, which is
  what pandas draws; :func:`sample_ranks` gives each row its position in that permutation, so a
  block keeps its rows by comparing their ranks with the count.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

__all__ = ["hash_split", "pandas_json", "sample_ranks"]


@lru_cache(maxsize=2)
def sample_ranks(seed: int, num_rows: int) -> NDArray[np.int64]:
    """Each row's position in pandas' sampling permutation (``RandomState(seed).permutation``).

    ``df.sample(frac=r, random_state=seed)`` keeps the rows whose rank is below ``round(r * n)``.

    Examples:
        >>> ranks = sample_ranks(42, 10)
        >>> sorted(np.flatnonzero(ranks < 4).tolist())
        [0, 1, 5, 8]
    """
    perm = np.random.RandomState(seed % 2**32).permutation(num_rows)
    ranks = np.empty(num_rows, np.int64)
    ranks[perm] = np.arange(num_rows, dtype=np.int64)
    ranks.flags.writeable = False
    return ranks


def pandas_json(column: pa.Array | pa.ChunkedArray, *, csv: bool) -> pa.Array:
    """Each value as the JSON text ``json.dumps`` writes for it as Ludwig read it (module doc).

    ``csv``: the column comes from a CSV/TSV file (Ludwig read it as strings). A number column of a
    CSV read as numbers (the split column is also a number feature) is written back as text: an
    integer as ``"7"``, anything else as Python writes the float (``"1.50"`` in the file would be
    ``"1.5"``). A missing value is pandas' ``NaN`` (``"NaN"``).

    Examples:
        >>> pandas_json(pa.array([4, None, 12]), csv=False).to_pylist()
        ['4.0', 'NaN', '12.0']
        >>> pandas_json(pa.array(["4", "b"]), csv=True).to_pylist()
        ['"4"', '"b"']
    """
    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(col.type) or pa.types.is_large_string(col.type):
        col = col.cast(pa.string())
    t = col.type
    encoded = pc.dictionary_encode(col)
    numeric = pa.types.is_floating(t) or pa.types.is_integer(t)
    if (csv or pa.types.is_string(t)) and not (csv and numeric):
        return pc.fill_null(pc.take(_json_strings(encoded.dictionary), encoded.indices), "NaN")
    texts = _value_texts(encoded.dictionary, t, csv=csv, nulls=bool(col.null_count))
    return pc.fill_null(pc.take(pa.array(texts, pa.string()), encoded.indices), "NaN")


def _value_texts(dictionary: pa.Array, t: pa.DataType, *, csv: bool, nulls: bool) -> list[str]:
    """The JSON text of each distinct value of a column of type ``t`` that is not read as strings
    (``csv``: a number column of a CSV, written back as text; ``nulls``: the column has some)."""
    values = dictionary.to_pylist()
    if csv:
        return [
            json.dumps(str(int(v)) if float(v).is_integer() else repr(float(v))) for v in values
        ]
    if pa.types.is_integer(t) and not nulls:
        return [str(int(v)) for v in values]
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return [json.dumps(float(v)) for v in values]
    if pa.types.is_boolean(t):
        return ["true" if v else "false" for v in values]
    return [json.dumps(str(v)) for v in dictionary.cast(pa.string()).to_pylist()]


def _json_strings(values: pa.Array) -> pa.Array:
    """``json.dumps(v)`` of each string (``ensure_ascii``): plain printable ASCII is quoted in
    Arrow, the rest (escapes, non-ASCII) by the ``json`` module."""
    strings = values.cast(pa.string())
    plain = pc.fill_null(pc.match_substring_regex(strings, r"^[ !#-\[\]-~]*$"), False)
    quoted = pc.binary_join_element_wise('"', strings, '"', "")
    if pc.all(plain).as_py() or not len(strings):
        return quoted
    rest = np.flatnonzero(~np.asarray(plain.to_numpy(zero_copy_only=False), bool))
    escaped = [json.dumps(v) for v in strings.take(pa.array(rest)).to_pylist()]
    out = quoted.to_pylist()
    for i, text in zip(rest.tolist(), escaped):  # the few values needing escapes
        out[i] = text
    return pa.array(out, pa.string())


def _crcs(texts: pa.Array) -> NDArray[np.float64]:
    """Ludwig's hash of each JSON text: one ``hashlib``/``zlib`` call chain per value."""
    docs = pc.binary_join_element_wise('{"value": ', texts, "}", "").cast(pa.binary())
    md5, b64, crc32 = hashlib.md5, base64.b64encode, zlib.crc32
    return np.fromiter(
        (crc32(b64(md5(d, usedforsecurity=False).digest(), b"__")) for d in docs.to_pylist()),
        np.float64,
        count=len(docs),
    )


def hash_split(
    column: pa.Array | pa.ChunkedArray, probabilities: tuple[float, float, float], *, csv: bool
) -> NDArray[np.int8]:
    """Ludwig's hash split of each value of ``column`` (0 train, 1 validation, 2 test).

    Examples:
        >>> hash_split(pa.array(["user-0000", "user-0001", "user-0002"]), (0.7, 0.1, 0.2), csv=True)
        array([2, 0, 0], dtype=int8)
    """
    texts = pc.dictionary_encode(pandas_json(column, csv=csv))
    crc = _crcs(texts.dictionary)
    lo = probabilities[0] * 2**32
    hi = lo + probabilities[1] * 2**32
    per_value = np.where(crc < lo, 0, np.where(crc < hi, 1, 2)).astype(np.int8)
    idx = np.asarray(texts.indices.to_numpy(zero_copy_only=False), np.int64)
    out: NDArray[np.int8] = per_value[idx]
    return out
