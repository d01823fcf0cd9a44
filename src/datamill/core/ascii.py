r"""ASCII text kernels, written once: byte tables, the ``str.split()`` splitter, byte-class token
spans, and distinct tokens of a byte buffer without building strings.

Byte tables (256 entries, indexed by byte): :data:`ASCII_LOWER` (byte -> lower-cased byte),
:data:`ASCII_WHITESPACE` (exactly the ASCII bytes ``str.split()`` and ``utf8_split_whitespace``
split on: ``\t \n \v \f \r``, ``\x1c-\x1f`` and space), :data:`ASCII_WORD` (``[0-9A-Za-z_]``, the
word bytes of the ``space_punct`` tokenizer).

Splitters: :func:`ascii_words` (``str.split()`` words of every line, dictionary-encoded),
:func:`ascii_char_codes` (character codes + line offsets), :func:`ascii_token_spans` (tokens of
rows given by offsets: whitespace-separated runs, or word runs and single punctuation bytes).

A tokenizer's numpy fast path knows every token as ``(start, length)`` in one byte buffer. Making
a string array of the tokens and dictionary-encoding it hashes variable-length strings; instead,
:func:`token_dictionary` gathers each token's first 8 bytes as one unaligned little-endian
``uint64`` (bytes past the token's end zeroed by two shifts) and hashes those fixed-width keys with
Arrow; the few longer tokens get ``8 * ceil(length / 8)``-byte keys, hashed apart. With no NUL byte
in the data the keys are exact: no collision can merge two tokens. Tokens longer than
:data:`MAX_KEY_BYTES`, or data holding a NUL byte, are left to the caller's string path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

__all__ = [
    "ASCII_LOWER",
    "ASCII_WHITESPACE",
    "ASCII_WORD",
    "MAX_KEY_BYTES",
    "ascii_char_codes",
    "ascii_token_spans",
    "ascii_words",
    "token_dictionary",
]

ASCII_LOWER = np.arange(256, dtype=np.uint8)
"""Byte -> its lower-cased byte (``A-Z`` -> ``a-z``, every other byte unchanged)."""
ASCII_LOWER[ord("A") : ord("Z") + 1] += 32
ASCII_LOWER.flags.writeable = False

ASCII_WHITESPACE = np.zeros(256, dtype=bool)
r"""The ASCII bytes ``str.split()`` splits on (``\t\n\v\f\r``, ``\x1c-\x1f``, space)."""
ASCII_WHITESPACE[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True
ASCII_WHITESPACE.flags.writeable = False

ASCII_WORD = np.zeros(256, dtype=bool)
r"""Word bytes ``[0-9A-Za-z_]`` (regex ``\w`` on ASCII): the runs the ``space_punct`` tokenizer
keeps whole."""
ASCII_WORD[[ord(c) for c in "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"]] = (
    True
)
ASCII_WORD.flags.writeable = False

#: tokens up to this many bytes are keyed exactly; :func:`token_dictionary` returns None beyond
MAX_KEY_BYTES = 32

_U64 = np.dtype("<u8")
# keeping the low r bytes of a word (r = 0..8) is shifting left then right by 64 - 8r bits; a shift
# by 64 (r = 9: a token longer than the word) gives 0 in numpy
_SHIFT = np.array([64 - 8 * r for r in range(9)] + [64], np.uint8)


# long (62 lines, 19 of docstring): one vectorised kernel: tokens keyed by their bytes as uint64
# words, the short (<= 8 bytes) and then the long ones dictionary-encoded; the intermediate arrays
# feed each other and are freed as it goes
def token_dictionary(
    data: NDArray[np.uint8], starts: NDArray[np.int64], lengths: NDArray[np.int64]
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
    padded = np.concatenate(
        [data, np.zeros(MAX_KEY_BYTES + 8, np.uint8)]
    )  # every 8-byte read stays inside
    windows = np.ndarray(
        shape=(len(padded) - 7,), dtype=_U64, buffer=padded, strides=(1,)
    )  # unaligned, no copy

    def key_words(st: NDArray[np.int64], rest: NDArray[np.uint8]) -> NDArray[np.uint64]:
        """The 8 bytes at ``st`` keeping the first ``rest`` of them (0..8; 9 keeps none)."""
        words: NDArray[np.uint64] = windows[st]
        shift = np.take(
            _SHIFT, rest
        )  # uint8: mixed-type shifts cast in small buffers, no uint64 temporary
        np.left_shift(words, shift, out=words)
        np.right_shift(words, shift, out=words)
        return words

    rest = np.empty(n, np.uint8)
    np.minimum(lengths, 9, out=rest, casting="unsafe")
    first = key_words(
        starts, rest
    )  # tokens of <= 8 bytes: one exact uint64 key (no NUL bytes); longer: 0
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
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(8 * ncols), len(where), [None, pa.py_buffer(keys)]
    )
    long_enc = pc.dictionary_encode(fixed)
    long_keys = np.frombuffer(long_enc.dictionary.buffers()[1], _U64)[
        : len(long_enc.dictionary) * ncols
    ]
    # key 0 (the long tokens; a real key has a non-zero byte) gives its slot to the first long
    # token; the other long tokens follow the short ones
    hole = int(np.flatnonzero(short_keys == 0)[0])
    li = _int32(long_enc.indices)
    indices[where] = np.where(li == 0, np.int32(hole), li + np.int32(len(short_keys) - 1))
    short_strings = _decode_keys(short_keys.reshape(-1, 1))
    long_strings = _decode_keys(long_keys.reshape(-1, ncols))
    dictionary = pa.concat_arrays(
        [short_strings[:hole], long_strings[:1], short_strings[hole + 1 :], long_strings[1:]]
    )
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


def ascii_char_codes(
    data: bytes, *, lowercase: bool, one_document: bool
) -> tuple[NDArray[np.uint8], NDArray[np.int64], NDArray[np.uint8]]:
    """Raw character codes + line offsets of ASCII text, and the code -> normalised code table.

    The normalisation (lower-casing; whitespace -> ``" "``) is not applied to the codes: it is
    folded into the count and id tables (256 entries), which saves two passes over the text.
    ``one_document=True``: the seed's ``' '.join(' '.join(lines).split())``; otherwise one line per
    document without its ``\n`` (and one ``\r``), whitespace kept.
    """
    b = np.frombuffer(data, np.uint8)
    canon = ASCII_LOWER.copy() if lowercase else np.arange(256, dtype=np.uint8)
    if one_document:
        canon[ASCII_WHITESPACE] = 32
        m = ASCII_WHITESPACE[b]
        keep = ~m
        keep[1:] |= m[1:] & ~m[:-1]  # the first of each whitespace run
        if not m.all():  # trim both ends (argmax stops at the first non-whitespace byte)
            keep[: int(np.argmax(~m))] = False
            keep[len(m) - int(np.argmax(~m[::-1])) :] = False
        out = b[keep]  # (np.compress is faster but makes an int64 index array: 8 bytes per byte)
        return out, np.array([0, len(out)], np.int64), canon
    if len(b) == 0:  # one empty line (an index below would be out of bounds)
        return b, np.zeros(2, np.int64), canon
    nl = np.flatnonzero(b == 10)
    starts = np.concatenate([[0], nl + 1])
    ends = np.concatenate([nl, [len(b)]])
    if len(b) and b[-1] == 10:  # a final newline ends the last line; it does not start another
        starts, ends = starts[:-1], ends[:-1]
    keep = b != 10
    cr = ends[(ends > starts) & (b[np.maximum(ends - 1, 0)] == 13)] - 1
    keep[cr] = False
    lengths = ends - starts
    lengths[np.isin(ends - 1, cr)] -= 1
    offsets = np.zeros(len(starts) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return b[keep], offsets, canon


def ascii_words(data: bytes, *, lowercase: bool) -> tuple[pa.DictionaryArray, NDArray[np.int64]]:
    """``str.split()`` words of every line of ASCII text, dictionary-encoded, and the line offsets
    (numpy)."""
    b = np.frombuffer(data, np.uint8)
    if lowercase:
        b = ASCII_LOWER[b]
    n = len(b)
    word = np.empty(
        n, bool
    )  # not whitespace: built per 1 MB so the temporaries stay small and warm
    for i in range(0, n, 1 << 20):
        bc, wc = b[i : i + (1 << 20)], word[i : i + (1 << 20)]
        np.greater(
            bc, 32, out=wc
        )  # then the rarer word bytes below the space: controls other than \t\n\v\f\r, \x1c-\x1f
        wc |= (bc < 9) | ((bc > 13) & (bc < 28))
    w8 = word.view(np.int8)
    edge = np.empty(n + 1, np.int8)  # +1 where a word starts, -1 where it ended
    edge[0], edge[n] = (w8[0], -w8[-1]) if n else (0, 0)
    np.subtract(w8[1:], w8[:-1], out=edge[1:n])
    del word, w8
    mask = np.equal(edge, 1)  # one boolean buffer for the three searches
    starts = np.flatnonzero(mask)
    np.equal(edge, -1, out=mask)
    lengths = np.flatnonzero(mask)
    lengths -= starts
    del edge
    np.equal(b, 10, out=mask[:n])
    nl = np.flatnonzero(mask[:n])
    del mask
    if len(b) and b[-1] == 10:  # a final newline ends the last line
        nl = nl[:-1]
    line_off = np.concatenate([[0], np.searchsorted(starts, nl), [len(starts)]]).astype(np.int64)
    keyed = token_dictionary(b, starts, lengths)  # exact integer keys, no string per word
    if keyed is not None:
        dictionary, indices = keyed
        return pa.DictionaryArray.from_arrays(pa.array(indices), dictionary), line_off
    offs = np.zeros(
        len(starts) + 1, np.int64
    )  # a word longer than the keys hold: strings, dictionary-encoded
    np.cumsum(lengths, out=offs[1:])
    chars = b[~ASCII_WHITESPACE[b]]
    if offs[-1] < 2**31:
        words = pa.StringArray.from_buffers(
            len(starts), pa.py_buffer(offs.astype(np.int32)), pa.py_buffer(chars)
        )
    else:
        words = pa.LargeStringArray.from_buffers(
            len(starts), pa.py_buffer(offs), pa.py_buffer(chars)
        )
    return pc.dictionary_encode(words), line_off


def ascii_token_spans(
    data: NDArray[np.uint8], row_offsets: NDArray[np.integer[Any]], *, punct: bool = False
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Tokens of ASCII rows as byte spans: ``(starts, lengths, token offsets per row)``.

    Rows are ``data[row_offsets[i]:row_offsets[i + 1]]`` (offsets from 0). ``punct=False``: tokens
    are the runs of non-whitespace bytes (``str.split()``); ``punct=True``: runs of word bytes
    (:data:`ASCII_WORD`) and every other non-whitespace byte alone (the ``space_punct``
    tokenizer). A token never crosses a row boundary.

    Examples:
        >>> b = np.frombuffer(b"hi, you!ok", np.uint8)
        >>> s, n, o = ascii_token_spans(b, np.array([0, 8, 10]), punct=True)
        >>> [bytes(b[x:x + k]).decode() for x, k in zip(s, n)], o.tolist()
        (['hi', ',', 'you', '!', 'ok'], [0, 4, 5])
    """
    rel = np.asarray(row_offsets, dtype=np.int64)
    cls = _CLASSES[punct][data]
    nonempty = rel[:-1] != rel[1:]
    change = np.empty(
        len(data) + 1, bool
    )  # class differs between byte i-1 and byte i, or a row boundary
    change[0] = change[-1] = True
    np.not_equal(cls[1:], cls[:-1], out=change[1:-1])
    change[rel[:-1][nonempty]] = True
    change[rel[1:][nonempty]] = True
    tok = cls != 0
    single = cls == 2  # punctuation: one token per byte
    starts = np.flatnonzero(tok & (change[:-1] | single))
    ends = np.flatnonzero(tok & (change[1:] | single)) + 1
    return (
        starts.astype(np.int64),
        (ends - starts).astype(np.int64),
        np.searchsorted(starts, rel).astype(np.int64),
    )


# byte classes: 0 whitespace, 1 a byte of a run token, 2 a single-byte token (punctuation)
_CLASSES = {
    False: np.where(ASCII_WHITESPACE, 0, 1).astype(np.uint8),
    True: np.where(ASCII_WHITESPACE, 0, np.where(ASCII_WORD, 1, 2)).astype(np.uint8),
}
