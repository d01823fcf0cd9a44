"""Distinct tokens of a byte buffer without building strings: exact integer keys of the token bytes.

A tokenizer's numpy fast path knows every token as ``(start, length)`` in one byte buffer. Making
a string array of the tokens and dictionary-encoding it hashes variable-length strings; instead,
:func:`token_dictionary` gathers each token's first 8 bytes as one unaligned little-endian
``uint64`` (bytes past the token's end zeroed by two shifts) and hashes those fixed-width keys with
Arrow; the few longer tokens get ``8 * ceil(length / 8)``-byte keys, hashed apart. With no NUL byte
in the data the keys are exact: no collision can merge two tokens. Tokens longer than
:data:`MAX_KEY_BYTES`, or data holding a NUL byte, are left to the caller's string path.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

__all__ = ["MAX_KEY_BYTES", "token_dictionary"]

#: tokens up to this many bytes are keyed exactly; :func:`token_dictionary` returns None beyond
MAX_KEY_BYTES = 32

_U64 = np.dtype("<u8")
# keeping the low r bytes of a word (r = 0..8) is shifting left then right by 64 - 8r bits; a shift
# by 64 (r = 9: a token longer than the word) gives 0 in numpy
_SHIFT = np.array([64 - 8 * r for r in range(9)] + [64], np.uint8)


def token_dictionary(data: NDArray[np.uint8], starts: NDArray[np.int64], lengths: NDArray[np.int64]
                     ) -> tuple[pa.Array, NDArray[np.int32]] | None:
    """The distinct tokens and each token's index into them (tokens of <= 8 bytes first).

    Args:
        data: the bytes, uint8 (ASCII, or UTF-8 with every token whole: the tokens become strings).
        starts: each token's first byte in ``data``.
        lengths: each token's length in bytes (>= 1).

    Returns:
        ``(dictionary, indices)``: a pyarrow string array of the distinct tokens and an int32 array
        with ``dictionary[indices[i]] == data[starts[i]:starts[i] + lengths[i]]``; ``None`` when a
        token is longer than :data:`MAX_KEY_BYTES` or ``data`` holds a NUL byte
        (use a string path then).

    Examples:
        >>> b = np.frombuffer(b"to be or not to be", np.uint8)
        >>> d, i = token_dictionary(b, np.array([0, 3, 6, 9, 13, 16]), np.array([2, 2, 2, 3, 2, 2]))
        >>> d.to_pylist(), i.tolist()
        (['to', 'be', 'or', 'not'], [0, 1, 2, 3, 0, 1])
    """
    n = len(starts)
    if n == 0:
        return pa.array([], pa.string()), np.zeros(0, np.int32)
    longest = int(lengths.max())
    if longest > MAX_KEY_BYTES or int(lengths.min()) < 1 or int(data.min(initial=1)) == 0:
        return None
    padded = np.concatenate([data, np.zeros(MAX_KEY_BYTES + 8, np.uint8)])  # every 8-byte read stays inside
    windows = np.ndarray(shape=(len(padded) - 7,), dtype=_U64, buffer=padded, strides=(1,))  # unaligned, no copy

    def key_words(st: NDArray[np.int64], rest: NDArray[np.uint8]) -> NDArray[np.uint64]:
        """The 8 bytes at ``st`` keeping the first ``rest`` of them (0..8; 9 keeps none)."""
        words: NDArray[np.uint64] = windows[st]
        shift = np.take(_SHIFT, rest)  # uint8: mixed-type shifts cast in small buffers, no uint64 temporary
        np.left_shift(words, shift, out=words)
        np.right_shift(words, shift, out=words)
        return words

    rest = np.empty(n, np.uint8)
    np.minimum(lengths, 9, out=rest, casting="unsafe")
    first = key_words(starts, rest)  # tokens of <= 8 bytes: one exact uint64 key (no NUL bytes); longer: 0
    enc = pc.dictionary_encode(first)
    del first
    if longest <= 8:
        return _decode_keys(enc.dictionary.to_numpy().reshape(-1, 1)), _int32(enc.indices)
    short_keys = enc.dictionary.to_numpy()
    indices = _int32(enc.indices)
    if not indices.flags.writeable:
        indices = indices.copy()
    # long tokens: fixed-width keys of ncols words, hashed apart from the (many more) short ones
    where = np.flatnonzero(rest == 9)
    del rest
    ls, ll = starts[where], lengths[where]
    ncols = (longest + 7) // 8
    keys = np.empty((len(where), ncols), _U64)
    for j in range(ncols):
        keys[:, j] = key_words(ls + 8 * j, np.clip(ll - 8 * j, 0, 8).astype(np.uint8))
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(8 * ncols), len(where), [None, pa.py_buffer(keys)])
    long_enc = pc.dictionary_encode(fixed)
    long_keys = np.frombuffer(long_enc.dictionary.buffers()[1], _U64)[:len(long_enc.dictionary) * ncols]
    # key 0 (the long tokens; a real key has a non-zero byte) gives its slot to the first long
    # token; the other long tokens follow the short ones
    hole = int(np.flatnonzero(short_keys == 0)[0])
    li = _int32(long_enc.indices)
    indices[where] = np.where(li == 0, np.int32(hole), li + np.int32(len(short_keys) - 1))
    short_strings = _decode_keys(short_keys.reshape(-1, 1))
    long_strings = _decode_keys(long_keys.reshape(-1, ncols))
    dictionary = pa.concat_arrays([short_strings[:hole], long_strings[:1], short_strings[hole + 1:], long_strings[1:]])
    return dictionary, indices


def _int32(indices: pa.Array) -> NDArray[np.int32]:
    out: NDArray[np.int32] = indices.to_numpy().astype(np.int32, copy=False)
    return out


def _decode_keys(keys: NDArray[np.uint64]) -> pa.Array:
    """Keys back to strings: a token's bytes, then zeros (the data has no NUL byte)."""
    raw = np.ascontiguousarray(keys).view(np.uint8).reshape(len(keys), -1)
    nonzero = raw != 0
    lengths = nonzero.sum(axis=1)
    chars = raw[nonzero]
    offsets = np.zeros(len(keys) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.StringArray.from_buffers(len(keys), pa.py_buffer(offsets), pa.py_buffer(chars))
