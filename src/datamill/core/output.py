"""Writing outputs safely: guards, atomic replacement, litter of interrupted runs, full disks.

* :func:`check_output` refuses an output path that holds something that is not this command's own
  output (or is one of its inputs); :func:`is_datamill_output` recognises any datamill output.
* :func:`atomic_write`, :func:`atomic_path` and :func:`atomic_dir` write to a temporary name in the
  destination folder and switch it into place only when the block succeeds (a folder is switched
  with one atomic exchange on Linux).
* :func:`clean_stale_temps` and :func:`find_litter` remove what killed runs left behind.
* :func:`as_output_error` turns a full disk, a file-size limit or a folder that cannot be written
  (permissions, a read-only mount, ``chattr +i``) into a located :class:`OutputError`;
  :func:`as_path_error` turns the other path failures (a name too long, a file where a folder is
  expected...) into a :class:`DataFileError` naming the path.

Re-exported by :mod:`datamill.core.io`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from datamill.core.constants import DATASET_MANIFEST, OUTPUT_MARKERS
from datamill.core.errors import DataFileError, OutputError

__all__ = [
    "PathLike",
    "as_output_error",
    "as_path_error",
    "atomic_dir",
    "atomic_path",
    "atomic_write",
    "check_output",
    "clean_stale_temps",
    "find_litter",
    "is_datamill_output",
    "write_at",
]

PathLike = str | os.PathLike[str]


def _source_path(source: PathLike) -> Path:
    """The file of ``source`` (``archive.zip:member`` -> the archive)."""
    text = os.fspath(source)
    m = re.match(r"^(.*?\.zip):(.+)$", text)
    return Path(m.group(1)) if m and not Path(text).exists() else Path(text)


def _tmp_name(path: Path, kind: str = "tmp") -> Path:
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


_TMP_RE = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)-[0-9a-f]{8}$")
# every temporary name datamill writers use: ``.X.tmp-PID-HEX`` / ``.X.old-PID-HEX`` (core.io),
# ``.tmp-X-PID-HEX`` (shardset folders and files), ``.bert-scratch-PID-X`` (BERT worker scratch)
_LITTER_RE = re.compile(
    r"^\.(?:.+\.(?:tmp|old)-(?P<a>\d+)-[0-9a-f]{8}|tmp-.+-(?P<b>\d+)-[0-9a-f]{8}"
    r"|bert-scratch-(?P<c>\d+)-.*)$"
)
_DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
_NO_WRITE = {
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted (an immutable folder?)",
    errno.EROFS: "the file system is read-only",
}
_NO_WRITE_HINT = (
    "make the folder writable (check `ls -ld` for permissions, `lsattr -d` for chattr +i, "
    "`mount` for "
    "a read-only file system), or choose another output path"
)
_PATH_ERRORS = {
    errno.ENAMETOOLONG: ("the path (or one of its names) is too long", "use a shorter path"),
    errno.ENOTDIR: (
        "a part of the path is a file, not a folder",
        "choose a path whose folders are folders",
    ),
    errno.EISDIR: (
        "the path is a folder; expected a file",
        "name a file (e.g. inside that folder)",
    ),
    errno.ELOOP: ("the path has a symbolic link loop", "fix the link or choose another path"),
    errno.ENOENT: ("no such file or folder", "check the path"),
    errno.EEXIST: ("the path exists already", "choose another path, or move it away yourself"),
    errno.ENXIO: (
        "the path is a special file (a socket or a FIFO without a reader)",
        "name a regular file",
    ),
}
_DISK_FULL_RE = re.compile(
    r"File too large|No space left|Disk quota exceeded|errno = (?:27|28|122)\b"
    r"|\[Errno (?:27|28|122)\]|\d+ requested and \d+ written"
)  # the last: numpy's short write


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
    """An :class:`OutputError` naming ``path`` when ``exc`` is a full disk / file-size limit, else
    None.

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
        if isinstance(cur, OSError) and code in _NO_WRITE:
            return OutputError(
                f"cannot write the output: {_NO_WRITE[code]}; the previous output (if any) is "
                "unchanged",
                path=_final_name(cur.filename, path),
                hint=_NO_WRITE_HINT,
            )
        if (isinstance(cur, OSError) and code in _DISK_FULL) or _DISK_FULL_RE.search(str(cur)):
            what = (
                "the file size limit was reached"
                if code == errno.EFBIG or "too large" in str(cur)
                else "the disk is full"
            )
            return OutputError(
                f"cannot write the output: {what}; the previous output (if any) is unchanged",
                path=path,
                hint="free some space (or raise the limit) and run the command again",
            )
        cur = cur.__cause__ or cur.__context__
    return None


def _final_name(filename: Any, default: PathLike) -> PathLike:
    """The output a temporary name (``.NAME.tmp-PID-HEX``) stands for; ``default`` when unknown."""
    if not isinstance(filename, (str, os.PathLike)):
        return default
    name = Path(os.fsdecode(filename))
    m = _TMP_RE.match(name.name)
    if m:
        return name.parent / m["name"]
    if _LITTER_RE.match(name.name):
        return name.parent
    return name


def as_path_error(exc: BaseException) -> DataFileError | None:
    """A :class:`DataFileError` naming the path of an ``OSError`` that is about the path itself.

    A name too long, a file where a folder is expected, a folder where a file is expected, a link
    loop, a path that vanished: the command was given (or computed) a path it cannot use.

    Examples:
        >>> import errno
        >>> as_path_error(OSError(errno.ENOTDIR, "Not a directory", "notes.txt/out")).one_line()
        ... # doctest: +NORMALIZE_WHITESPACE
        'notes.txt/out: a part of the path is a file, not a folder Fix: choose a path whose folders
        are folders'
        >>> as_path_error(ValueError("nope")) is None
        True
    """
    if not isinstance(exc, OSError) or exc.errno not in _PATH_ERRORS or exc.filename is None:
        return None
    what, hint = _PATH_ERRORS[exc.errno]
    path = os.fsdecode(_final_name(exc.filename, exc.filename))
    if len(path) > 300:
        path = path[:120] + f"...({len(path):,} characters)"
    return DataFileError(what, path=path, hint=hint)


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
            return isinstance(doc, dict) and (
                "datamill" in doc or str(doc.get("format", "")).startswith("datamill")
            )
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

    Allowed: an absent path, an empty folder, or ``is_own(path)`` (a datamill output of the same
    kind, recognised by its marker); with ``overwrite=True`` also any other datamill output
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
        ... # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.DataFileError: .../notes.txt: refusing to replace it: it exists and is
        not a datamill corpus folder...
        >>> check_output(d / "notes.txt", is_own=lambda p: True, inputs=[d / "notes.txt"])
        ... # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        datamill.core.errors.DataFileError: .../notes.txt: the output would overwrite an input of
        this command...
    """
    out = Path(path)
    _check_not_an_input(out, inputs)
    if not out.exists() and not out.is_symlink():
        if not out.parent.exists() and out.parent.is_symlink():
            raise DataFileError("the folder of the output is a broken link", path=out)
        return out
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        return out
    if is_own(out) or (overwrite and is_datamill_output(out)):
        return out
    raise _refusal(out, what)


def _check_not_an_input(out: Path, inputs: Sequence[PathLike]) -> None:
    """Refuse an output that is (or holds) an input, or lies inside a shardset dataset."""
    target = out.resolve()
    for source in inputs:
        src = _source_path(source).resolve()
        if src == target or target in src.parents:
            raise DataFileError(
                "the output would overwrite an input of this command",
                path=out,
                hint="choose an output path that is not the input (nor a folder holding it)",
            )
    for parent in target.parents:
        if (parent / DATASET_MANIFEST).is_file():
            raise DataFileError(
                f"the output is inside the shardset dataset {parent} and would damage it",
                path=out,
                hint="write the output outside the dataset folder",
            )


def _refusal(out: Path, what: str) -> DataFileError:
    """Why an existing ``out`` is not replaced: another datamill output, or a user's."""
    if is_datamill_output(out):
        return DataFileError(
            f"refusing to replace it: it is another kind of datamill output, not a {what}",
            path=out,
            hint="pass --overwrite (overwrite=True) to replace it, or choose another output path",
        )
    kind = "folder" if out.is_dir() else "file"
    return DataFileError(
        f"refusing to replace it: it exists and is not a datamill {what} (a {kind} of yours?)",
        path=out,
        hint="choose another output path, or move it away yourself",
    )


def write_at(fd: int, data: memoryview, offset: int = 0) -> int:
    """``data`` written into the open file ``fd`` from ``offset`` (``pwrite`` until every byte is);
    the offset after it.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryFile() as f:
        ...     write_at(f.fileno(), memoryview(b"abc"), 2), os.pread(f.fileno(), 8, 0)
        (5, b'\\x00\\x00abc')
    """
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)
    return offset + done


def _fsync_path(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


@contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed to ``path``.

    For writers that need a filename (h5py, pyarrow). On an exception the temporary file is
    removed and ``path`` is left as it was; a full disk becomes an :class:`OutputError` naming
    ``path``.
    """
    final = Path(path)
    if final.is_dir():
        raise DataFileError(
            "the output path is a folder; expected a file",
            path=final,
            hint="name a file (e.g. inside that folder)",
        )
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise DataFileError(
            "the folder of the output is a file", path=final, hint="choose another output path"
        ) from exc
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
    """Atomically swap two paths with Linux ``renameat2(RENAME_EXCHANGE)``; False when
    unsupported."""
    global _renameat2  # a cached libc symbol, not state
    if _renameat2 is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _renameat2 = libc.renameat2
            _renameat2.argtypes = [
                ctypes.c_int,
                ctypes.c_char_p,
                ctypes.c_int,
                ctypes.c_char_p,
                ctypes.c_uint,
            ]
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
    """Put the finished folder ``tmp`` at ``final``, replacing the old one with no moment without
    either."""
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
        raise DataFileError(
            "the folder of the output is a file", path=final, hint="choose another output path"
        ) from exc
    if final.exists() and not overwrite:
        raise DataFileError(
            "the output folder already exists", path=final, hint="choose another --out or remove it"
        )
    if (final.exists() or final.is_symlink()) and (not final.is_dir() or final.is_symlink()):
        raise DataFileError(
            "the output path is a file, not a folder; refusing to replace it",
            path=final,
            hint="choose another --out",
        )
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
