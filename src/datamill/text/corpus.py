"""LM corpora: one contiguous id array plus line offsets (CSR), saved as memory-mappable ``.npy``.

A corpus folder holds ``tokens.npy`` (uint16 when the vocabulary has at most 65,536 tokens, else
int32), ``offsets.npy`` (int64, ``n_lines + 1`` line starts), ``vocab.json`` (:class:`Vocab`),
``tokenizer.json`` for ``bpe``/``wordpiece`` corpora, and ``corpus.json`` (format, level, counts,
fingerprint), written last as the commit marker. The whole folder is written in a temp folder and
renamed into place.

Corpora are built from text by :func:`~datamill.text.corpus_build.build_corpus`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from numpy.typing import NDArray

from datamill.core.constants import CORPUS_FORMAT, VOCAB_FILE
from datamill.core.errors import ConfigError, DataFileError, DataFileNotFoundError
from datamill.core.faults import fault_point
from datamill.core.io import PathLike, atomic_dir, check_output, read_text
from datamill.core.ragged import smallest_int_dtype
from datamill.tokenize import HFTokenizer, as_string_array, normalize
from datamill.vocab import Vocab

__all__ = [
    "CORPUS_FILE",
    "LEVELS",
    "OFFSETS_FILE",
    "TOKENIZER_FILE",
    "TOKENS_FILE",
    "Corpus",
    "is_corpus_folder",
    "read_lines",
]

TOKENS_FILE = "tokens.npy"
OFFSETS_FILE = "offsets.npy"
CORPUS_FILE = "corpus.json"
TOKENIZER_FILE = "tokenizer.json"
LEVELS = ("char", "word", "bpe", "wordpiece")
Level = Literal["char", "word", "bpe", "wordpiece"]


def read_lines(
    source: PathLike | str | Sequence[str] | pa.Array,
    *,
    lowercase: bool = False,
    collapse_whitespace: bool = False,
    one_document: bool = False,
) -> pa.Array:
    """Lines of a text file (or ``zip:member``, or given texts) as a string array, normalised.

    ``one_document=True`` joins the lines with spaces first (the seed's ``' '.join(lines)``).

    Examples:
        >>> read_lines(["The  Time", "Machine"], lowercase=True, collapse_whitespace=True,
        ...            one_document=True).to_pylist()
        ['the time machine']
    """
    if isinstance(source, (str, os.PathLike)):
        text = read_text(source)
        lines: pa.Array = pc.split_pattern(pa.array([text], pa.string()), "\n").flatten()
        if len(lines) and lines[-1].as_py() == "":
            lines = lines.slice(0, len(lines) - 1)
        lines = pc.replace_substring_regex(lines, "\r$", "")  # one CR of a CRLF line end
    else:
        lines = as_string_array(source)
    if one_document:
        lines = pa.array(
            [pc.binary_join(pa.array([lines], pa.list_(pa.string())), " ")[0].as_py() or ""]
        )
    return normalize(lines, lowercase=lowercase, collapse_whitespace=collapse_whitespace)


CORPUS_ID_DTYPES = (np.uint16, np.int32, np.int64)
"""The id dtypes of corpus files, smallest first (uint16 for vocabularies up to 65,536 tokens)."""


def _smallest_dtype(vocab_size: int) -> np.dtype[Any]:
    return smallest_int_dtype(max(vocab_size - 1, 0), dtypes=CORPUS_ID_DTYPES)


class Corpus:
    """Token ids (one contiguous array) + line offsets + vocabulary.

    Args:
        tokens: 1-D integer ids (uint16/int32; any integer array is accepted and kept).
        offsets: int64 line starts, ``len = n_lines + 1``, ``offsets[-1] == len(tokens)``.
            Defaults to ``None`` (one line).
        vocab: the vocabulary. Defaults to ``None`` (ids only, e.g. ``list(range(30))``).
        level: how the text was tokenised. Defaults to ``"ids"``.
        meta: extra facts for ``corpus.json``. Defaults to ``None``.
        tokenizer: the sub-word tokenizer of a bpe/wordpiece corpus. Defaults to ``None``.
        path: the folder it was loaded from. Defaults to ``None``.

    Examples:
        >>> c = Corpus(np.arange(30))
        >>> len(c), c.num_lines, c.tokens.dtype
        (30, 1, dtype('int64'))
    """

    def __init__(
        self,
        tokens: Any,
        *,
        offsets: NDArray[np.int64] | None = None,
        vocab: Vocab | None = None,
        level: str = "ids",
        meta: dict[str, Any] | None = None,
        tokenizer: HFTokenizer | None = None,
        path: Path | None = None,
    ) -> None:
        arr = np.asarray(tokens)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise ConfigError(
                f"corpus tokens must be a 1-D integer array, got shape {arr.shape} dtype "
                f"{arr.dtype}"
            )
        if arr.dtype.kind not in "iu":
            arr = arr.astype(np.int32)
        self.tokens = arr
        self.offsets = (
            np.array([0, len(arr)], np.int64) if offsets is None else np.asarray(offsets, np.int64)
        )
        if len(self.offsets) < 1 or self.offsets[0] != 0 or self.offsets[-1] != len(arr):
            raise ConfigError(f"corpus offsets must start at 0 and end at {len(arr)}")
        self.vocab = vocab
        self.level = level
        self.meta = dict(meta or {})
        self.tokenizer = tokenizer
        self.path = path

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        v = len(self.vocab) if self.vocab is not None else None
        return (
            f"Corpus(level={self.level!r}, tokens={len(self):,}, lines={self.num_lines:,}, "
            f"vocab_size={v})"
        )

    @property
    def num_lines(self) -> int:
        """Number of lines/documents."""
        return len(self.offsets) - 1

    @property
    def name(self) -> str:
        """Where it came from, for messages."""
        return (
            str(self.path)
            if self.path is not None
            else str(self.meta.get("source", "<in-memory corpus>"))
        )

    def line(self, i: int) -> NDArray[Any]:
        """Ids of line ``i`` (a view)."""
        return self.tokens[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def fingerprint(self) -> str:
        """xxh3-128 of the ids, offsets and vocabulary (stored in ``corpus.json``)."""
        if "fingerprint" in self.meta:
            return str(self.meta["fingerprint"])
        h = xxhash.xxh3_128()
        h.update(str(self.tokens.dtype).encode())
        h.update(np.ascontiguousarray(self.tokens).data)
        h.update(np.ascontiguousarray(self.offsets).data)
        h.update(json.dumps(self.vocab.idx2str if self.vocab else None).encode())
        self.meta["fingerprint"] = h.hexdigest()
        return str(self.meta["fingerprint"])

    def decode(self, ids: Any) -> str:
        """Text of a 1-D run of ids (chars joined with ``""``, words with ``" "``, sub-words by the
        tokenizer).

        Examples:
            >>> from datamill.text.corpus_build import build_corpus
            >>> c = build_corpus(["the time machine"], level="word")
            >>> c.decode(c.tokens[1:])
            'time machine'
        """
        flat = np.asarray(ids).ravel()
        if self.tokenizer is not None:
            return self.tokenizer.decode(flat)
        if self.vocab is None:
            return " ".join(str(int(i)) for i in flat)
        return ("" if self.level == "char" else " ").join(self.vocab.decode(flat).tolist())

    # -- persistence --------------------------------------------------------------------------
    def save(self, out: PathLike, *, overwrite: bool = False) -> Path:
        """Write the corpus folder (temp folder switched into place; ``corpus.json`` written last).

        Raises:
            DataFileError: ``out`` exists and is not a corpus folder (with ``overwrite=True``: not
                any datamill output).
            OutputError: the disk is full (the previous folder is kept).
        """
        out = check_output(out, is_own=is_corpus_folder, what="corpus folder", overwrite=overwrite)
        meta = {
            **self.meta,
            "format": CORPUS_FORMAT,
            "level": self.level,
            "num_tokens": len(self),
            "num_lines": self.num_lines,
            "vocab_size": len(self.vocab) if self.vocab else None,
            "dtype": str(self.tokens.dtype),
            "fingerprint": self.fingerprint(),
        }
        with atomic_dir(out) as tmp:
            np.save(tmp / TOKENS_FILE, np.ascontiguousarray(self.tokens))
            fault_point("corpus.array_written")
            np.save(tmp / OFFSETS_FILE, self.offsets)
            if self.vocab is not None:
                self.vocab.save(tmp / VOCAB_FILE)
            if self.tokenizer is not None:
                self.tokenizer.save(tmp / TOKENIZER_FILE)
            with open(tmp / CORPUS_FILE, "w", encoding="utf-8") as f:
                json.dump(meta, f, indent=2, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            fault_point("corpus.before_switch")
        self.path = out
        self.meta = meta
        return out

    @classmethod
    def load(cls, folder: PathLike, *, mmap: bool = True) -> Corpus:
        """Open a corpus folder; ``tokens.npy`` is memory-mapped unless ``mmap=False``.

        Raises:
            DataFileNotFoundError: no such folder or no ``corpus.json`` (an unfinished write).
            DataFileError: a wrong format or inconsistent files.
        """
        folder = Path(folder)
        if not (folder / CORPUS_FILE).exists():
            raise DataFileNotFoundError(
                f"no {CORPUS_FILE} in the folder (not a corpus, or an unfinished write)",
                path=folder,
                hint="build it with `datamill corpus TEXTFILE --out DIR`",
            )
        try:
            meta = json.loads((folder / CORPUS_FILE).read_text(encoding="utf-8"))
        except ValueError as exc:
            raise DataFileError(f"not valid JSON: {exc}", path=folder / CORPUS_FILE) from exc
        if not isinstance(meta, dict) or meta.get("format") != CORPUS_FORMAT:
            got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
            raise DataFileError(
                f"expected format {CORPUS_FORMAT!r}, got {got!r}", path=folder / CORPUS_FILE
            )
        try:
            tokens = np.load(folder / TOKENS_FILE, mmap_mode="r" if mmap else None)
            offsets = np.load(folder / OFFSETS_FILE)
        except (OSError, ValueError) as exc:
            raise DataFileError(f"cannot read the corpus arrays: {exc}", path=folder) from exc
        if len(tokens) != meta.get("num_tokens") or len(offsets) != meta.get("num_lines", -2) + 1:
            raise DataFileError(
                f"{TOKENS_FILE}/{OFFSETS_FILE} do not match {CORPUS_FILE} "
                f"(expected {meta.get('num_tokens')} tokens, found {len(tokens)})",
                path=folder,
            )
        vocab = Vocab.load(folder / VOCAB_FILE) if (folder / VOCAB_FILE).exists() else None
        tok = (
            HFTokenizer.load(folder / TOKENIZER_FILE)
            if (folder / TOKENIZER_FILE).exists()
            else None
        )
        return cls(
            tokens,
            offsets=offsets,
            vocab=vocab,
            level=str(meta.get("level", "ids")),
            meta=meta,
            tokenizer=tok,
            path=folder,
        )


def is_corpus_folder(path: Path) -> bool:
    """Whether ``path`` is a corpus folder (it holds ``corpus.json`` of the corpus format).

    Examples:
        >>> is_corpus_folder(Path("no-such-folder"))
        False
    """
    try:
        meta = json.loads((path / CORPUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == CORPUS_FORMAT
