"""Reading inputs and writing outputs safely.

* :func:`split_member` / :func:`open_bytes` / :func:`read_text` understand ``archive.zip:member``.
* :func:`read_table` reads CSV, TSV, Parquet and JSONL into a pyarrow Table, turning every parse
  failure into a :class:`~datamill.core.errors.DataFileError` that names the file and line.
* :func:`atomic_write`, :func:`atomic_path` and :func:`atomic_dir` write to a temporary name in the
  destination folder and ``os.replace`` it into place only when the block succeeds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import io
import json
import os
import re
import shutil
import uuid
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from datamill.core.constants import DATASET_MANIFEST, OUTPUT_MARKERS
from datamill.core.errors import DataFileError, DataFileNotFoundError, OutputError, SchemaError

__all__ = [
    "PathLike",
    "as_output_error",
    "atomic_dir",
    "atomic_path",
    "atomic_write",
    "check_output",
    "check_utf8",
    "clean_stale_temps",
    "detect_format",
    "display_name",
    "find_litter",
    "is_blank",
    "is_datamill_output",
    "open_bytes",
    "read_bytes",
    "read_table",
    "read_text",
    "split_member",
]

PathLike = str | os.PathLike[str]

_FORMATS = {
    ".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet",
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".txt": "text", ".raw": "text",
    ".tokens": "text",
}


def split_member(source: PathLike) -> tuple[Path, str | None]:
    """Split ``'ptb.zip:ptb/ptb.train.txt'`` into ``(Path('ptb.zip'), 'ptb/ptb.train.txt')``.

    Examples:
        >>> split_member("data/ptb.zip:ptb/ptb.train.txt")
        (PosixPath('data/ptb.zip'), 'ptb/ptb.train.txt')
        >>> split_member("train.csv")
        (PosixPath('train.csv'), None)
    """
    text = os.fspath(source)
    m = re.match(r"^(.*?\.zip):(.+)$", text)
    if m and not os.path.exists(text):
        return Path(m.group(1)), m.group(2)
    return Path(text), None


def display_name(source: PathLike) -> str:
    """The name used in messages: the path, or ``archive.zip:member``."""
    return os.fspath(source)


def read_bytes(source: PathLike) -> bytes:
    """Read a file or a zip member completely."""
    with open_bytes(source) as f:
        return f.read()


@contextmanager
def open_bytes(source: PathLike) -> Iterator[IO[bytes]]:
    """Open a file or ``archive.zip:member`` for binary reading, with clear not-found errors."""
    path, member = split_member(source)
    if not path.exists():
        raise DataFileNotFoundError("no such file", path=path, hint="check the path (relative paths are from the current folder)")
    if path.is_dir():
        raise DataFileError("expected a file, found a folder", path=path)
    if member is None:
        with open(path, "rb") as f:
            yield f
        return
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        raise DataFileError("not a valid zip archive", path=path) from exc
    with zf:
        try:
            info = zf.getinfo(member)
        except KeyError as exc:
            names = [n for n in zf.namelist() if not n.endswith("/")]
            raise DataFileNotFoundError(
                f"no member {member!r} in the archive; it holds {names[:10]}", path=path
            ) from exc
        with zf.open(info) as f:
            try:
                yield f
            except (zipfile.BadZipFile, zlib.error, EOFError) as exc:  # a bad CRC or corrupt data shows on read
                raise DataFileError(f"the archive member {member!r} is corrupt ({exc})", path=path,
                                    hint="re-download or re-create the archive") from exc


def check_utf8(data: bytes, *, path: PathLike) -> str:
    """Decode ``data`` as UTF-8 or raise a DataFileError naming the line of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataFileError(
            f"not valid UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start:,}",
            path=path, line=line, hint="re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
        ) from exc


def is_blank(data: bytes) -> bool:
    """True for empty or all-whitespace bytes (``not data.strip()`` without copying the data)."""
    return not data or data.isspace()


def read_text(source: PathLike, *, allow_empty: bool = False) -> str:
    """Read a whole UTF-8 text file or zip member; empty or non-UTF-8 input is a DataFileError."""
    data = read_bytes(source)
    if is_blank(data) and not allow_empty:
        raise DataFileError("the file is empty; expected text", path=display_name(source))
    return check_utf8(data, path=display_name(source))


def detect_format(source: PathLike, fmt: str | None = None) -> str:
    """Return ``csv``, ``tsv``, ``parquet``, ``jsonl`` or ``text`` from ``fmt`` or the suffix."""
    if fmt is not None:
        if fmt not in set(_FORMATS.values()):
            raise DataFileError(f"unknown format {fmt!r}; expected one of {sorted(set(_FORMATS.values()))}", path=display_name(source))
        return fmt
    path, member = split_member(source)
    suffix = Path(member or path.name).suffix.lower()
    if suffix not in _FORMATS:
        raise DataFileError(
            f"cannot tell the format from the suffix {suffix!r}; expected one of {sorted(_FORMATS)}",
            path=display_name(source),
        )
    return _FORMATS[suffix]


_ROW_RE = re.compile(r"Row #(\d+)")
_MISSING_COLUMN_RE = re.compile(r"Column '(?P<a>[^']*)' in include_columns does not exist|No match for FieldRef\.Name\((?P<b>[^)]*)\)")
_JSON_CHANGED_RE = re.compile(r"Column\(/(?P<column>[^)]*)\) changed from (?P<was>\w+) to (?P<now>\w+) in row (?P<row>\d+)")


def _nth_record_line(data: bytes, row: int) -> int | None:
    """1-based line of the ``row``-th (0-based) non-blank line of a JSONL file (error path only)."""
    seen = 0
    for i, raw in enumerate(data.splitlines(), start=1):
        if raw.strip():
            if seen == row:
                return i
            seen += 1
    return None
_COLUMNS_RE = re.compile(r"Expected (\d+) columns, got (\d+)")

#: CSV cells read as null
CSV_NULL_VALUES = ("", "NA", "N/A", "NaN", "nan", "null", "NULL", "None", "#N/A")


def csv_options(kind: str, *, columns: list[str] | None = None,
                column_types: dict[str, pa.DataType] | None = None) -> dict[str, Any]:
    """The ``pyarrow.csv.read_csv`` keyword arguments datamill reads every CSV/TSV with."""
    import pyarrow.csv as pcsv

    return {
        "read_options": pcsv.ReadOptions(block_size=1 << 24),
        "parse_options": pcsv.ParseOptions(delimiter="\t" if kind == "tsv" else ",", newlines_in_values=True),
        "convert_options": pcsv.ConvertOptions(
            include_columns=columns, column_types=column_types, null_values=list(CSV_NULL_VALUES),
            strings_can_be_null=True, quoted_strings_can_be_null=False),
    }


def _bad_field_count_line(data: bytes, fmt: str) -> int | None:
    """Line (1-based) of the first CSV record whose field count differs from the header's (error path only)."""
    import csv

    reader = csv.reader(io.StringIO(data.decode("utf-8", errors="replace")),
                        delimiter="\t" if fmt == "tsv" else ",")
    width = None
    for record in reader:
        if width is None:
            width = len(record)
        elif record and len(record) != width:
            return reader.line_num
    return None


def _arrow_read_error(exc: Exception, data: bytes, source: PathLike, fmt: str) -> DataFileError:
    """Translate a pyarrow reader failure into a DataFileError with the line when we can find it."""
    name = display_name(source)
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "UTF8" in msg or "utf-8" in msg.lower() or "utf8" in msg.lower():
        check_utf8(data, path=name)  # raises with the exact line
    line = None
    m = _ROW_RE.search(str(exc))
    changed = _JSON_CHANGED_RE.search(msg) if fmt == "jsonl" else None
    if changed:
        column = changed.group("column").replace("~1", "/").replace("~0", "~")
        line = _nth_record_line(data, int(changed.group("row")))
        return DataFileError(f"expected a {changed.group('was')} as in the lines before, got a "
                             f"{changed.group('now')}", path=name, line=line, column=column,
                             hint="give the column one type in every line (quote numbers as strings, or fix the value)")
    if m:
        line = int(m.group(1))
    elif fmt in ("csv", "tsv") and _COLUMNS_RE.search(msg):
        line = _bad_field_count_line(data, fmt)
    elif fmt == "jsonl":
        for i, raw in enumerate(data.splitlines(), start=1):
            if raw.strip():
                try:
                    import json

                    json.loads(raw)
                except ValueError:
                    line = i
                    break
    return DataFileError(f"cannot parse as {fmt.upper()}: {msg}", path=name, line=line)


def read_table(
    source: PathLike,
    *,
    fmt: str | None = None,
    columns: list[str] | None = None,
    column_types: dict[str, pa.DataType] | None = None,
) -> pa.Table:
    """Read a CSV/TSV/Parquet/JSONL file (or zip member) into a pyarrow Table.

    Args:
        source: a path or ``archive.zip:member``.
        fmt: force a format instead of guessing from the suffix. Defaults to ``None``.
        columns: read only these columns (CSV/TSV/Parquet). Defaults to ``None`` (all).
        column_types: pyarrow types forced on CSV columns. Defaults to ``None``.

    Returns:
        The table. CSV ``""``, ``NA``, ``N/A``, ``NaN``, ``null`` and ``None`` cells become nulls.

    Raises:
        DataFileNotFoundError: the file does not exist.
        DataFileError: empty file, not UTF-8, malformed rows (the line is named).

    Examples:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.csv"
        >>> _ = p.write_text("a,b\\n1,x\\n,y\\n")
        >>> read_table(p).to_pydict()
        {'a': [1, None], 'b': ['x', 'y']}
    """
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson
    import pyarrow.parquet as pq

    kind = detect_format(source, fmt)
    name = display_name(source)
    data = read_bytes(source)
    if is_blank(data):
        raise DataFileError(f"the file is empty; expected {kind.upper()} with a header row", path=name)
    buf = pa.BufferReader(data)
    try:
        if kind in ("csv", "tsv"):
            table = pcsv.read_csv(buf, **csv_options(kind, columns=columns, column_types=column_types))
        elif kind == "parquet":
            table = pq.read_table(buf, columns=columns)
        elif kind == "jsonl":
            table = pjson.read_json(buf, read_options=pjson.ReadOptions(block_size=1 << 24))
        else:
            text = check_utf8(data, path=name)
            table = pa.table({"text": pa.array(text.splitlines(), pa.string())})
    except (pa.ArrowException, OSError, ValueError) as exc:
        absent = _MISSING_COLUMN_RE.search(str(exc)) if columns is not None else None
        if absent:
            col = absent.group("a") or absent.group("b")
            raise SchemaError(f"no column {col!r} in the {kind.upper()} file", path=name, column=col,
                              hint="check the column name (case matters)") from exc
        raise _arrow_read_error(exc, data, source, kind) from exc
    if kind == "jsonl" and columns is not None:
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise SchemaError(f"no column {missing[0]!r} in any line; the lines have {table.column_names}",
                              path=name, column=missing[0], hint="check the column name (case matters)")
        table = table.select(columns)
    if kind in ("csv", "tsv", "jsonl"):
        _check_string_columns_utf8(table, data, name)
    return table


def _check_string_columns_utf8(table: pa.Table, data: bytes, name: str) -> None:
    """pyarrow reads a CSV column with invalid UTF-8 as binary (or validates strings lazily)."""
    for col in table.columns:
        if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
            check_utf8(data, path=name)
        elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            try:
                col.validate(full=True)
            except pa.ArrowInvalid:
                check_utf8(data, path=name)


def _tmp_name(path: Path, kind: str = "tmp") -> Path:
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


_TMP_RE = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)-[0-9a-f]{8}$")
# every temporary name datamill writers use: ``.X.tmp-PID-HEX`` / ``.X.old-PID-HEX`` (core.io),
# ``.tmp-X-PID-HEX`` (shardset folders and files), ``.bert-scratch-PID-X`` (BERT worker scratch)
_LITTER_RE = re.compile(r"^\.(?:.+\.(?:tmp|old)-(?P<a>\d+)-[0-9a-f]{8}|tmp-.+-(?P<b>\d+)-[0-9a-f]{8}"
                        r"|bert-scratch-(?P<c>\d+)-.*)$")
_DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
_DISK_FULL_RE = re.compile(r"File too large|No space left|Disk quota exceeded|errno = (?:27|28|122)\b"
                           r"|\[Errno (?:27|28|122)\]|\d+ requested and \d+ written")  # the last: numpy's short write


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def as_output_error(exc: BaseException, path: PathLike) -> OutputError | None:
    """An :class:`OutputError` naming ``path`` when ``exc`` is a full disk / file-size limit, else None.

    Recognises ``ENOSPC``, ``EFBIG`` and ``EDQUOT`` whether they come as an ``OSError`` errno or
    inside an h5py/pyarrow message.

    Examples:
        >>> import errno
        >>> as_output_error(OSError(errno.ENOSPC, "No space left on device"), "out.hdf5").path
        'out.hdf5'
        >>> as_output_error(ValueError("nope"), "out.hdf5") is None
        True
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OutputError):
            return cur
        code = getattr(cur, "errno", None)
        if (isinstance(cur, OSError) and code in _DISK_FULL) or _DISK_FULL_RE.search(str(cur)):
            what = "the file size limit was reached" if code == errno.EFBIG or "too large" in str(cur) \
                else "the disk is full"
            return OutputError(f"cannot write the output: {what}; the previous output (if any) is unchanged",
                               path=path, hint="free some space (or raise the limit) and run the command again")
        cur = cur.__cause__ or cur.__context__
    return None


def clean_stale_temps(path: PathLike) -> list[Path]:
    """Remove the temporary files/folders an interrupted run left beside ``path``; returns them.

    Temporary names are ``.<name>.tmp-<pid>-<hex>`` (see :func:`atomic_path`); only those whose
    process is gone are removed, so a concurrent writer's temporary file is left alone. A previous
    output moved aside as ``.<name>.old-<pid>-<hex>`` by an interrupted switch is moved back when
    ``path`` is missing.

    Examples:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / ".out.bin.tmp-999999999-0123abcd").write_bytes(b"partial")
        >>> [p.name for p in clean_stale_temps(d / "out.bin")], list(d.iterdir())
        (['.out.bin.tmp-999999999-0123abcd'], [])
    """
    final = Path(path)
    parent = final.parent
    prefix = f".{final.name}."
    removed: list[Path] = []
    try:
        entries = sorted(e for e in parent.iterdir() if e.name.startswith(prefix))
    except OSError:
        return removed
    for entry in entries:
        m = _TMP_RE.match(entry.name)
        if m is None or m.group("name") != final.name or _pid_alive(int(m.group("pid"))):
            continue
        if m.group("kind") == "old" and not final.exists() and not final.is_symlink():
            os.replace(entry, final)  # the switch was interrupted between its two renames
            continue
        _remove(entry)
        removed.append(entry)
    return removed


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


def find_litter(folder: PathLike, *, remove: bool = False) -> list[Path]:
    """The temporary files/folders of dead datamill processes directly in ``folder``.

    Args:
        folder: the folder to look in.
        remove: delete them too. Defaults to ``False``.

    Examples:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> (d / ".tmp-train-999999999-0123abcd").mkdir()
        >>> [p.name for p in find_litter(d, remove=True)], list(d.iterdir())
        (['.tmp-train-999999999-0123abcd'], [])
    """
    found: list[Path] = []
    try:
        entries = sorted(Path(folder).iterdir())
    except OSError:
        return found
    for entry in entries:
        m = _LITTER_RE.match(entry.name)
        if m is None or _pid_alive(int(m.group("a") or m.group("b") or m.group("c"))):
            continue
        found.append(entry)
        if remove:
            _remove(entry)
    return found


def is_datamill_output(path: PathLike) -> bool:
    """Whether ``path`` is recognisably some datamill output (any kind), by its marker.

    Folders: a corpus (``corpus.json``), word2vec (``skipgram.json``) or shardset dataset
    (``dataset.json``). Files: an HDF5 with a ``datamill`` format attribute, a ``.meta.json`` with
    a ``datamill`` header, a Parquet file with ``datamill`` metadata.

    Examples:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "notes.txt").write_text("mine")
        >>> is_datamill_output(d / "notes.txt"), is_datamill_output(d / "absent")
        (False, False)
    """
    p = Path(path)
    if p.is_symlink():
        return False
    if p.is_dir():
        return any((p / m).is_file() for m in OUTPUT_MARKERS)
    if not p.is_file():
        return False
    name = p.name.lower()
    try:
        if name.endswith((".hdf5", ".h5")):
            import h5py

            with h5py.File(p, "r") as f:
                return str(f.attrs.get("format", "")).startswith("datamill")
        if name.endswith(".json"):
            doc = json.loads(p.read_text(encoding="utf-8"))
            return isinstance(doc, dict) and ("datamill" in doc or str(doc.get("format", "")).startswith("datamill"))
        if name.endswith((".parquet", ".pq")):
            import pyarrow.parquet as pq

            meta = pq.read_schema(p).metadata or {}
            return any(k.startswith(b"datamill") for k in meta)
    except (OSError, ValueError, pa.ArrowException):
        return False
    return False


def check_output(
    path: PathLike,
    *,
    is_own: Callable[[Path], bool],
    inputs: Sequence[PathLike] = (),
    what: str = "output",
    overwrite: bool = False,
) -> Path:
    """Refuse an output path that would destroy something that is not this command's own output.

    Allowed: an absent path, an empty folder, or ``is_own(path)`` (a datamill output of the same kind,
    recognised by its marker); with ``overwrite=True`` also any other datamill output
    (:func:`is_datamill_output`). Refused: an input of the same command (or a folder holding one;
    ``overwrite`` does not change that), a folder holding a shardset dataset's parts, and anything
    else that exists. Returns the path.

    Raises:
        DataFileError: naming the path, what it is, and how to fix it.

    Examples:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "notes.txt").write_text("mine")
        >>> check_output(d / "new", is_own=lambda p: False) == d / "new"
        True
        >>> check_output(d / "notes.txt", is_own=lambda p: False, what="corpus folder")
        Traceback (most recent call last):
        ...
        datamill.core.errors.DataFileError: .../notes.txt: refusing to replace it: it exists and is not a datamill corpus folder...
        >>> check_output(d / "notes.txt", is_own=lambda p: True, inputs=[d / "notes.txt"])
        Traceback (most recent call last):
        ...
        datamill.core.errors.DataFileError: .../notes.txt: the output would overwrite an input of this command...
    """
    out = Path(path)
    target = out.resolve()
    for source in inputs:
        src = split_member(source)[0].resolve()
        if src == target or target in src.parents:
            raise DataFileError("the output would overwrite an input of this command", path=out,
                                hint="choose an output path that is not the input (nor a folder holding it)")
    for parent in target.parents:
        if (parent / DATASET_MANIFEST).is_file():
            raise DataFileError(f"the output is inside the shardset dataset {parent} and would damage it",
                                path=out, hint="write the output outside the dataset folder")
    if not out.exists() and not out.is_symlink():
        if not out.parent.exists() and out.parent.is_symlink():
            raise DataFileError("the folder of the output is a broken link", path=out)
        return out
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        return out
    if is_own(out) or (overwrite and is_datamill_output(out)):
        return out
    kind = "folder" if out.is_dir() else "file"
    other = is_datamill_output(out)
    msg = (f"refusing to replace it: it is another kind of datamill output, not a {what}" if other else
           f"refusing to replace it: it exists and is not a datamill {what} (a {kind} of yours?)")
    hint = ("pass --overwrite (overwrite=True) to replace it, or choose another output path" if other else
            "choose another output path, or move it away yourself")
    raise DataFileError(msg, path=out, hint=hint)


def _fsync_path(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


@contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed to ``path``.

    For writers that need a filename (h5py, pyarrow). On an exception the temporary file is
    removed and ``path`` is left as it was; a full disk becomes an :class:`OutputError` naming ``path``.
    """
    final = Path(path)
    if final.is_dir():
        raise DataFileError("the output path is a folder; expected a file", path=final,
                            hint="name a file (e.g. inside that folder)")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise DataFileError("the folder of the output is a file", path=final, hint="choose another output path") from exc
    clean_stale_temps(final)
    tmp = _tmp_name(final)
    try:
        yield tmp
        if tmp.exists():
            _fsync_path(tmp)
        os.replace(tmp, final)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        err = as_output_error(exc, final)
        if err is not None and err is not exc:
            raise err from exc
        raise


@contextmanager
def atomic_write(path: PathLike, mode: str = "w", *, encoding: str = "utf-8") -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; when the block succeeds fsync and ``os.replace`` it.

    Examples:
        >>> import tempfile, pathlib, json
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "meta.json"
        >>> with atomic_write(p) as f:
        ...     json.dump({"a": 1}, f)
        >>> p.read_text()
        '{"a": 1}'
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write mode must be 'w' or 'wb', got {mode!r}")
    with atomic_path(path) as tmp:
        f: IO[Any]
        f = open(tmp, mode, encoding=None if "b" in mode else encoding)  # noqa: SIM115
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())


_RENAME_EXCHANGE = 2
_renameat2: Any = None


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths with Linux ``renameat2(RENAME_EXCHANGE)``; False when unsupported."""
    global _renameat2  # a cached libc symbol, not state
    if _renameat2 is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _renameat2 = libc.renameat2
            _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        except (OSError, AttributeError):
            _renameat2 = False
    if not _renameat2:
        return False
    at_fdcwd = -100
    rc = _renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), os.fspath(b))


def _switch_dir(tmp: Path, final: Path) -> None:
    """Put the finished folder ``tmp`` at ``final``, replacing the old one with no moment without either."""
    if not final.exists():
        os.replace(tmp, final)
        return
    if _exchange(tmp, final):  # tmp now holds the old output
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = _tmp_name(final, "old")  # restored by clean_stale_temps if we die between the renames
    os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_dir(path: PathLike, *, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; on success it replaces ``path`` as a whole.

    Only a folder is ever replaced (the caller checks with :func:`check_output` that it is its own
    output): an existing file at ``path`` is refused. The switch is one atomic exchange on Linux
    (``renameat2``), else two renames whose interruption the next run repairs.
    """
    final = Path(path)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise DataFileError("the folder of the output is a file", path=final, hint="choose another output path") from exc
    if final.exists() and not overwrite:
        raise DataFileError("the output folder already exists", path=final, hint="choose another --out or remove it")
    if (final.exists() or final.is_symlink()) and (not final.is_dir() or final.is_symlink()):
        raise DataFileError("the output path is a file, not a folder; refusing to replace it", path=final,
                            hint="choose another --out")
    clean_stale_temps(final)
    tmp = _tmp_name(final)
    tmp.mkdir()
    try:
        yield tmp
        _switch_dir(tmp, final)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        err = as_output_error(exc, final)
        if err is not None and err is not exc:
            raise err from exc
        raise
