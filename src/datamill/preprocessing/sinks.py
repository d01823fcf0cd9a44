"""Where transformed blocks go: the :class:`Sink` protocol, :class:`HDF5Sink` and
:class:`MemorySink`.

The pipeline calls ``open(plan, num_rows)`` once, ``write(block_index, lo, hi, arrays)`` for every
block in block order (``lo:hi``: the block's output rows), then ``commit(document)`` with the
``meta.json`` document, or ``abort()`` on any error. A sink must leave nothing trusted behind
after ``abort()`` or a crash, and must keep the previous output: :class:`HDF5Sink` writes both new
files beside the old ones and switches them with renames, ``meta.json`` last. A shardset-dataset
sink implements the same four methods.
"""

from __future__ import annotations

import json
import os
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from datamill.core.constants import META_FORMAT
from datamill.core.faults import fault_point
from datamill.core.fingerprint import fingerprint_file
from datamill.core.io import as_output_error, atomic_path
from datamill.preprocessing.features.base import CSR
from datamill.preprocessing.hdf5 import H5Writer
from datamill.preprocessing.meta import HEADER
from datamill.preprocessing.plans import Plan

__all__ = ["HDF5Sink", "MemorySink", "Sink", "recover_interrupted_switch"]


class Sink(Protocol):
    """Receives the transformed blocks in order and commits them with the metadata document."""

    def open(self, plan: Plan, num_rows: int) -> None:
        """Start an output of ``num_rows`` rows."""
        ...

    def write(
        self, block_index: int, lo: int, hi: int, arrays: dict[str, NDArray[Any] | CSR]
    ) -> None:
        """Append block ``block_index``: output rows ``lo:hi`` (blocks arrive in order)."""
        ...

    def commit(self, document: dict[str, Any]) -> tuple[Path | None, Path | None]:
        """Finish: make the output trusted with ``document`` (the metadata); return (data path,
        metadata path)."""
        ...

    def abort(self) -> None:
        """Discard the partial output (nothing written is trusted afterwards)."""
        ...


class HDF5Sink:
    """``<stem>.hdf5`` + ``<stem>.meta.json``, both written beside the old pair, then switched by
    renames.

    The new HDF5 and ``meta.json`` are complete temporary files before anything is switched, so a
    kill, a Ctrl-C or a full disk before the switch leaves the previous pair as it was (and its
    temporary files are removed by the next run). The switch renames the HDF5 first and
    ``meta.json`` last; the old HDF5 is hard-linked aside meanwhile, so a kill between the two
    renames is undone by :func:`recover_interrupted_switch` (called by ``load`` and ``preprocess``)
    and an error or SIGTERM there puts it back at once. The HDF5 file attribute ``run_id`` (also in
    the metadata) ties the two files together, and the metadata records the HDF5's size, mtime and
    content hash.

    Args:
        hdf5_path: the HDF5 file to write.
        meta_path: its ``meta.json``.

    Examples:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> sink = HDF5Sink(d / "x.hdf5", d / "x.meta.json")
        >>> sink.open(None, 3)  # type: ignore[arg-type]
        >>> sink.write(0, 0, 3, {"x": np.arange(3)})
        >>> [p.name for p in sink.commit({"datamill": {"format": "datamill.preprocess/1"}})]
        ['x.hdf5', 'x.meta.json']
    """

    def __init__(self, hdf5_path: Path, meta_path: Path) -> None:
        self.hdf5_path = Path(hdf5_path)
        self.meta_path = Path(meta_path)
        self.run_id = uuid.uuid4().hex
        self._stack: ExitStack | None = None  # the temporary HDF5 path (renamed on close)
        self._tmp: Path | None = None
        self._raw: _GuardedFile | None = None
        self._file: Any = None
        self._writer: H5Writer | None = None
        self._next = 0

    def open(self, plan: Plan | None, num_rows: int) -> None:
        """Open a temporary HDF5 file beside the output for ``num_rows`` rows (the old pair
        stays)."""
        import h5py

        self._stack = ExitStack()
        tmp = self._stack.enter_context(atomic_path(self.hdf5_path))
        self._tmp = tmp
        try:
            self._raw = _GuardedFile(tmp)
            self._file = h5py.File(self._raw, "w")
            self._file.attrs["format"] = META_FORMAT
            self._file.attrs["run_id"] = self.run_id
        except BaseException as exc:  # noqa: BLE001 - _fail re-raises it after discarding the temporary file
            self._fail(exc)
        self._writer = H5Writer(self._file, num_rows)
        self._next = 0

    def write(
        self, block_index: int, lo: int, hi: int, arrays: dict[str, NDArray[Any] | CSR]
    ) -> None:
        """Append one block's arrays (key by key)."""
        assert self._writer is not None and block_index == self._next, (
            f"block {block_index} out of order"
        )
        try:
            for key, value in arrays.items():
                self._writer.write(key, value)
            self._raise_write_error()
        except BaseException as exc:  # noqa: BLE001 - _fail re-raises it after discarding the temporary file
            self._fail(exc)
        self._next += 1
        fault_point("preprocess.block_written")

    def commit(self, document: dict[str, Any]) -> tuple[Path | None, Path | None]:
        """Finish the temporary HDF5 and ``meta.json``, then rename the HDF5 and ``meta.json``
        (last) into place."""
        assert self._stack is not None and self._tmp is not None and self._raw is not None, (
            "commit() before open()"
        )
        tmp = self._tmp
        backup: Path | None = None
        switched = False
        try:
            self._file.close()
            self._file = None
            self._raw.close()
            self._raise_write_error()
            st = tmp.stat()  # rename keeps size and mtime
            document[HEADER]["hdf5"] = {
                "name": self.hdf5_path.name,
                "size": st.st_size,
                "mtime_ns": st.st_mtime_ns,
                "run_id": self.run_id,
                "xxh3": fingerprint_file(tmp),
            }
            backup = self._keep_old_hdf5()
            with ExitStack() as meta_stack:
                meta_tmp = meta_stack.enter_context(atomic_path(self.meta_path))
                with open(meta_tmp, "w", encoding="utf-8") as fh:
                    json.dump(document, fh, ensure_ascii=False)
                fault_point("preprocess.before_switch")
                stack, self._stack = self._stack, None
                stack.close()  # fsyncs and renames the HDF5 into place
                switched = True
                fault_point("preprocess.between_renames")
            # leaving meta_stack renamed meta.json into place: the new pair is trusted from here
            switched = False
            if backup is not None:
                backup.unlink(missing_ok=True)
        except BaseException as exc:  # noqa: BLE001 - _fail re-raises it after discarding the temporary file
            if (
                backup is not None
            ):  # put the old HDF5 back beside its meta.json (or drop the spare link)
                if switched:
                    os.replace(backup, self.hdf5_path)
                else:
                    backup.unlink(missing_ok=True)
            self._fail(exc)
        return self.hdf5_path, self.meta_path

    def _keep_old_hdf5(self) -> Path | None:
        """Hard-link the old HDF5 as ``.<name>.old-<pid>-<hex>`` so a kill between the two renames
        can be repaired."""
        if not self.hdf5_path.is_file():
            return None
        backup = self.hdf5_path.with_name(
            f".{self.hdf5_path.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        try:
            os.link(self.hdf5_path, backup)
        except OSError:  # no hard links here: the window between the renames stays unprotected
            return None
        return backup

    def _raise_write_error(self) -> None:
        if self._raw is not None and self._raw.error is not None:
            raise self._raw.error

    def _fail(self, exc: BaseException) -> None:
        """Discard the temporary file and re-raise ``exc`` (a full disk as a located
        OutputError)."""
        self.abort()
        err = as_output_error(exc, self.hdf5_path)
        if err is not None and err is not exc:
            raise err from exc
        raise exc

    def abort(self) -> None:
        """Close and delete the temporary HDF5 file; the final paths are left as they were."""
        if self._file is not None:
            try:
                self._file.close()
            except Exception:  # noqa: BLE001,S110 - a file that failed to write may fail to close; it is deleted next
                pass
            self._file = None
        if self._raw is not None:
            self._raw.close()
        if self._stack is not None:
            stack, self._stack = self._stack, None
            error = RuntimeError("preprocessing aborted")
            try:
                stack.__exit__(RuntimeError, error, None)  # atomic_path removes the temporary file
            except RuntimeError as exc:
                if exc is not error:
                    raise


def recover_interrupted_switch(hdf5_path: Path, meta_path: Path) -> bool:
    """Undo a switch killed between its two renames (new HDF5, old ``meta.json``); True when
    repaired.

    The old HDF5 was hard-linked as ``.<name>.old-<pid>-<hex>`` before the switch; when the
    ``meta.json`` in place belongs to it (same ``run_id``) and not to the HDF5 in place, it is moved
    back, so the previous pair is whole again. Backups of live processes are left alone.
    """
    import h5py

    from datamill.core.output import find_litter

    prefix = f".{hdf5_path.name}.old-"
    backups = [b for b in find_litter(hdf5_path.parent) if b.name.startswith(prefix)]
    if not backups or not meta_path.is_file():
        return False
    try:
        wanted = json.loads(meta_path.read_text(encoding="utf-8"))[HEADER]["hdf5"]["run_id"]
    except (OSError, ValueError, KeyError, TypeError):
        return False

    def run_id(path: Path) -> Any:
        try:
            with h5py.File(path, "r") as f:
                return f.attrs.get("run_id")
        except OSError:
            return None

    if hdf5_path.is_file() and run_id(hdf5_path) == wanted:
        return False
    for backup in backups:
        if run_id(backup) == wanted:
            os.replace(backup, hdf5_path)
            return True
    return False


class _GuardedFile:
    """The file h5py writes through: a failed write (full disk, file-size limit) is recorded, not
    reported.

    The HDF5 library does not recover from a failed write: its objects then fail to close and the
    interpreter can crash at exit. So a failure is kept in :attr:`error` (the sink raises it as an
    :class:`~datamill.core.errors.OutputError`), later writes are dropped, and the temporary file is
    deleted.
    """

    def __init__(self, path: Path) -> None:
        self._f = open(path, "w+b", buffering=0)  # noqa: SIM115 - closed by close()
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        if self.error is None:
            try:
                view = memoryview(data).cast("B")
                done = 0
                while done < n:
                    wrote = self._f.write(view[done:])
                    if not wrote:
                        raise OSError(28, "No space left on device (short write)")
                    done += wrote
            except OSError as exc:
                self.error = exc
        return n

    def read(self, size: int = -1) -> bytes:
        return self._f.read(size)

    def readinto(self, buf: Any) -> int:
        return self._f.readinto(buf) or 0

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def truncate(self, size: int | None = None) -> int:
        if self.error is None:
            try:
                return self._f.truncate(size)
            except OSError as exc:
                self.error = exc
        return self._f.tell() if size is None else size

    def flush(self) -> None:
        if self.error is None:
            try:
                self._f.flush()
            except OSError as exc:
                self.error = exc

    def close(self) -> None:
        self._f.close()


class MemorySink:
    """Keeps the blocks in memory; :attr:`data` holds the concatenated arrays after ``commit``.

    Examples:
        >>> sink = MemorySink()
        >>> sink.open(None, 3)  # type: ignore[arg-type]
        >>> sink.write(0, 0, 2, {"x": np.arange(2)}); sink.write(1, 2, 3, {"x": np.arange(1)})
        >>> sink.commit({}), sink.data["x"].tolist()
        ((None, None), [0, 1, 0])
    """

    def __init__(self) -> None:
        self._parts: dict[str, list[NDArray[Any] | CSR]] = {}
        self.data: dict[str, NDArray[Any] | CSR] = {}

    def open(self, plan: Plan | None, num_rows: int) -> None:
        """Start empty."""
        self._parts = {}
        self.data = {}

    def write(
        self, block_index: int, lo: int, hi: int, arrays: dict[str, NDArray[Any] | CSR]
    ) -> None:
        """Keep one block's arrays."""
        for key, value in arrays.items():
            self._parts.setdefault(key, []).append(value)

    def commit(self, document: dict[str, Any]) -> tuple[Path | None, Path | None]:
        """Concatenate the blocks; nothing is written."""
        self.data = {key: _concat(parts) for key, parts in self._parts.items()}
        self._parts = {}
        return None, None

    def abort(self) -> None:
        """Drop everything."""
        self._parts = {}
        self.data = {}


def _concat(parts: list[NDArray[Any] | CSR]) -> NDArray[Any] | CSR:
    if len(parts) == 1:
        return parts[0]
    if not isinstance(parts[0], CSR):
        return np.concatenate(parts)  # type: ignore[arg-type]  # every part of a dense key is an array
    csrs = [p for p in parts if isinstance(p, CSR)]
    starts = np.cumsum([0] + [len(p.indices) for p in csrs[:-1]])
    offsets = np.concatenate(
        [np.zeros(1, np.int64)] + [p.offsets[1:] - p.offsets[0] + s for p, s in zip(csrs, starts)]
    )
    values = (
        None
        if csrs[0].values is None
        else np.concatenate([p.values for p in csrs if p.values is not None])
    )
    return CSR(
        np.concatenate([p.indices for p in csrs]),
        offsets.astype(np.int64),
        csrs[0].vocab_size,
        values,
    )
