"""Reading one task's documents in batches: JSONL (``pyarrow.json`` per chunk), Parquet (a text
column), plain text (a document per blank-line-separated block, or per file), any of them ``.gz`` or
``.zst`` compressed, on any storage scheme.

Each batch carries the documents' texts, their positions (the byte offset of the record in the
uncompressed file, or the Parquet row), the kept metadata columns, and how many stored bytes of the
task are done (the progress). A bad record (invalid UTF-8, a malformed JSONL line, a missing or
non-string text field) raises a located :class:`~datamill.core.errors.DataFileError` (file, line,
field), or with ``skip_bad`` is left out and counted in :class:`BadRecords`.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq
from numpy.typing import NDArray

from datamill.core.errors import DataFileError, SchemaError
from datamill.core.storage import filesystem_for, storage_error
from datamill.text.tok_inputs import InputFile, Task

__all__ = ["BadRecords", "Batch", "ReadOptions", "read_task"]

MAX_EXAMPLES = 5
"""Bad records kept as examples (the rest are only counted)."""

_BLOCK = re.compile(rb"[^\n]*\S[^\n]*(?:\n[^\n]*\S[^\n]*)*")
_BLOCK_CUT = re.compile(rb"\n[ \t\r\f\v]*\n")
_WS = np.frombuffer(b" \t\r\n\f\v", np.uint8)


@dataclass(frozen=True)
class ReadOptions:
    """How :func:`~datamill.text.tokenize` reads documents.

    Args:
        text_field: the JSONL field / Parquet column of the text. Defaults to ``"text"``.
        keep: other fields kept as metadata columns (strings). Defaults to ``()``.
        text_unit: plain text: ``"block"`` (a document per blank-line-separated block) or
            ``"file"``. Defaults to ``"block"``.
        skip_bad: skip and count bad records instead of failing. Defaults to ``False``.
        batch_bytes: bytes of text read per batch. Defaults to ``1 << 20``.

    Examples:
        >>> ReadOptions(text_field="body", keep=("id",)).text_unit
        'block'
    """

    text_field: str = "text"
    keep: tuple[str, ...] = ()
    text_unit: str = "block"
    skip_bad: bool = False
    batch_bytes: int = 1 << 20


@dataclass
class BadRecords:
    """Skipped records: the count and the first :data:`MAX_EXAMPLES` as ``{path, line|row, field,
    reason}``."""

    count: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)

    def add(self, err: DataFileError) -> None:
        self.count += 1
        if len(self.examples) < MAX_EXAMPLES:
            ex = {"path": str(err.path), "reason": err.one_line()}
            ex.update(
                {
                    k: getattr(err, k)
                    for k in ("line", "row", "column")
                    if getattr(err, k, None) is not None
                }
            )
            self.examples.append(ex)


@dataclass
class Batch:
    """Documents of one batch: texts, positions (byte offset or row), kept columns, progress."""

    texts: list[str]
    positions: NDArray[np.int64]
    extra: pa.Table | None
    done: int
    """Stored bytes of the task done after this batch (the last batch reports the task's weight)."""


class _Context:
    """The task being read: its file, options, where bad records go, and line numbers on demand."""

    def __init__(self, f: InputFile, opts: ReadOptions, bad: BadRecords) -> None:
        self.f, self.opts, self.bad = f, opts, bad

    def problem(
        self,
        reason: str,
        *,
        offset: int | None = None,
        row: int | None = None,
        column: str | None = None,
        hint: str | None = None,
    ) -> None:
        """Raise the located error, or count it when skipping bad records."""
        line = self.line_at(offset) if offset is not None else None
        err = DataFileError(
            reason,
            path=self.f.url,
            line=line,
            row=row,
            column=column,
            hint=hint
            or "fix the record, or pass --skip-bad (skip_bad=True) to skip and count bad records",
        )
        if not self.opts.skip_bad:
            raise err
        self.bad.add(err)

    def line_at(self, offset: int) -> int:
        """The 1-based line of the byte ``offset`` of the uncompressed file (read again, errors
        only)."""
        count, pos = 0, 0
        with _open_stream(self.f) as s:
            while pos < offset:
                chunk = s.read(min(8 << 20, offset - pos))
                if not chunk:
                    break
                count += chunk.count(b"\n")
                pos += len(chunk)
        return count + 1


def _open_stream(f: InputFile) -> Any:
    return _open_raw(f)[0]


def _open_raw(f: InputFile) -> tuple[Any, Any]:
    """The uncompressed stream of ``f`` and its raw (stored) stream."""
    fs, path = filesystem_for(f.url)
    try:
        raw = fs.open_input_stream(path, compression=None)
    except OSError as exc:
        raise storage_error(exc, f.url) from exc
    return (pa.CompressedInputStream(raw, f.compression) if f.compression else raw), raw


# ----------------------------------------------------------------- record boundaries and chunks
def _cut_pattern(f: InputFile, opts: ReadOptions) -> re.Pattern[bytes]:
    return _BLOCK_CUT if f.kind == "text" else re.compile(rb"\n")


def _boundary(raw: Any, pos: int, size: int, cut: re.Pattern[bytes], window: int = 1 << 16) -> int:
    """The first record boundary at or after ``pos`` (the position after a cut that ends at or after
    ``pos``); the same answer whichever task asks."""
    if pos <= 0 or pos >= size:
        return min(max(pos, 0), size)
    lo = max(pos - 8, 0)  # a cut may start a few bytes before pos and still end at/after it
    buf = b""
    while True:
        data = raw.read_at(min(window, size - lo - len(buf)), lo + len(buf))
        if not data:
            return size
        buf += data
        for m in cut.finditer(buf):
            if lo + m.end() >= pos:
                return lo + m.end()
        window *= 2


def _range_chunks(f: InputFile, task: Task, opts: ReadOptions) -> Iterator[tuple[int, bytes, int]]:
    """``(offset, chunk, stored bytes done)``: the task's records, cut at record boundaries."""
    cut = _cut_pattern(f, opts)
    if f.compression is not None or (f.kind == "text" and opts.text_unit == "file"):
        s, raw = _open_raw(f)
        with s, raw:
            whole = f.kind == "text" and opts.text_unit == "file"
            yield from _stream_chunks(s, cut, opts, f, whole=whole, raw=raw)
        return
    fs, path = filesystem_for(f.url)
    try:
        raw = fs.open_input_file(path)
    except OSError as exc:
        raise storage_error(exc, f.url) from exc
    with raw:
        start = _boundary(raw, task.start, f.size, cut)
        end = _boundary(raw, task.end, f.size, cut)
        pos, carry = start, b""
        while pos < end or carry:
            data = raw.read_at(min(opts.batch_bytes, end - pos), pos) if pos < end else b""
            pos += len(data)
            buf = carry + data
            last = _last_cut(buf, cut) if pos < end else len(buf)
            if last <= 0:  # one record longer than a batch: read on
                carry = buf
                continue
            yield (
                pos - len(buf),
                buf[:last],
                min(task.weight, pos - task.start) if pos < end else task.weight,
            )
            carry = buf[last:]


def _last_cut(buf: bytes, cut: re.Pattern[bytes]) -> int:
    """The end of the last cut in ``buf`` (0 when there is none)."""
    i = buf.rfind(b"\n")
    if cut.pattern == rb"\n":
        return i + 1
    best = 0
    for m in cut.finditer(buf, max(0, i - (1 << 16))):
        best = m.end()
    if not best:
        for m in cut.finditer(buf):
            best = m.end()
    return best


def _stream_chunks(
    s: Any, cut: re.Pattern[bytes], opts: ReadOptions, f: InputFile, *, whole: bool, raw: Any
) -> Iterator[tuple[int, bytes, int]]:
    """Chunks of a stream read from its start (compressed files, a document per file)."""
    offset, carry = 0, b""
    while True:
        data = s.read(opts.batch_bytes)
        buf = carry + data
        if not data:
            if buf:
                yield offset, buf, f.size
            return
        last = len(buf) if whole else _last_cut(buf, cut)
        if whole or last <= 0:
            carry = buf
            continue
        done = min(f.size - 1, _raw_position(raw, offset + last))
        yield offset, buf[:last], max(done, 0)
        offset += last
        carry = buf[last:]


def _raw_position(raw: Any, fallback: int) -> int:
    """Stored bytes read so far (a compressed input's position in its raw stream)."""
    try:
        return int(raw.tell())
    except (OSError, AttributeError):
        return fallback


# ----------------------------------------------------------------- parsing chunks into documents
def _decode_check(ctx: _Context, offset: int, chunk: bytes) -> bool:
    """Whether ``chunk`` is valid UTF-8 (a bad chunk is parsed record by record)."""
    try:
        chunk.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _line_starts(chunk: bytes) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Starts and ends of the non-blank lines of ``chunk`` (whitespace-only lines are blank).

    Only lines that are empty or start with whitespace are looked at one by one (a JSON line starts
    with ``{``, so there are few).
    """
    buf = np.frombuffer(chunk, np.uint8)
    nl = np.flatnonzero(buf == 10)
    ends = np.concatenate([nl, [len(buf)]]) if not len(nl) or nl[-1] != len(buf) - 1 else nl
    starts = np.concatenate([[0], nl + 1])[: len(ends)]
    keep = ends > starts
    first = buf[np.minimum(starts, max(len(buf) - 1, 0))] if len(buf) else starts
    maybe = np.flatnonzero(keep & np.isin(first, _WS))
    for i in maybe.tolist():
        keep[i] = bool(chunk[starts[i] : ends[i]].strip())
    return starts[keep].astype(np.int64), ends[keep].astype(np.int64)


def _jsonl_docs(
    ctx: _Context, offset: int, chunk: bytes
) -> tuple[list[str], NDArray[np.int64], pa.Table | None]:
    opts = ctx.opts
    starts, ends = _line_starts(chunk)
    if _decode_check(ctx, offset, chunk):
        schema = pa.schema([(opts.text_field, pa.string())])
        unexpected = "infer" if opts.keep else "ignore"
        try:
            t = pj.read_json(
                io.BytesIO(chunk),
                read_options=pj.ReadOptions(use_threads=False, block_size=len(chunk) + 1),
                parse_options=pj.ParseOptions(
                    explicit_schema=schema, unexpected_field_behavior=unexpected
                ),
            )
            extra = _kept(t, opts.keep) if opts.keep else None
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            t = None
        text_ok = t is not None and t.column(opts.text_field).null_count == 0
        if t is not None and t.num_rows == len(starts) and text_ok:
            return t.column(opts.text_field).to_pylist(), offset + starts, extra
    return _jsonl_slow(ctx, offset, chunk, starts, ends)


def _kept(t: pa.Table, keep: tuple[str, ...]) -> pa.Table:
    """The kept fields as strings (null where a record lacks one)."""
    cols = {}
    for k in keep:
        cols[k] = (
            t.column(k).cast(pa.string())
            if k in t.column_names
            else pa.nulls(t.num_rows, pa.string())
        )
    return pa.table(cols)


def _jsonl_slow(
    ctx: _Context, offset: int, chunk: bytes, starts: NDArray[np.int64], ends: NDArray[np.int64]
) -> tuple[list[str], NDArray[np.int64], pa.Table | None]:
    """Record by record: locate (or skip) every bad line of a chunk the vectorised parse refused."""
    opts = ctx.opts
    texts: list[str] = []
    pos: list[int] = []
    rows: list[dict[str, Any]] = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        at = offset + a
        try:
            rec = json.loads(chunk[a:b].decode("utf-8"))
        except UnicodeDecodeError as exc:
            ctx.problem(
                f"invalid UTF-8 (byte {exc.start + 1} of the line)",
                offset=at,
                hint="re-encode the file as UTF-8, or pass --skip-bad (skip_bad=True)",
            )
            continue
        except ValueError as exc:
            ctx.problem(f"not a JSON line: {exc}", offset=at)
            continue
        if not isinstance(rec, dict):
            ctx.problem(f"expected a JSON object, found {type(rec).__name__}", offset=at)
            continue
        text = rec.get(opts.text_field)
        if not isinstance(text, str):
            what = "missing" if text is None else f"a {type(text).__name__}, not a string"
            ctx.problem(
                f"the text field is {what}",
                offset=at,
                column=opts.text_field,
                hint="pass --text-field NAME for another field, or --skip-bad (skip_bad=True)",
            )
            continue
        texts.append(text)
        pos.append(at)
        rows.append(
            {
                k: None
                if rec.get(k) is None
                else (rec[k] if isinstance(rec[k], str) else json.dumps(rec[k]))
                for k in opts.keep
            }
        )
    extra = (
        pa.Table.from_pylist(rows, schema=pa.schema([(k, pa.string()) for k in opts.keep]))
        if opts.keep
        else None
    )
    return texts, np.asarray(pos, np.int64), extra


def _text_docs(
    ctx: _Context, offset: int, chunk: bytes
) -> tuple[list[str], NDArray[np.int64], pa.Table | None]:
    if ctx.opts.text_unit == "file":
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError as exc:
            ctx.problem("invalid UTF-8", offset=offset + exc.start)
            return [], np.zeros(0, np.int64), None
        return [text], np.zeros(1, np.int64), None
    texts: list[str] = []
    pos: list[int] = []
    for m in _BLOCK.finditer(chunk):
        block = m.group()
        lead = len(block) - len(block.lstrip())
        try:
            texts.append(block.strip().decode("utf-8"))
        except UnicodeDecodeError as exc:
            ctx.problem("invalid UTF-8", offset=offset + m.start() + lead + exc.start)
            continue
        pos.append(offset + m.start() + lead)
    return texts, np.asarray(pos, np.int64), None


def _parquet_batches(ctx: _Context, task: Task) -> Iterator[Batch]:
    f, opts = ctx.f, ctx.opts
    fs, path = filesystem_for(f.url)
    with fs.open_input_file(path) as raw:
        pf = pq.ParquetFile(raw)
        names = pf.schema_arrow.names
        for col in (opts.text_field, *opts.keep):
            if col not in names:
                raise SchemaError(
                    f"no column {col!r} (columns: {names})",
                    path=f.url,
                    column=col,
                    hint="pass --text-field NAME (--keep NAME) naming a column of the file",
                )
        meta = pf.metadata
        first = sum(meta.row_group(g).num_rows for g in range(task.start))
        rows = sum(meta.row_group(g).num_rows for g in range(task.start, task.end)) or 1
        seen = 0
        for rb in pf.iter_batches(
            batch_size=8192,
            row_groups=range(task.start, task.end),
            columns=[opts.text_field, *opts.keep],
            use_threads=False,
        ):
            col = rb.column(opts.text_field)
            if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
                raise SchemaError(
                    f"the text column holds {col.type}, not strings",
                    path=f.url,
                    column=opts.text_field,
                )
            idx = np.arange(first + seen, first + seen + rb.num_rows, dtype=np.int64)
            ok = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), bool)
            for r in idx[~ok].tolist():
                ctx.problem("the text is null", row=int(r), column=opts.text_field)
            t = pa.Table.from_batches([rb]).filter(pa.array(ok))
            seen += rb.num_rows
            extra = (
                t.select(list(opts.keep)).cast(pa.schema([(k, pa.string()) for k in opts.keep]))
                if opts.keep
                else None
            )
            yield Batch(
                t.column(opts.text_field).to_pylist(), idx[ok], extra, task.weight * seen // rows
            )


def read_task(f: InputFile, task: Task, opts: ReadOptions, bad: BadRecords) -> Iterator[Batch]:
    """The documents of ``task`` (of file ``f``) in batches of about ``opts.batch_bytes``.

    Raises:
        DataFileError: a bad record (unless ``opts.skip_bad``; then it is counted in ``bad``).
        SchemaError: a Parquet file without the text column (or a kept column).
    """
    ctx = _Context(f, opts, bad)
    if f.kind == "parquet":
        yield from _parquet_batches(ctx, task)
        return
    parse = _jsonl_docs if f.kind == "jsonl" else _text_docs
    for offset, chunk, done in _range_chunks(f, task, opts):
        texts, pos, extra = parse(ctx, offset, chunk)
        yield Batch(texts, pos, extra, done)
