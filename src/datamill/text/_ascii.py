"""Numpy fast paths for ASCII text files (char codes, whitespace words), same results as the Arrow path.

Tests check them against the general (Arrow) path with hypothesis.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.ascii import token_dictionary

__all__ = ["ascii_char_codes", "ascii_words"]

_LOWER = np.arange(256, dtype=np.uint8)
_LOWER[ord("A"):ord("Z") + 1] += 32
_WS = np.zeros(256, dtype=bool)
_WS[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True  # the ASCII characters str.split() splits on


def ascii_char_codes(data: bytes, *, lowercase: bool, one_document: bool
                      ) -> tuple[NDArray[np.uint8], NDArray[np.int64], NDArray[np.uint8]]:
    """Raw character codes + line offsets of ASCII text, and the code -> normalised code table.

    The normalisation (lower-casing; whitespace -> ``" "``) is not applied to the codes: it is folded
    into the count and id tables (256 entries), which saves two passes over the text.
    ``one_document=True``: the seed's ``' '.join(' '.join(lines).split())``; otherwise one line per
    document without its ``\n`` (and one ``\r``), whitespace kept.
    """
    b = np.frombuffer(data, np.uint8)
    canon = _LOWER.copy() if lowercase else np.arange(256, dtype=np.uint8)
    if one_document:
        canon[_WS] = 32
        m = _WS[b]
        keep = ~m
        keep[1:] |= m[1:] & ~m[:-1]  # the first of each whitespace run
        if not m.all():  # trim both ends (argmax stops at the first non-whitespace byte)
            keep[:int(np.argmax(~m))] = False
            keep[len(m) - int(np.argmax(~m[::-1])):] = False
        out = b[keep]  # (np.compress is faster but makes an int64 index array: 8 bytes per byte)
        return out, np.array([0, len(out)], np.int64), canon
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
    """``str.split()`` words of every line of ASCII text, dictionary-encoded, and the line offsets (numpy)."""
    b = np.frombuffer(data, np.uint8)
    if lowercase:
        b = _LOWER[b]
    n = len(b)
    word = np.empty(n, bool)  # not whitespace: built per 1 MB so the temporaries stay small and warm
    for i in range(0, n, 1 << 20):
        bc, wc = b[i:i + (1 << 20)], word[i:i + (1 << 20)]
        np.greater(bc, 32, out=wc)  # then the rarer word bytes below the space: controls other than \t\n\v\f\r, \x1c-\x1f
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
    offs = np.zeros(len(starts) + 1, np.int64)  # a word longer than the keys hold: strings, dictionary-encoded
    np.cumsum(lengths, out=offs[1:])
    chars = b[~_WS[b]]
    if offs[-1] < 2**31:
        words = pa.StringArray.from_buffers(len(starts), pa.py_buffer(offs.astype(np.int32)), pa.py_buffer(chars))
    else:
        words = pa.LargeStringArray.from_buffers(len(starts), pa.py_buffer(offs), pa.py_buffer(chars))
    return pc.dictionary_encode(words), line_off
