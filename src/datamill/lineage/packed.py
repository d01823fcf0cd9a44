"""Exact codes of Arrow columns, packed side by side into a few ``uint64`` words per row.

A column's **codes** are one or more unsigned integer arrays with a bit width each, such that two
rows of the column hold equal values exactly when all their codes are equal:

* integers, dates and times: the value minus the column's minimum (``bits`` = the width of the
  range, often a handful); floats: their bits; booleans: one bit;
* strings and binaries of at most 12 bytes (the common categorical case): their bytes, read
  from Arrow's string-view layout, where such strings are stored inline and zero-padded (a code
  per 4 bytes, as wide as the longest string needs; plus the length if a zero byte occurs, since
  ``"a"`` and ``"a\\0"`` pad alike);
* dictionaries: their dictionary's codes taken by the indices; structs: their fields' codes;
* nulls: every code zeroed and one more bit for "valid".

A column that has none (lists, longer strings, wide fixed-size binaries) returns ``None`` and is
compared the slow exact way (:mod:`datamill.lineage.exact`). :func:`pack` fits the codes of all
columns into as few 64-bit words as it can (first fit, in column order), so comparing two rows
exactly is comparing a few words, and a row key is a mix of those words.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat
from numpy.typing import NDArray

from datamill.core.parallel import ordered_map

__all__ = ["Code", "column_codes", "mix_words", "pack"]

U64 = NDArray[np.uint64]
INLINE = 12
"""Longest string Arrow's view layout keeps inline (zero-padded) in its 16-byte view."""
_K = np.uint64(0xBF58476D1CE4E5B9)


class Code(NamedTuple):
    """An exact code of a column: ``values - low``, every one below ``2 ** bits``.

    ``values`` are unsigned (then the subtraction wraps at ``2 ** 64``; 8-byte signed values are
    viewed as unsigned, which wraps alike), or narrower signed integers (sign-extended).
    """

    values: NDArray[Any]
    bits: int
    low: int = 0

    def as_uint64(self) -> U64:
        """The code's values as a new ``uint64`` array."""
        out = np.empty(len(self.values), dtype=np.uint64)
        _shifted(self, out, 0)
        out -= np.uint64(self.low % (1 << 64))
        return out


def _shifted(code: Code, out: U64, shift: int) -> None:
    """``out = values << shift``, wrapping at ``2 ** 64`` (without ``low``)."""
    if code.values.dtype.kind == "i":  # (a cast to uint64 sign-extends, modulo 2 ** 64)
        np.copyto(out, code.values, casting="unsafe")
        if shift:
            out <<= np.uint64(shift)
    else:
        np.left_shift(code.values, np.uint64(shift), out=out, casting="unsafe")


def _validity(arr: pa.Array) -> NDArray[np.bool_]:
    """The validity bitmap as bools (one ``unpackbits``)."""
    bits = np.frombuffer(arr.buffers()[0], dtype=np.uint8)
    unpacked = np.unpackbits(bits, count=arr.offset + len(arr), bitorder="little")
    return unpacked[arr.offset :].view(bool)


def column_codes(arr: pa.Array) -> list[Code] | None:
    """The exact codes of a column (``None``: it has none; compare it another way).

    Examples:
        >>> [(c.as_uint64().tolist(), c.bits) for c in column_codes(pa.array(["ab", "c", "ab"]))]
        [([25185, 99, 25185], 16)]
        >>> [(c.as_uint64().tolist(), c.bits) for c in column_codes(pa.array([7, 9, None]))]
        [([0, 2, 0], 2), ([1, 1, 0], 1)]
    """
    if pat.is_null(arr.type):
        return []
    codes = _value_codes(arr)
    if codes is None or not arr.null_count:
        return codes
    valid = _validity(arr)
    fill = [c.values.dtype.type(c.low) for c in codes]  # (code 0 for a null)
    return [c._replace(values=np.where(valid, c.values, f)) for c, f in zip(codes, fill)] + [
        Code(valid.view(np.uint8), 1)
    ]


def _value_codes(arr: pa.Array) -> list[Code] | None:
    """:func:`column_codes` before the nulls are marked."""
    typ = arr.type
    if pat.is_dictionary(typ):
        inner = column_codes(arr.dictionary)
        if inner is None:
            return None
        idx = np.asarray(arr.indices.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        return [c._replace(values=c.values[idx]) for c in inner]
    if pat.is_struct(typ):
        codes: list[Code] = []
        for child in arr.flatten():  # (the struct's nulls are merged into its fields')
            sub = column_codes(child)
            if sub is None:
                return None
            codes += sub
        return codes
    if pat.is_string(typ) or pat.is_large_string(typ):
        return _inline_codes(arr, pa.string_view())
    if pat.is_binary(typ) or pat.is_large_binary(typ):
        return _inline_codes(arr, pa.binary_view())
    return _fixed_codes(arr)


def _fixed_codes(arr: pa.Array) -> list[Code] | None:
    """Numbers, dates, booleans: range-coded integers, or bits (floats, wide fixed types)."""
    typ = arr.type
    if pat.is_boolean(typ):
        arr = pc.cast(arr, pa.uint8())
        typ = arr.type
    try:
        bit_width = typ.bit_width
    except ValueError:  # lists, maps, unions: no fixed width
        return None
    width = bit_width // 8 if bit_width and bit_width % 8 == 0 else 0
    if width not in (1, 2, 4, 8) and not (width > 8 and width % 8 == 0):
        return None
    raw = np.frombuffer(arr.buffers()[1], dtype=np.uint8, count=(arr.offset + len(arr)) * width)
    raw = raw[arr.offset * width :]
    if width > 8:  # decimals, wide fixed-size binaries: their 8-byte words
        words = raw.view("<u8").reshape(len(arr), width // 8)
        return [Code(words[:, k], 64) for k in range(width // 8)]
    if not (pat.is_integer(typ) or pat.is_temporal(typ)):
        return [Code(raw.view(f"<u{width}"), 8 * width)]  # floats: bits (0.0 and -0.0 differ)
    return _range_codes(arr, raw, width)


def _range_codes(arr: pa.Array, raw: NDArray[np.uint8], width: int) -> list[Code]:
    """Integers and dates as offsets from their smallest value, in as few bits as they need."""
    signed = not pat.is_unsigned_integer(arr.type)
    values = raw.view(f"<i{width}" if signed else f"<u{width}")
    seen = values[_validity(arr)] if arr.null_count else values
    if not len(seen):
        return []
    lo, hi = int(seen.min()), int(seen.max())
    if hi == lo:
        return []  # one value: nothing to tell apart
    if width == 8 or lo >= 0:  # (unsigned arithmetic modulo 2 ** 64 is exact for these)
        return [Code(raw.view(f"<u{width}"), (hi - lo).bit_length(), lo % (1 << 64))]
    return [Code(values, (hi - lo).bit_length(), lo)]


def _inline_codes(arr: pa.Array, view: pa.DataType) -> list[Code] | None:
    """Strings of at most :data:`INLINE` bytes, from their views (zero-padded bytes), exact.

    The padded bytes alone tell strings apart unless one holds a zero byte (``"a"``, ``"a\\0"``):
    then the length is a code too.
    """
    try:
        views = pc.cast(arr, view)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # pragma: no cover - old pyarrow
        return None
    n = len(views)
    if not n:
        return []
    buf = views.buffers()[1]
    length = np.ndarray((n,), dtype="<u4", buffer=buf, offset=16 * views.offset, strides=(16,))
    longest = int(length.max())
    if longest > INLINE:
        return None
    words = np.frombuffer(buf, dtype="<u4", count=4 * (views.offset + n))[4 * views.offset :]
    words = words.reshape(n, 4)  # length, bytes 0-3, bytes 4-7, bytes 8-11 (aligned reads)
    codes = [  # (copies: one pass over the views while they are in cache, which are then freed)
        Code(words[:, 1 + k].copy(), 8 * min(4, longest - 4 * k)) for k in range((longest + 3) // 4)
    ]
    data = arr.buffers()[2]
    if data is not None and not np.frombuffer(data, dtype=np.uint8).all():  # a zero byte
        codes.append(Code(length.copy(), longest.bit_length()))
    return [c for c in codes if c.bits > 0]


def pack(codes: list[Code], /, *, threads: int = 1) -> list[U64]:
    """Codes side by side in as few ``uint64`` words as first fit gives (a code of 64 bits alone).

    Two rows are equal in every code exactly when they are equal in every word. The words are
    built on ``threads`` threads (the result does not depend on it).

    Examples:
        >>> a, b = np.array([1, 2], np.uint64), np.array([3, 0], np.uint8)
        >>> [w.tolist() for w in pack([Code(a, 2), Code(b, 2)])]
        [[13, 2]]
    """
    bins: list[list[Code]] = []
    used: list[int] = []
    for code in codes:
        if code.bits == 0:
            continue
        for j, u in enumerate(used):
            if u + code.bits <= 64:
                bins[j].append(code)
                used[j] += code.bits
                break
        else:
            bins.append([code])
            used.append(code.bits)
    groups = [bins[k::threads] for k in range(max(1, threads))]  # (one task a thread)
    parts = list(ordered_map(lambda g: [_one_word(b) for b in g], groups, threads=threads))
    return [parts[i % len(groups)][i // len(groups)] for i in range(len(bins))]


def _one_word(codes: list[Code]) -> U64:
    """The codes' sum, each shifted to its place: fields do not overlap, so it is their OR, and the
    lows are subtracted once."""
    word = np.empty(len(codes[0].values), dtype=np.uint64)
    _shifted(codes[0], word, 0)
    part = np.empty_like(word) if len(codes) > 1 else word
    shift, low = codes[0].bits, codes[0].low
    for code in codes[1:]:
        _shifted(code, part, shift)
        word += part
        low += code.low << shift
        shift += code.bits
    if low % (1 << 64):
        word -= np.uint64(low % (1 << 64))
    return word


def mix_words(words: list[U64], n: int, /) -> U64:
    """One unfinished ``uint64`` per row from ``words`` (xor, multiply, a shift every 4 words)."""
    h = np.zeros(n, dtype=np.uint64)
    for i, w in enumerate(words):
        h ^= w
        h *= _K
        if i % 4 == 3:
            h ^= h >> np.uint64(29)
    return h
