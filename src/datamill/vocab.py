"""The one vocabulary of datamill: frequency-ordered ids, special tokens, vectorised encode/decode.

Every capability (typed preprocessing, text corpora, word2vec...) uses this class and saves it in
the same JSON shape as Ludwig's metadata: ``idx2str``, ``str2idx``, ``str2freq``, ``vocab_size``.

Id order: the special tokens first, in the order given; then the other tokens by **descending
frequency, ties broken by ascending token (Unicode code point order)**. That rule depends only on
the counts, never on the order rows were seen, so counts fitted per block (Ray) and merged give the
same vocabulary as one pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.checks import MAX_SIZE, check_int
from datamill.core.errors import CacheError, ConfigError
from datamill.core.io import PathLike, atomic_write

__all__ = ["TokenCounts", "Vocab", "count_tokens"]

ArrayLike: TypeAlias = "pa.Array | pa.ChunkedArray | np.ndarray[Any, Any] | Sequence[str]"


def _as_arrow(values: Any) -> pa.Array | pa.ChunkedArray:
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values
    if isinstance(values, np.ndarray):
        return (
            pa.array(values.ravel(), type=pa.string())
            if values.dtype.kind in "OUS"
            else pa.array(values.ravel())
        )
    return pa.array(list(values), type=pa.string())


@dataclass(frozen=True)
class TokenCounts:
    """Mergeable token counts: the statistics a vocabulary is fitted from.

    ``tokens`` is a pyarrow string array of distinct tokens, ``counts`` their int64 counts.
    Counts from separate blocks combine with :meth:`merge` (used by the Ray backend).

    Examples:
        >>> a = count_tokens(["a", "b", "a"]); b = count_tokens(["b", "c"])
        >>> sorted(zip(a.merge(b).tokens.to_pylist(), a.merge(b).counts.tolist()))
        [('a', 2), ('b', 2), ('c', 1)]
    """

    tokens: pa.Array
    counts: NDArray[np.int64]

    @property
    def total(self) -> int:
        """Number of tokens counted."""
        return int(self.counts.sum())

    def merge(self, *others: TokenCounts) -> TokenCounts:
        """Sum these counts with ``others``."""
        parts = (self, *others)
        table = pa.table(
            {
                "token": pa.concat_arrays([p.tokens.cast(pa.string()) for p in parts]),
                "count": pa.array(np.concatenate([p.counts for p in parts]), pa.int64()),
            }
        )
        agg = table.group_by("token").aggregate([("count", "sum")])
        return TokenCounts(
            agg.column("token").combine_chunks(),
            agg.column("count_sum").to_numpy().astype(np.int64),
        )

    def as_dict(self) -> dict[str, int]:
        """``{token: count}``."""
        return dict(zip(self.tokens.to_pylist(), self.counts.tolist()))


def count_tokens(values: ArrayLike) -> TokenCounts:
    """Count the distinct non-null strings of ``values`` with ``pyarrow.compute.value_counts``."""
    arr = _as_arrow(values)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = arr.cast(pa.string())
    arr = arr.drop_null()
    if len(arr) == 0:
        return TokenCounts(pa.array([], pa.string()), np.zeros(0, np.int64))
    vc = pc.value_counts(arr)
    return TokenCounts(
        vc.field("values"), vc.field("counts").to_numpy(zero_copy_only=False).astype(np.int64)
    )


def _tokens(value: Any) -> bool:
    return not isinstance(value, (str, bytes)) and isinstance(value, Sequence)


_ARGUMENTS: tuple[tuple[str, Callable[[Any], bool], str, str | None], ...] = (
    (
        "idx2str",
        _tokens,
        "idx2str must be a list of tokens, got {type}",
        "pass the tokens in id order, e.g. Vocab(['<PAD>', '<UNK>', 'a'])",
    ),
    (
        "str2freq",
        lambda v: v is None or isinstance(v, Mapping),
        "str2freq must map tokens to counts, got {type}",
        "pass a dict such as {'a': 3}, or leave it out (all counts 0)",
    ),
    (
        "unk_token",
        lambda v: v is None or isinstance(v, str),
        "unk_token must be a token (str), got {value!r:.60}",
        None,
    ),
    (
        "specials",
        lambda v: _tokens(v) and all(isinstance(t, str) for t in v),
        "specials must be a list of tokens (str), got {value!r:.60}",
        None,
    ),
)
"""The declared rules of :class:`Vocab`'s arguments: ``(name, valid?, message, hint)``."""


class Vocab:
    """A frequency-ordered vocabulary with special tokens.

    Args:
        idx2str: the tokens, id order (specials included, first).
        str2freq: counts per token. Defaults to ``None`` (all zero).
        unk_token: the token unknown strings map to, or ``None`` to make unknowns an error.
            Defaults to ``None``.
        specials: which of ``idx2str`` are special tokens. Defaults to ``()``.

    Examples:
        >>> v = Vocab.build(
        ...     "the cat sat on the mat the end".split(), specials=["<unk>"], unk_token="<unk>"
        ... )
        >>> v.idx2str[:3], len(v)
        (['<unk>', 'the', 'cat'], 7)
        >>> v[["the", "dog"]]
        [1, 0]
        >>> v.decode(v.encode(np.array(["mat", "the"]))).tolist()
        ['mat', 'the']
    """

    def __init__(
        self,
        idx2str: Sequence[str],
        *,
        str2freq: dict[str, int] | None = None,
        unk_token: str | None = None,
        specials: Sequence[str] = (),
    ) -> None:
        given = {"idx2str": idx2str, "str2freq": str2freq, "unk_token": unk_token}
        for name, ok, message, hint in _ARGUMENTS:
            value = specials if name == "specials" else given[name]
            if not ok(value):
                raise ConfigError(message.format(type=type(value).__name__, value=value), hint=hint)
        self.idx2str: list[str] = [str(t) for t in idx2str]
        self.str2idx: dict[str, int] = {t: i for i, t in enumerate(self.idx2str)}
        if len(self.str2idx) != len(self.idx2str):
            dupes = sorted({t for t in self.idx2str if self.idx2str.count(t) > 1})
            raise ConfigError(f"vocabulary has duplicate tokens: {dupes[:10]}")
        freq = str2freq or {}
        try:
            self.str2freq: dict[str, int] = {t: int(freq.get(t, 0)) for t in self.idx2str}
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"str2freq must map tokens to whole counts: {exc}") from None
        if unk_token is not None and unk_token not in self.str2idx:
            raise ConfigError(f"unk_token {unk_token!r} is not in the vocabulary")
        self.unk_token = unk_token
        self.specials: list[str] = list(specials)
        self._arrow = pa.array(self.idx2str, pa.string())
        self._np = np.asarray(self.idx2str, dtype=object)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        tokens: ArrayLike | Iterable[str],
        *,
        min_freq: int = 1,
        max_size: int | None = None,
        specials: Sequence[str] = ("<PAD>", "<UNK>"),
        unk_token: str | None = "<UNK>",
    ) -> Vocab:
        """Count ``tokens`` (a whole array at once) and build the vocabulary.

        Args:
            tokens: the token occurrences (pyarrow/numpy array or any iterable of strings).
            min_freq: tokens seen fewer times are left out (they map to ``unk_token``). Defaults to
                ``1``.
            max_size: keep at most this many regular tokens (specials not counted), the most
                frequent. Defaults to ``None`` (no limit).
            specials: special tokens placed first. Defaults to ``("<PAD>", "<UNK>")``.
            unk_token: the unknown token (must be among ``specials``), or ``None``. Defaults to
                ``"<UNK>"``.
        """
        if not isinstance(tokens, (pa.Array, pa.ChunkedArray, np.ndarray, list, tuple)):
            tokens = list(tokens)
        return cls.from_counts(
            count_tokens(tokens),
            min_freq=min_freq,
            max_size=max_size,
            specials=specials,
            unk_token=unk_token,
        )

    @classmethod
    def from_counts(
        cls,
        counts: TokenCounts,
        *,
        min_freq: int = 1,
        max_size: int | None = None,
        specials: Sequence[str] = ("<PAD>", "<UNK>"),
        unk_token: str | None = "<UNK>",
    ) -> Vocab:
        """Build from (possibly merged) :class:`TokenCounts`; see :meth:`build` for the
        arguments."""
        check_int(min_freq, name="min_freq", low=1)
        if max_size is not None:
            MAX_SIZE(max_size)
        if unk_token is not None and unk_token not in specials:
            specials = (*specials, unk_token)
        table = pa.table(
            {"token": counts.tokens.cast(pa.string()), "count": pa.array(counts.counts, pa.int64())}
        )
        if len(specials):
            table = table.filter(
                pc.invert(pc.is_in(table["token"], value_set=pa.array(list(specials), pa.string())))
            )
        table = table.filter(pc.greater_equal(table["count"], min_freq))
        order = pc.sort_indices(table, sort_keys=[("count", "descending"), ("token", "ascending")])
        if max_size is not None:
            order = order[:max_size]
        table = table.take(order)
        regular = table["token"].to_pylist()
        freq = dict(zip(regular, table["count"].to_pylist()))
        all_counts = counts.as_dict() if len(specials) else {}
        for s in specials:
            freq[s] = all_counts.get(s, 0)
        return cls([*specials, *regular], str2freq=freq, unk_token=unk_token, specials=specials)

    # -- lookup -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.idx2str)

    def __contains__(self, token: object) -> bool:
        return token in self.str2idx

    def __repr__(self) -> str:
        head = ", ".join(repr(t) for t in self.idx2str[:5])
        return (
            f"Vocab(size={len(self)}, unk={self.unk_token!r}, "
            f"idx2str=[{head}{', ...' if len(self) > 5 else ''}])"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable-looking container: not hashable

    @property
    def unk_index(self) -> int | None:
        """Id of ``unk_token`` (``None`` when there is none)."""
        return None if self.unk_token is None else self.str2idx[self.unk_token]

    @overload
    def __getitem__(self, tokens: str) -> int: ...
    @overload
    def __getitem__(self, tokens: list[str] | tuple[str, ...]) -> list[int]: ...
    @overload
    def __getitem__(self, tokens: np.ndarray | pa.Array | pa.ChunkedArray) -> NDArray[np.int32]: ...
    def __getitem__(self, tokens: Any) -> Any:
        """Id of a token; list of ids for a list; int32 array for an array (vectorised)."""
        if isinstance(tokens, str):
            idx = self.str2idx.get(tokens, self.unk_index)
            if idx is None:
                raise KeyError(tokens)
            return idx
        if isinstance(tokens, (list, tuple)):
            return self.encode(pa.array(list(tokens), pa.string())).tolist()
        return self.encode(tokens)

    def encode(self, values: Any, *, dtype: Any = np.int32) -> NDArray[Any]:
        """Map a whole array of strings to ids in one ``pyarrow.compute.index_in`` call.

        Unknown strings and nulls map to ``unk_token``; without one they raise ``KeyError``.
        """
        arr = _as_arrow(values)
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            arr = arr.cast(pa.string())
        idx = pc.index_in(arr, value_set=self._arrow)
        if idx.null_count:
            if self.unk_index is None:
                missing = pc.filter(arr, pc.is_null(idx)).drop_null()
                raise KeyError(f"tokens not in the vocabulary: {missing[:5].to_pylist()}")
            idx = pc.fill_null(idx, self.unk_index)
        out = idx.to_numpy() if isinstance(idx, pa.Array) else idx.combine_chunks().to_numpy()
        result: NDArray[Any] = out.astype(dtype, copy=False)
        return result

    def decode(self, ids: Any) -> NDArray[np.object_]:
        """Tokens for an array of ids (any shape), as an object array of the same shape."""
        decoded: NDArray[np.object_] = self._np[np.asarray(ids, dtype=np.int64)]
        return decoded

    def to_tokens(self, ids: int | Sequence[int] | NDArray[Any]) -> Any:
        """d2l's name: a token for an id, a list of tokens for a list of ids."""
        if isinstance(ids, (int, np.integer)):
            return self.idx2str[int(ids)]
        return self.decode(ids).tolist()

    # -- persistence --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Ludwig-shaped JSON dict: ``idx2str``, ``str2idx``, ``str2freq``, ``vocab_size`` (+
        specials)."""
        return {
            "idx2str": self.idx2str,
            "str2idx": self.str2idx,
            "str2freq": self.str2freq,
            "vocab_size": len(self),
            "unk_token": self.unk_token,
            "specials": self.specials,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Vocab:
        """Inverse of :meth:`to_dict` (only ``idx2str`` is required)."""
        try:
            return cls(
                data["idx2str"],
                str2freq=data.get("str2freq"),
                unk_token=data.get("unk_token"),
                specials=data.get("specials", ()),
            )
        except (KeyError, TypeError) as exc:
            raise CacheError(
                f"not a vocabulary: expected a dict with 'idx2str', got keys {sorted(data)[:10]}"
            ) from exc

    def save(self, path: PathLike) -> None:
        """Write the JSON atomically."""
        with atomic_write(path) as f:
            json.dump(self.to_dict(), f, ensure_ascii=False)

    @classmethod
    def load(cls, path: PathLike) -> Vocab:
        """Read a vocabulary JSON written by :meth:`save` (or any Ludwig-shaped metadata dict)."""
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as exc:
            raise CacheError(f"cannot read vocabulary: {exc}", path=path) from exc
        return cls.from_dict(data)
