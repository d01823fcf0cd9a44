"""Near-duplicate text: MinHash signatures over word shingles, banded LSH, all vectorised.

* **Tokens**: words split on whitespace and lower-cased (``utf8_lower``). The lower-cased bytes
  are split on ASCII whitespace (after a regex turns Unicode spaces into ASCII ones, when there
  are any) and each word is hashed from its bytes read as 8-byte words, with no string per word.
* **Shingles**: ``shingle`` consecutive tokens of a row, as one ``uint64`` polynomial of the token
  hashes; a row shorter than that gives one shingle of all its tokens.
* **MinHash**: one-permutation hashing. Each shingle is hashed once with a salt from ``seed``; the
  top bits choose one of ``num_perm`` bins and a row keeps the minimum per bin
  (``np.minimum.at``). A bin that got no shingle takes the value of the next full bin to its
  right, plus a constant times the distance (densification by rotation, Shrivastava & Li 2014),
  so two rows agree on a bin with probability equal to the Jaccard similarity of their sets.
* **LSH**: rows agreeing on every value of a band of ``num_perm / bands`` values are candidates
  (one sort per band); a pair is kept when the share of equal values reaches ``threshold``.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat
from numpy.typing import NDArray

from datamill.core.ascii import ASCII_WHITESPACE
from datamill.core.errors import ConfigError
from datamill.core.rng import rng_for
from datamill.lineage.rowhash import column_hash, mix64

__all__ = ["minhash", "near_duplicates", "signatures", "token_hashes", "token_ids"]

U64 = NDArray[np.uint64]
I64 = NDArray[np.int64]
BLOCK_BYTES = 1 << 19
"""Text per block of :func:`signatures` (about half a MiB: its token arrays stay in cache)."""
MAX_PAIRS = 64
"""Candidate training rows kept per validation/test row and LSH band (a bucket of many equal
rows)."""
_MUL = np.uint64(0x100000001B3)
_ROTATE = np.uint64(0x9E3779B97F4A7C15)
_MASK = np.array([(1 << (8 * m)) - 1 for m in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


def token_ids(column: pa.Array | pa.ChunkedArray, /) -> tuple[I64, I64]:
    """``(values, offsets)`` of each row's tokens as int64 ids: words of a string column (split on
    whitespace, lower-cased; ids in order of first appearance), or the ids of an integer list
    column as they are.

    Examples:
        >>> v, o = token_ids(pa.array(["a b a", "", "B c"]))
        >>> o.tolist(), v.tolist()
        ([0, 3, 3, 5], [0, 1, 0, 1, 2])
    """
    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pat.is_string(col.type) or pat.is_large_string(col.type):
        hashes, offsets = token_hashes(col)
        ids = pc.dictionary_encode(pa.array(hashes)).indices.to_numpy(zero_copy_only=False)
        return np.asarray(ids, dtype=np.int64), offsets
    if pat.is_list(col.type) or pat.is_large_list(col.type):
        col = col.fill_null([])
        offsets = np.asarray(col.offsets, dtype=np.int64)
        values = np.asarray(col.values.to_numpy(zero_copy_only=False), dtype=np.int64)[
            offsets[0] : offsets[-1]
        ]
        return values, offsets - offsets[0]
    if pat.is_fixed_size_list(col.type):
        size = col.type.list_size
        values = np.asarray(col.flatten().to_numpy(zero_copy_only=False), dtype=np.int64)
        return values, np.arange(len(col) + 1, dtype=np.int64) * size
    raise ConfigError(f"near-duplicate checks need a text or token-id column, got {col.type}")


def token_hashes(column: pa.Array | pa.ChunkedArray, /) -> tuple[U64, I64]:
    """``(values, offsets)`` of each row's tokens as uint64 values equal for equal tokens.

    The tokens of :func:`token_ids`: whitespace-split, lower-cased words (``str.lower().split()``
    up to Arrow's ``utf8_lower``), or a list column's ids. Text is split from its bytes and each
    word keyed by its bytes (a word of up to 8 bytes is its own key; a longer one a hash of its
    8-byte pieces), without building a string per word.

    Examples:
        >>> v, o = token_hashes(pa.array(["a b a", None, "B c"]))
        >>> o.tolist(), bool(v[0] == v[2] and v[1] == v[3]), bool(v[0] == v[1])
        ([0, 3, 3, 5], True, False)
    """
    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not (pat.is_string(col.type) or pat.is_large_string(col.type)):
        values, offsets = token_ids(col)
        return values.astype(np.uint64), offsets
    data, starts, lengths, offsets = _byte_spans(col)
    h = _eight_bytes(data, starts)
    h &= _MASK[np.minimum(lengths, 8)]
    long_ = np.flatnonzero(lengths > 8)
    if len(long_):  # each word's further 8-byte pieces, as many as it has (so: its bytes only)
        hl = mix64(h[long_] ^ lengths[long_].astype(np.uint64))
        at, pos, rest = np.arange(len(long_)), starts[long_] + 8, lengths[long_] - 8
        while len(at):
            w = _eight_bytes(data, pos)
            w &= _MASK[np.minimum(rest, 8)]
            hl[at] = mix64(hl[at] * _MUL + w)
            more = rest > 8
            at, pos, rest = at[more], pos[more] + 8, rest[more] - 8
        h[long_] = hl | np.uint64(1 << 63)  # apart from most short words (ASCII: top bit 0)
    return h, offsets


def _eight_bytes(data: NDArray[np.uint8], at: I64) -> U64:
    """The 8 bytes from each of the sorted positions ``at`` as a little-endian uint64 (zeros past
    the end): a strided view of the bytes; the last few positions read the last 8 bytes, shifted.
    """
    n = len(data)
    if n < 8:
        data = np.concatenate([data, np.zeros(8 - n, dtype=np.uint8)])
    last = len(data) - 8
    view = np.ndarray(shape=(last + 1,), dtype="<u8", buffer=data, strides=(1,))
    out: U64 = view[np.minimum(at, last)]
    over = int(np.searchsorted(at, last, side="right"))
    out[over:] >>= ((at[over:] - last) * 8).astype(np.uint64)  # (a shift of 64 or more gives 0)
    return out


_UNICODE_SPACES = "[\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
"""The characters besides ASCII whitespace that ``str.split()`` and ``utf8_split_whitespace``
split on (Unicode Zs and bidi classes WS, B, S)."""


def _unicode_space_at(data: NDArray[np.uint8]) -> bool:
    """Does UTF-8 ``data`` hold one of :data:`_UNICODE_SPACES`? (Their byte sequences, checked at
    the few bytes >= 0xC2.)"""
    if not len(data) or int(data.max()) < 0xC2:
        return False
    at = np.flatnonzero(data >= 0xC2)
    padded = np.concatenate([data[at[0] :], np.zeros(3, np.uint8)])  # (bytes after the last)
    at -= at[0]
    b0, b1, b2 = padded[at], padded[at + 1], padded[at + 2]
    found = (b0 == 0xC2) & ((b1 == 0x85) | (b1 == 0xA0))
    found |= (b0 == 0xE1) & (b1 == 0x9A) & (b2 == 0x80)
    found |= (b0 == 0xE2) & (b1 == 0x80) & (((b2 >= 0x80) & (b2 <= 0x8A)) | np.isin(b2, _E280))
    found |= (b0 == 0xE2) & (b1 == 0x81) & (b2 == 0x9F)
    found |= (b0 == 0xE3) & (b1 == 0x80) & (b2 == 0x80)
    return bool(found.any())


_E280 = np.array([0xA8, 0xA9, 0xAF], dtype=np.uint8)  # U+2028, U+2029, U+202F after E2 80


def _byte_spans(col: pa.Array) -> tuple[NDArray[np.uint8], I64, I64, I64]:
    """``(lower-cased bytes, word starts, word lengths, word offsets per row)`` of text.

    Unicode spaces become ASCII spaces first (a regex replace, only when there is one;
    ``utf8_split_whitespace`` is not used: pyarrow 26 sometimes returns a word of a trailing
    no-break space, run to run). UTF-8 never uses a byte below 0x80 inside a multi-byte character,
    so the bytes then split exactly on ASCII whitespace: words are the runs of bytes above 32 (and
    of the few control bytes that are not whitespace), cut at the ends of rows.
    """
    col = pc.utf8_lower(col.fill_null("") if col.null_count else col)
    large = pat.is_large_string(col.type)
    off = np.frombuffer(
        col.buffers()[1], dtype=np.int64 if large else np.int32, count=col.offset + len(col) + 1
    )[col.offset :]
    buf = col.buffers()[2]
    data = np.frombuffer(buf, dtype=np.uint8) if buf is not None else np.zeros(0, np.uint8)
    data = data[int(off[0]) : int(off[-1])]
    if _unicode_space_at(data):
        return _byte_spans(pc.replace_substring_regex(col, _UNICODE_SPACES, " "))
    rel = (off - off[0]).astype(np.int64)
    n = len(data)
    word = np.greater(data, 32)  # a byte of a word
    if n and int(data.min()) < 32:  # control bytes: whitespace or not, by the table
        low = np.flatnonzero(data < 32)
        word[low] = ~ASCII_WHITESPACE[data[low]]
    first = np.empty(n, dtype=bool)  # a word starts at byte i
    np.greater(word[1:], word[:-1], out=first[1:])
    last = np.empty(n + 1, dtype=bool)  # a word ends before byte i
    np.greater(word[:-1], word[1:], out=last[1:n])
    if n:
        first[0], last[0], last[n] = word[0], False, word[-1]
    cuts = rel[1:-1][(rel[1:-1] > 0) & (rel[1:-1] < n)]  # row ends: a word never runs over one
    first[cuts], last[cuts] = word[cuts], word[cuts - 1]
    starts, ends = np.flatnonzero(first), np.flatnonzero(last)
    return data, starts, ends - starts, np.searchsorted(starts, rel).astype(np.int64)


def _shingles(values: U64, offsets: I64, k: int) -> tuple[U64, I64]:
    """``(hash, row)`` of every ``k`` consecutive tokens of each row (a shorter row: one shingle
    of all its tokens)."""
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    v = values.astype(np.uint64, copy=False)
    h = v.copy()
    for j in range(1, k):  # h[i] = sum(token[i + j] * M**j): a polynomial of the k tokens from i
        h[: len(v) - j] += v[j:] * np.uint64(pow(0x100000001B3, j, 1 << 64))
    count = np.maximum(lengths - k + 1, np.minimum(lengths, 1))  # shingles per row
    row = np.repeat(np.arange(n, dtype=np.int64), count)
    starts = np.zeros(len(v), dtype=bool)  # the tokens that start a shingle, in row order
    starts[offsets[0] : offsets[-1]] = True
    for j in range(1, k):  # not the last k - 1 of a row; of a shorter row, only its first
        starts[offsets[1:][lengths >= k] - j] = False
        starts[offsets[:-1][(lengths < k) & (lengths > j)] + j] = False
    out = h[starts]
    short = np.flatnonzero((lengths < k) & (lengths > 0))
    if len(short):  # those rows: the hash of their tokens only
        whole = column_hash(
            pa.LargeListArray.from_arrays(pa.array(offsets.astype(np.int64)), pa.array(v)).take(
                pa.array(short)
            )
        )
        out[(np.cumsum(count) - count)[short]] = whole
    return out, row


def minhash(
    values: NDArray[np.integer],
    offsets: I64,
    /,
    *,
    num_perm: int = 64,
    shingle: int = 3,
    seed: int = 0,
) -> U64:
    """MinHash signatures ``(rows, num_perm)`` over word shingles (one-permutation hashing).

    Empty rows get all-max signatures.

    Raises:
        ConfigError: ``num_perm`` is not a power of two >= 2.

    Examples:
        >>> text = ["the cat sat on the mat", "the cat sat on the mat", "a dog"]
        >>> v, o = token_ids(pa.array(text))
        >>> sig = minhash(v, o, num_perm=16)
        >>> bool((sig[0] == sig[1]).all()), bool((sig[0] == sig[2]).mean() < 0.5)
        (True, True)
    """
    if num_perm < 2 or num_perm & (num_perm - 1):
        raise ConfigError(f"num_perm must be a power of two >= 2, got {num_perm}")
    sh, row = _shingles(values.astype(np.uint64), offsets, shingle)
    n = len(offsets) - 1
    top = np.iinfo(np.uint64).max
    sig = np.full((n, num_perm), top, dtype=np.uint64)
    if not len(sh):
        return sig
    salt = np.uint64(int(rng_for(seed, "lineage.minhash").integers(0, 2**63)))
    hs = mix64(sh ^ salt)
    bits = num_perm.bit_length() - 1
    key = row * num_perm + (hs >> np.uint64(64 - bits)).astype(np.int64)
    hs >>= np.uint64(bits)  # the value: the bits below the bin's (top means "empty")
    np.minimum.at(sig.reshape(-1), key, hs)
    return _densify(sig)


def signatures(
    column: pa.Array | pa.ChunkedArray,
    /,
    *,
    num_perm: int = 64,
    shingle: int = 3,
    seed: int = 0,
    threads: int | None = None,
) -> U64:
    """:func:`minhash` of :func:`token_hashes` of a column, in row blocks on ``threads`` threads.

    Token hashes depend only on the word (no dictionary shared between blocks), so the blocks are
    independent and the result is the same for any ``threads``. Blocks hold about
    :data:`BLOCK_BYTES` of text each, so their arrays stay in the CPU's cache.

    Args:
        column: a text or token-id column.
        num_perm: MinHash values per row. Defaults to ``64``.
        shingle: tokens per shingle. Defaults to ``3``.
        seed: seeds the hash functions. Defaults to ``0``.
        threads: worker threads. Defaults to ``None`` (the machine's cores, at most 4).

    Examples:
        >>> col = pa.array(["the cat sat on the mat", "a dog", "the cat sat on the mat"] * 3)
        >>> bool((signatures(col, threads=1) == signatures(col, threads=3)).all())
        True
    """
    from datamill.core.parallel import ordered_map

    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    workers = min(4, os.cpu_count() or 1) if threads is None else max(1, threads)
    size = col.nbytes if pat.is_string(col.type) or pat.is_large_string(col.type) else 0
    blocks = max(1, min(len(col) // 200, size // BLOCK_BYTES))  # (the arrays of a block in cache)
    blocks = max(blocks, min(workers, len(col) // 2_000))
    bounds = np.linspace(0, len(col), blocks + 1).astype(np.int64).tolist()
    sig = np.empty((len(col), num_perm), dtype=np.uint64)

    def one(k: int) -> None:
        values, offsets = token_hashes(col.slice(bounds[k], bounds[k + 1] - bounds[k]))
        part = minhash(values, offsets, num_perm=num_perm, shingle=shingle, seed=seed)
        sig[bounds[k] : bounds[k + 1]] = part

    def share(w: int) -> None:  # one task a thread: every workers-th block
        for k in range(w, blocks, workers):
            one(k)

    for _ in ordered_map(share, range(min(workers, blocks)), threads=min(workers, blocks)):
        pass
    return sig


def _densify(sig: U64) -> U64:
    """Empty bins take the next full bin's value (circularly) plus a constant per step."""
    p = sig.shape[1]
    empty = sig == np.iinfo(np.uint64).max
    rows = np.flatnonzero(empty.any(axis=1) & ~empty.all(axis=1))
    if not len(rows):
        return sig
    sub = empty[rows]
    bins = np.arange(p, dtype=np.int16)
    big = np.int16(2 * p)
    nxt = np.minimum.accumulate(np.where(sub, big, bins)[:, ::-1], axis=1)[:, ::-1]
    nxt = np.where(nxt == big, nxt[:, :1] + np.int16(p), nxt)  # none to the right: wrap around
    block = sig[rows]
    vals = np.take_along_axis(block, (nxt & np.int16(p - 1)).astype(np.intp), axis=1)
    vals += (nxt - bins).astype(np.uint64) * _ROTATE
    sig[rows] = np.where(sub, vals, block)
    return sig


def near_duplicates(
    sig: U64, left: I64, right: I64, /, *, threshold: float = 0.8, bands: int | None = None
) -> tuple[I64, I64, NDArray[np.float64]]:
    """Pairs ``(row of right, row of left, estimated Jaccard)`` with similarity >= ``threshold``.

    Banded LSH over the signature columns finds candidates (rows agreeing on a whole band), then the
    share of equal signature values decides. ``bands`` defaults to a split suited to ``threshold``.
    """
    num_perm = sig.shape[1]
    if bands is None:
        bands = _bands_for(num_perm, threshold)
    r = num_perm // bands
    rows = np.concatenate([left, right])
    side = np.concatenate([np.zeros(len(left), bool), np.ones(len(right), bool)])
    block = sig[rows]
    live = ~(block == np.iinfo(np.uint64).max).all(axis=1)
    keys = np.zeros((len(rows), bands), dtype=np.uint64)
    for j in range(r):  # every band's key at once: a polynomial of its r values
        keys = keys * _MUL + block[:, j::r][:, :bands]
    keys = mix64(keys)
    keys &= ~np.uint64(1)  # the lowest bit says the side: one sort puts a bucket's left rows first
    keys |= side.astype(np.uint64)[:, None]
    found_r, found_l = [], []
    for b in range(bands):
        key = keys[:, b]
        order = np.argsort(key)
        k, sd = key[order] >> np.uint64(1), side[order]
        new = np.concatenate([[True], k[1:] != k[:-1]])
        group = np.cumsum(new) - 1
        gstart = np.flatnonzero(new)
        nleft = np.bincount(group, weights=~sd, minlength=len(gstart)).astype(np.int64)
        hit = np.flatnonzero(sd & live[order] & (nleft[group] > 0))
        if not len(hit):
            continue
        per = np.minimum(nleft[group[hit]], MAX_PAIRS)  # pairs per right row in this band (capped)
        first = np.repeat(gstart[group[hit]], per)
        step = np.arange(int(per.sum()), dtype=np.int64) - np.repeat(np.cumsum(per) - per, per)
        found_r.append(rows[order[np.repeat(hit, per)]])
        found_l.append(rows[order[first + step]])
    if not found_r:
        z = np.zeros(0, dtype=np.int64)
        return z, z, np.zeros(0)
    n = np.int64(sig.shape[0])
    pairs = np.sort(np.concatenate(found_r) * n + np.concatenate(found_l))
    pairs = pairs[np.concatenate([[True], pairs[1:] != pairs[:-1]])]  # (np.unique hashes: slower)
    cr, cl = pairs // n, pairs % n
    sim = np.empty(len(pairs))
    for s in range(0, len(pairs), 4096):  # the share of equal values, a block of pairs at a time
        equal = sig[cr[s : s + 4096]] == sig[cl[s : s + 4096]]
        sim[s : s + 4096] = np.count_nonzero(equal, axis=1) / num_perm
    keep = sim >= threshold
    return cr[keep], cl[keep], sim[keep]


def _bands_for(num_perm: int, threshold: float) -> int:
    """The band count whose LSH S-curve threshold ``(1/b)**(1/r)`` is closest below
    ``threshold``."""
    best, err = 1, 9.0
    for b in range(1, num_perm + 1):
        if num_perm % b:
            continue
        t = (1 / b) ** (1 / (num_perm // b))
        if t <= threshold and threshold - t < err:
            best, err = b, threshold - t
    return best
