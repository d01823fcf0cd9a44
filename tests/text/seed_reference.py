"""The seed's pure-Python LM batch functions (d2l), with the random draws injected so they can be
compared."""

from __future__ import annotations

from collections.abc import Iterator, Sequence


def seq_data_iter_random(
    corpus: Sequence[int], batch_size: int, num_steps: int, *, offset: int, order: Sequence[int]
) -> Iterator[tuple[list[list[int]], list[list[int]]]]:
    """d2l ``seq_data_iter_random`` with ``random.randint`` -> ``offset`` and ``random.shuffle`` ->
    ``order``."""
    corpus = list(corpus)[offset:]
    num_subseqs = (len(corpus) - 1) // num_steps
    initial_indices = list(range(0, num_subseqs * num_steps, num_steps))
    initial_indices = [initial_indices[i] for i in order]

    def data(pos: int) -> list[int]:
        return corpus[pos : pos + num_steps]

    num_batches = num_subseqs // batch_size
    for i in range(0, batch_size * num_batches, batch_size):
        per_batch = initial_indices[i : i + batch_size]
        yield [data(j) for j in per_batch], [data(j + 1) for j in per_batch]


def seq_data_iter_sequential(
    corpus: Sequence[int], batch_size: int, num_steps: int, *, offset: int
) -> Iterator[tuple[list[list[int]], list[list[int]]]]:
    """d2l ``seq_data_iter_sequential`` with ``random.randint(0, num_steps)`` -> ``offset``."""
    corpus = list(corpus)
    num_tokens = ((len(corpus) - offset - 1) // batch_size) * batch_size
    xs = corpus[offset : offset + num_tokens]
    ys = corpus[offset + 1 : offset + 1 + num_tokens]
    width = num_tokens // batch_size
    xrows = [xs[r * width : (r + 1) * width] for r in range(batch_size)]
    yrows = [ys[r * width : (r + 1) * width] for r in range(batch_size)]
    num_batches = width // num_steps
    for i in range(0, num_steps * num_batches, num_steps):
        yield [r[i : i + num_steps] for r in xrows], [r[i : i + num_steps] for r in yrows]
