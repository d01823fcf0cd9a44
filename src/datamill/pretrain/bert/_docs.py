"""Raw WikiText-style text -> documents of sentences -> token ids in CSR form.

A blank line or a title line (starting with ``=`` once stripped) ends a document; every other line
is one "sentence". Sentences that tokenise to nothing and documents left empty are dropped.
The corpus is three flat arrays: ``ids`` (int32 token ids), ``sent_offsets`` (int64, tokens of
sentence ``s`` are ``ids[sent_offsets[s]:sent_offsets[s+1]]``) and ``doc_offsets`` (int64, sentences
of document ``d`` are ``doc_offsets[d]:doc_offsets[d+1]``); the sentences of a document are
consecutive, so any run of sentences is one contiguous slice of ``ids``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from datamill.core.arrow import from_numpy, large_strings, to_numpy
from datamill.core.errors import DataFileError
from datamill.core.io import PathLike, check_utf8, display_name, open_bytes
from datamill.core.parallel import ordered_map
from datamill.pretrain.bert._tok import BertTokenizer, resolve_tokenizer, train_wordpiece

__all__ = [
    "TokenizedDocuments",
    "check_file",
    "corpus_from_ids",
    "read_documents",
    "split_block",
    "split_documents",
    "tokenize_documents",
]


@dataclass(frozen=True)
class TokenizedDocuments:
    """Token ids of a document collection (see the module docstring for the layout)."""

    ids: NDArray[np.int32]
    sent_offsets: NDArray[np.int64]
    doc_offsets: NDArray[np.int64]

    @property
    def num_documents(self) -> int:
        return len(self.doc_offsets) - 1

    @property
    def num_sentences(self) -> int:
        return len(self.sent_offsets) - 1

    def document(self, d: int) -> NDArray[np.int32]:
        """All token ids of document ``d`` (its sentences concatenated)."""
        s0, s1 = int(self.doc_offsets[d]), int(self.doc_offsets[d + 1])
        return self.ids[int(self.sent_offsets[s0]) : int(self.sent_offsets[s1])]


# text read and split per step: bounds the temporaries (32 MB blocks took 2-3x longer, fresh memory)
_BLOCK_BYTES = 4 << 20
_THREADS = 2  # blocks split at once


def _blocks(path: PathLike) -> Iterator[tuple[bytes, int]]:
    """Blocks of whole lines (about ``_BLOCK_BYTES`` each) and the 1-based line number they start
    at."""
    line = 1
    rest = b""
    with open_bytes(path) as f:
        while True:
            chunk = f.read(_BLOCK_BYTES)
            if not chunk:
                break
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                rest = data
                continue
            block, rest = data[:cut], data[cut:]
            yield block, line
            line += block.count(b"\n")
    if rest:
        yield rest, line


def _lines(block: bytes, first_line: int, path: PathLike) -> pa.Array:
    """The stripped lines of a block as ``large_string`` (UTF-8 checked, bad byte's line named)."""
    try:
        # from buffers, not pa.array([block]): a list makes pyarrow import pandas (0.5 s)
        whole = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(),
            1,
            [None, pa.py_buffer(np.array([0, len(block)], dtype=np.int64)), pa.py_buffer(block)],
        ).cast(pa.large_string())
    except pa.ArrowInvalid as exc:
        try:
            check_utf8(block, path=display_name(path))
        except DataFileError as err:
            raise DataFileError(
                err.msg,
                path=display_name(path),
                line=(err.line or 1) + first_line - 1,
                hint=err.hint,
            ) from exc
        raise  # pragma: no cover - arrow and Python disagree on UTF-8
    parts = pc.split_pattern(whole, "\n")
    lines = pc.list_flatten(parts)
    if block.endswith(b"\n"):
        lines = lines.slice(0, len(lines) - 1)  # the empty piece after the final newline
    return pc.utf8_trim_whitespace(lines)


def split_block(
    block: bytes, first_line: int, path: PathLike, *, sentence_split: str = "line"
) -> tuple[pa.Array, NDArray[np.int64], int]:
    """Split one block of whole lines -> (sentences, document id of each, breaks in the block).

    The document id of a sentence is the number of breaks (blank or ``=`` title lines) before it in
    the block, so the ids of consecutive blocks chain by adding the breaks of the blocks before
    (:func:`split_documents`; the Ray engine splits blocks on its workers with this same function).
    ``first_line`` is the 1-based line the block starts at (named in a UTF-8 error).

    Examples:
        >>> s, d, n = split_block(
        ...     b"a b\\n\\n = T = \\nc . d . e\\n", 1, "x.txt", sentence_split="period"
        ... )
        >>> s.to_pylist(), d.tolist(), n
        (['a b', 'c .', 'd .', 'e'], [0, 2, 2, 2], 2)
    """
    lines = _lines(block, first_line, path)
    brk = (to_numpy(pc.utf8_length(lines)) == 0) | to_numpy(
        pc.starts_with(lines, "=")
    )  # (no pandas import)
    doc = np.cumsum(brk, dtype=np.int64)
    keep = ~brk
    kept = lines.filter(from_numpy(keep))
    kept_doc = doc[keep]
    if sentence_split == "period":
        parts = pc.split_pattern(pc.replace_substring(kept, " . ", " .\n"), "\n")
        parent = to_numpy(pc.list_parent_indices(parts))
        pieces = pc.utf8_trim_whitespace(pc.list_flatten(parts))
        nonempty = to_numpy(pc.utf8_length(pieces)) > 0
        kept = pieces.filter(from_numpy(nonempty))
        kept_doc = kept_doc[parent[nonempty]]
    return kept, kept_doc, int(doc[-1]) if len(doc) else 0


def split_documents(
    paths: Sequence[PathLike], *, sentence_split: str = "line"
) -> tuple[pa.Array, NDArray[np.int64]]:
    """Read the files -> (sentences, document ids per sentence, non-decreasing).

    Vectorised with pyarrow, block by block (:func:`split_block`): strip every line, mark blank and
    ``=`` title lines as breaks, give each line the number of breaks before it as its document id.
    A file end also ends a document. ``sentence_split="period"`` further cuts each line after every
    `` . `` (WikiText's tokenised full stop, as d2l.ai does), keeping the period. Lines end at
    ``\n`` (as the seed's ``readline``); the sentences stay in Arrow (``large_string``), never as
    Python strings.
    """
    sentences: list[pa.Array] = []
    doc_ids: list[NDArray[np.int64]] = []
    doc_base = 0
    found, empty, current = 0, True, 0

    def blocks() -> Iterator[tuple[int, bytes, int]]:
        for i, path in enumerate(paths):
            for block, first_line in _blocks(path):
                yield i, block, first_line

    def split(
        item: tuple[int, bytes, int],
    ) -> tuple[int, bool, tuple[pa.Array, NDArray[np.int64], int]]:
        i, block, first_line = item
        return (
            i,
            block.isspace(),
            split_block(block, first_line, paths[i], sentence_split=sentence_split),
        )

    # blocks split in threads (pyarrow kernels release the GIL), in file order; at most
    # _THREADS + 1 blocks of text in flight
    for i, is_space, (kept, kept_doc, breaks) in ordered_map(
        split, blocks(), threads=_THREADS, window=_THREADS + 1
    ):
        while current < i:  # the files before this block's are complete (a file may have no block)
            check_file(paths[current], empty=empty, found=found)
            doc_base += 1  # a file end ends a document
            found, empty, current = 0, True, current + 1
        empty = empty and is_space
        kept_doc += doc_base
        doc_base += breaks  # a document may continue in the next block
        found += len(kept)
        sentences.append(kept)
        doc_ids.append(kept_doc)
    for path in paths[current:]:
        check_file(path, empty=empty, found=found)
        found, empty = 0, True
    ids = np.concatenate(doc_ids) if doc_ids else np.zeros(0, dtype=np.int64)
    arr = pa.concat_arrays(sentences) if sentences else large_strings([])
    pa.default_memory_pool().release_unused()
    return arr, ids


def check_file(path: PathLike, *, empty: bool, found: int) -> None:
    """Refuse a file that is empty (or blank) or holds no text line (every line a break)."""
    if empty:
        raise DataFileError("the file is empty; expected text", path=display_name(path))
    if not found:
        raise DataFileError(
            "no text lines: every line is blank or a '=' title line",
            path=display_name(path),
            hint="BERT needs documents with sentences",
        )


def tokenize_documents(
    sentences: pa.Array | Sequence[str], sent_doc: NDArray[np.int64], tokenizer: BertTokenizer
) -> TokenizedDocuments:
    """Encode the sentences in batches; drop empty sentences and renumber documents densely."""
    flat, offsets = tokenizer.encode(sentences)
    return corpus_from_ids(flat, offsets, sent_doc)


def corpus_from_ids(
    flat: NDArray[np.int32], offsets: NDArray[np.int64], sent_doc: NDArray[np.int64]
) -> TokenizedDocuments:
    """:func:`tokenize_documents` from the sentences' ids (CSR): drop empty sentences, renumber
    documents."""
    lengths = np.diff(offsets)
    keep = lengths > 0
    sent_offsets = np.concatenate([offsets[:-1][keep], offsets[-1:]]).astype(np.int64)
    docs = sent_doc[keep]
    if len(docs):
        starts = np.flatnonzero(np.concatenate([[True], docs[1:] != docs[:-1]]))
    else:
        starts = np.zeros(0, dtype=np.int64)
    doc_offsets = np.concatenate([starts, [len(docs)]]).astype(np.int64)
    return TokenizedDocuments(ids=flat, sent_offsets=sent_offsets, doc_offsets=doc_offsets)


def read_documents(
    paths: Sequence[PathLike], tokenizer: Any, *, vocab_size: int, sentence_split: str
) -> tuple[BertTokenizer, pa.Array, NDArray[np.int64], dict[str, float]]:
    """Read and split the raw files into sentences and their documents, and get the tokenizer
    (``tokenizer`` loaded, else WordPiece trained on the sentences); with the seconds of each step.
    Every engine starts here, so the same text gives the same documents and tokenizer."""
    start = time.perf_counter()
    timings: dict[str, float] = {}
    tok = resolve_tokenizer(tokenizer)
    sentences, sent_doc = split_documents(paths, sentence_split=sentence_split)
    t = time.perf_counter()
    timings["read_split"] = t - start
    if tok is None:
        tok = train_wordpiece(sentences, vocab_size=vocab_size)
        timings["train_tokenizer"] = time.perf_counter() - t
    return tok, sentences, sent_doc, timings
