"""Language-model minibatches with the seed's semantics, vectorised, resumable, split across ranks.

Both iterators walk the corpus as ONE flat id sequence (line boundaries are ignored, as in the
seed) and yield ``(X, Y)`` int32 arrays of shape ``(batch_size, num_steps)`` with ``Y`` = ``X``
shifted by one token (torch tensors with ``as_torch=True``).

* :func:`random_batches` is d2l's ``seq_data_iter_random``: drop a random offset in
  ``[0, num_steps)``, cut the rest into non-overlapping examples of ``num_steps`` tokens (the last
  token is only ever a target), shuffle them, and yield ``batch_size`` at a time; partial batches
  are dropped. With ``world_size > 1`` rank ``r`` takes examples ``order[r::world_size]``, cut to
  the same count on every rank, so no example is seen twice in an epoch.
* :func:`sequential_batches` is d2l's ``seq_data_iter_sequential``: drop a random offset in
  ``[0, num_steps]``, cut the rest into ``batch_size * world_size`` equal strips, and walk them
  ``num_steps`` at a time: row ``i`` of batch ``k + 1`` continues row ``i`` of batch ``k``. Rank
  ``r`` owns strips ``r * batch_size ... (r + 1) * batch_size - 1`` (a contiguous block of strips),
  so ranks never share a token and every rank's rows continue across its own batches.

The offset and the shuffle come from ``rng_for(seed, "datamill.text.<kind>", epoch)``, so an epoch
is a pure function of (corpus length, seed, epoch, batch_size, num_steps, world_size). Iterating
yields the rest of the current epoch and then moves to the next epoch. ``state_dict()`` is a tiny
JSON-able dict; ``load_state_dict()`` checks that it fits and resumes at the saved batch.

Batches are built many at a time (about 1M tokens per chunk) by one fancy index over a
``num_steps + 1`` sliding-window view of the ids (random: ``X`` and ``Y`` are two views of one
gathered block, so rows are not C-contiguous) or one strided copy (sequential: contiguous); no
Python loop per example.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from datamill.core.errors import ConfigError, DataFileError, ResumeStateError
from datamill.core.rng import rng_for
from datamill.core.state import StateSpec, check_resume_compat, validate_state
from datamill.text.corpus import Corpus

__all__ = ["BATCHES_FORMAT", "LMBatches", "random_batches", "sequential_batches"]

BATCHES_FORMAT = "datamill.text.batches/1"
_CHUNK_TOKENS = 1 << 20
_ORDER_FIELDS = (
    "kind",
    "seed",
    "batch_size",
    "num_steps",
    "world_size",
    "rank",
    "num_tokens",
    "corpus_fingerprint",
)
_STATE = StateSpec(
    BATCHES_FORMAT,
    fields=(*_ORDER_FIELDS, "epoch", "batches_seen"),
    counters=("epoch", "batches_seen"),
)


def _as_ids(corpus: Corpus | Any) -> tuple[NDArray[Any], str]:
    if isinstance(corpus, Corpus):
        return corpus.tokens, corpus.name
    arr = np.asarray(corpus)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ConfigError(
            f"expected a Corpus or a 1-D integer array of ids, got shape {arr.shape} dtype "
            f"{arr.dtype}"
        )
    return arr, "<ids>"


class LMBatches:
    """An epoch-aware, resumable iterator of LM ``(X, Y)`` minibatches (see the module docstring).

    Use :func:`random_batches` / :func:`sequential_batches` to make one. ``len()`` is the number of
    batches per epoch on this rank (for the current epoch's offset).
    """

    def __init__(
        self,
        corpus: Corpus | Any,
        batch_size: int,
        num_steps: int,
        *,
        kind: Literal["random", "sequential"],
        seed: int,
        epoch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        as_torch: bool = False,
    ) -> None:
        for name, value in (
            ("batch_size", batch_size),
            ("num_steps", num_steps),
            ("world_size", world_size),
        ):
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank must be in [0, {world_size}), got {rank}")
        if epoch < 0 or seed < 0:
            raise ConfigError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
        self.tokens, self.name = _as_ids(corpus)
        self.corpus_fingerprint = corpus.fingerprint() if isinstance(corpus, Corpus) else None
        self.kind, self.batch_size, self.num_steps = kind, int(batch_size), int(num_steps)
        self.seed, self.epoch, self.rank, self.world_size = (
            int(seed),
            int(epoch),
            int(rank),
            int(world_size),
        )
        self.as_torch = as_torch
        self.batches_seen = 0
        n, bs, ns, ws = len(self.tokens), self.batch_size, self.num_steps, self.world_size
        need = bs * ws * ns + 1  # at offset 0: one batch per rank, plus the last target token
        if n < need:
            raise DataFileError(
                f"corpus has {n:,} tokens, too short for one batch: expected at least {need:,} "
                f"(batch_size={bs} x num_steps={ns} x world_size={ws} + 1)",
                path=self.name,
                hint="use a smaller batch_size/num_steps or a longer corpus",
            )

    # -- the epoch plan (pure function of the config) ----------------------------------------
    def _plan(self) -> tuple[int, NDArray[np.int64] | None, int]:
        """(offset, example order for this rank or None, number of batches) of the current epoch."""
        rng = rng_for(self.seed, f"datamill.text.{self.kind}", self.epoch)
        n, bs, ns, ws = len(self.tokens), self.batch_size, self.num_steps, self.world_size
        if self.kind == "random":
            offset = int(rng.integers(0, ns))
            num_examples = (n - offset - 1) // ns
            order = rng.permutation(num_examples).astype(np.int64)
            per_rank = num_examples // ws
            mine = order[self.rank :: ws][:per_rank]
            return offset, mine, per_rank // bs
        offset = int(rng.integers(0, ns + 1))
        strip = (n - offset - 1) // (bs * ws)
        return offset, None, strip // ns

    def __len__(self) -> int:
        return self._plan()[2]

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first batch."""
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        self.epoch, self.batches_seen = int(epoch), 0

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        offset, order, num_batches = self._plan()
        bs, ns = self.batch_size, self.num_steps
        per_chunk = max(1, _CHUNK_TOKENS // (bs * ns))
        if order is None:
            strips = bs * self.world_size
            total = (len(self.tokens) - offset - 1) // strips * strips  # the seed's num_tokens
            mine = slice(self.rank * bs, (self.rank + 1) * bs)
            xs = self.tokens[offset : offset + total].reshape(strips, -1)[mine]
            ys = self.tokens[offset + 1 : offset + 1 + total].reshape(strips, -1)[mine]
        else:
            n_ex = (len(self.tokens) - offset - 1) // ns
            # example i with its target token: a (num_steps + 1)-window view; X and Y are views of
            # one gather
            windows = np.lib.stride_tricks.sliding_window_view(
                self.tokens[offset : offset + n_ex * ns + 1], ns + 1
            )[::ns]
        torch = None
        if self.as_torch:
            from datamill.core.optional import require

            torch = require("torch", extra="torch")
        while self.batches_seen < num_batches:
            start = self.batches_seen
            k = min(per_chunk, num_batches - start)
            if order is None:
                cols = slice(start * ns, (start + k) * ns)
                xc = np.ascontiguousarray(
                    xs[:, cols].astype(np.int32, copy=False).reshape(bs, k, ns).transpose(1, 0, 2)
                )
                yc = np.ascontiguousarray(
                    ys[:, cols].astype(np.int32, copy=False).reshape(bs, k, ns).transpose(1, 0, 2)
                )
            else:
                rows = order[start * bs : (start + k) * bs]
                xy = windows[rows].astype(np.int32, copy=False).reshape(k, bs, ns + 1)
                xc, yc = xy[:, :, :-1], xy[:, :, 1:]
            for j in range(k):
                self.batches_seen = start + j + 1
                if torch is not None:
                    yield torch.from_numpy(xc[j]), torch.from_numpy(yc[j])
                else:
                    yield xc[j], yc[j]
        self.epoch += 1
        self.batches_seen = 0

    # -- resumption ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"format", "kind", "epoch", "batches_seen", "seed", "batch_size", "num_steps", "rank",
        "world_size", "num_tokens", "corpus_fingerprint"}``: where the iteration is, and what it
        iterates (the fingerprint is ``None`` for a plain id array)."""
        return {
            "format": BATCHES_FORMAT,
            "kind": self.kind,
            "epoch": self.epoch,
            "batches_seen": self.batches_seen,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "num_steps": self.num_steps,
            "rank": self.rank,
            "world_size": self.world_size,
            "num_tokens": len(self.tokens),
            "corpus_fingerprint": self.corpus_fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``.

        Raises:
            ResumeStateError: wrong format, missing fields, or a state from another corpus/config
                (every differing field is listed).
        """
        state = validate_state(state, _STATE)
        check_resume_compat(
            state,
            self.state_dict(),
            fields=_ORDER_FIELDS,
            what="these batches",
            hint="resume with the same corpus, seed, batch_size, num_steps and ranks",
        )
        self.epoch, self.batches_seen = state["epoch"], state["batches_seen"]
        if self.batches_seen > len(self):
            raise ResumeStateError(
                f"resume state is at batch {self.batches_seen}, past the epoch's {len(self)} "
                "batches"
            )


def random_batches(
    corpus: Corpus | Any,
    batch_size: int,
    num_steps: int,
    *,
    seed: int,
    epoch: int = 0,
    rank: int = 0,
    world_size: int = 1,
    as_torch: bool = False,
) -> LMBatches:
    """Random-sampling LM minibatches (d2l's ``seq_data_iter_random``).

    Args:
        corpus: a :class:`Corpus` or a 1-D integer id array/list.
        batch_size: examples per batch (per rank).
        num_steps: tokens per example.
        seed: the shuffle seed.
        epoch: the epoch to start at. Defaults to ``0``.
        rank: this rank. Defaults to ``0``.
        world_size: number of ranks. Defaults to ``1``.
        as_torch: yield torch int32 tensors. Defaults to ``False``.

    Returns:
        an :class:`LMBatches` iterator (``state_dict``/``load_state_dict``/``set_epoch``).

    Raises:
        ConfigError: batch_size/num_steps/world_size < 1, bad rank.
        DataFileError: the corpus is too short for one batch.

    Examples:
        >>> it = random_batches(list(range(30)), 2, 5, seed=0)
        >>> X, Y = next(iter(it))
        >>> X.shape, bool((Y == X + 1).all()), bool((np.diff(X, axis=1) == 1).all())
        ((2, 5), True, True)
    """
    return LMBatches(
        corpus,
        batch_size,
        num_steps,
        kind="random",
        seed=seed,
        epoch=epoch,
        rank=rank,
        world_size=world_size,
        as_torch=as_torch,
    )


def sequential_batches(
    corpus: Corpus | Any,
    batch_size: int,
    num_steps: int,
    *,
    seed: int,
    epoch: int = 0,
    rank: int = 0,
    world_size: int = 1,
    as_torch: bool = False,
) -> LMBatches:
    """Sequential-partitioning LM minibatches (d2l's ``seq_data_iter_sequential``).

    Arguments as :func:`random_batches`. Row ``i`` of batch ``k + 1`` continues row ``i`` of batch
    ``k``.

    Examples:
        >>> b = list(sequential_batches(list(range(30)), 2, 6, seed=0))
        >>> len(b), bool((b[1][0][:, 0] == b[0][0][:, -1] + 1).all())
        (2, True)
    """
    return LMBatches(
        corpus,
        batch_size,
        num_steps,
        kind="sequential",
        seed=seed,
        epoch=epoch,
        rank=rank,
        world_size=world_size,
        as_torch=as_torch,
    )
