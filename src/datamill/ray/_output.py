"""The Ray preprocessing output: guards, the cache check, and a switch that keeps the previous
output.

The output is ``<stem>.shards/`` (a shardset dataset), ``<stem>.meta.json`` and, with
``fmt="hdf5"``, ``<stem>.hdf5``. As with the local engine
(:class:`~datamill.preprocessing.sinks.HDF5Sink`), a run writes everything new *beside* the old
output and switches with renames, ``meta.json`` last:

1. the new dataset is written and committed in a hidden ``.<stem>.shards.tmp-<pid>-<hex>`` folder
   (its shards by the Ray tasks, ``dataset.json`` by the driver);
2. :func:`switch_in` renames the old dataset to ``.<stem>.shards.old-<pid>-<hex>`` and the new one
   into place;
3. the HDF5 (if any) and ``meta.json`` are renamed into place; ``meta.json`` records the dataset's
   :func:`dataset_stamp` (path, size and mtime of every file), which ties the two together;
4. the old dataset is removed.

An error or SIGTERM after step 2 puts the old dataset back (:func:`switch_back`); a kill -9 before
step 2 leaves the old output as it was plus temporaries of a dead process, and a kill between steps
2 and 3 leaves the new dataset beside the old ``meta.json``: :func:`prepare_outputs` (run first by
the next run) moves the old dataset back when ``meta.json`` names it, then removes the temporaries.
A ``meta.json`` whose stamp does not match the dataset in place is never trusted
(:func:`cached_output`).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from datamill.core.constants import DATASET_MANIFEST, HDF5_SUFFIX, META_SUFFIX
from datamill.core.errors import CacheError, DataFileError
from datamill.core.faults import fault_point
from datamill.core.fingerprint import fingerprint_file, fingerprint_obj
from datamill.core.io import check_output, clean_stale_temps, find_litter, is_datamill_output
from datamill.preprocessing.meta import HEADER, Metadata, read_meta
from datamill.preprocessing.plans import Plan
from datamill.preprocessing.sinks import recover_interrupted_switch

__all__ = [
    "SHARDSET",
    "cached_output",
    "dataset_stamp",
    "is_own_dataset",
    "prepare_outputs",
    "switch_back",
    "switch_in",
    "tmp_root",
]

#: the shardset holding the tensors
SHARDSET = "features"


def is_own_dataset(path: Path) -> bool:
    """Whether ``path`` is a shardset dataset this engine wrote (one shardset, :data:`SHARDSET`).

    Examples:
        >>> import tempfile
        >>> is_own_dataset(Path(tempfile.mkdtemp()))
        False
    """
    try:
        manifest = json.loads((path / DATASET_MANIFEST).read_text(encoding="utf-8"))
        return (
            path.is_dir()
            and not path.is_symlink()
            and [s.get("name") for s in manifest.get("shardsets", [])] == [SHARDSET]
        )
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def _is_preprocess_file(path: Path) -> bool:
    return (
        path.is_file()
        and is_datamill_output(path)
        and path.name.endswith((HDF5_SUFFIX, META_SUFFIX))
    )


def dataset_stamp(root: Path) -> str | None:
    """A hash of the relative path, size and mtime of every file under ``root`` (None when absent).

    A rename keeps it; any run that writes the dataset again changes it (new mtimes).

    Examples:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "a").write_text("x")
        >>> dataset_stamp(d) == dataset_stamp(d), dataset_stamp(d / "absent")
        (True, None)
    """
    if not root.is_dir():
        return None
    entries: list[list[Any]] = []
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            try:
                st = path.stat()
            except OSError:
                return None
            entries.append([path.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns])
    return fingerprint_obj(sorted(entries))


def _recorded_stamp(meta_path: Path) -> str | None:
    try:
        stamp = read_meta(meta_path)[HEADER]["dataset"]["stamp"]
    except (CacheError, KeyError, TypeError):
        return None
    return stamp if isinstance(stamp, str) else None


def _recover_dataset(root: Path, meta_path: Path) -> bool:
    """Put back the old dataset when a run died after switching the dataset but before
    ``meta.json``."""
    backups = [b for b in find_litter(root.parent) if b.name.startswith(f".{root.name}.old-")]
    wanted = _recorded_stamp(meta_path)
    if not backups or wanted is None or dataset_stamp(root) == wanted:
        return False
    for backup in backups:
        if dataset_stamp(backup) == wanted:
            _replace_dir(backup, root)
            return True
    return False


def _replace_dir(src: Path, dst: Path) -> None:
    """Put the folder ``src`` at ``dst``, removing what is there (moved aside first, so a kill
    leaves litter only)."""
    if dst.exists():
        aside = dst.with_name(f".{dst.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.replace(dst, aside)
        os.replace(src, dst)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(src, dst)


def prepare_outputs(
    p: Plan, root: Path, *, fmt: str, inputs: Sequence[Any], overwrite: bool
) -> None:
    """Refuse output paths holding a user's file or an input; repair an interrupted switch; remove
    temporaries.

    Raises:
        DataFileError: an output path holds something that is not this engine's output (or is an
            input, or lies inside an input folder); with ``overwrite`` another kind of datamill
            output is replaced.
    """
    assert p.meta_path is not None and p.hdf5_path is not None
    paths = [x for x in inputs if isinstance(x, (str, os.PathLike))]
    for folder in (Path(x).resolve() for x in paths if Path(x).is_dir()):
        if folder == root.parent.resolve() or folder in root.parent.resolve().parents:
            raise DataFileError(
                "the output would be written inside the input folder (and read as input next time)",
                path=root,
                hint="choose an --output-dir outside the input folder",
            )
    outputs: list[tuple[Path, Callable[[Path], bool], str]] = [
        (root, is_own_dataset, "Ray preprocessing shardset dataset"),
        (p.meta_path, _is_preprocess_file, "preprocessing meta.json"),
    ]
    if fmt == "hdf5":
        outputs.append((p.hdf5_path, _is_preprocess_file, "preprocessed HDF5"))
    for path, is_own, what in outputs:
        check_output(path, is_own=is_own, inputs=paths, what=what, overwrite=overwrite)
    if root.parent.is_dir():
        _recover_dataset(root, p.meta_path)
        recover_interrupted_switch(p.hdf5_path, p.meta_path)
        for path in (root, p.meta_path, p.hdf5_path):
            clean_stale_temps(path)


def tmp_root(root: Path) -> Path:
    """A new hidden folder name beside ``root`` for the next dataset (litter once this process is
    gone)."""
    return root.with_name(f".{root.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def switch_in(new_root: Path, root: Path) -> Path | None:
    """Rename the committed dataset ``new_root`` to ``root``; the old one is kept aside (returned)
    until ``meta.json`` is in place."""
    old: Path | None = None
    if root.exists():
        old = root.with_name(f".{root.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.replace(root, old)
    try:
        fault_point(
            "ray.preprocess.between_dataset_renames"
        )  # killed here: the next run moves `old` back
        os.replace(new_root, root)
    except BaseException:
        if old is not None and not root.exists():
            os.replace(old, root)
        raise
    return old


def switch_back(root: Path, old: Path | None) -> None:
    """Undo :func:`switch_in` (an error before ``meta.json`` was switched): the old dataset goes
    back."""
    if old is not None:
        _replace_dir(old, root)
    else:
        shutil.rmtree(root, ignore_errors=True)


def cached_output(p: Plan, root: Path, *, fmt: str, uid_column: str) -> Metadata | None:
    """The metadata of a saved output that matches ``p`` exactly, else None.

    Matches: the fingerprint (the inputs' content, config, applied metadata, image files), the UID
    column, the dataset in place (:func:`dataset_stamp`) and, with ``fmt="hdf5"``, the HDF5's size,
    mtime and content hash recorded in ``meta.json``.
    """
    if p.meta_path is None or p.hdf5_path is None or p.fingerprint is None:
        return None
    try:
        doc = read_meta(p.meta_path)
        header = doc[HEADER]
        entry = header["dataset"]
        if (
            header["fingerprint"] != p.fingerprint
            or entry["uid_column"] != uid_column
            or entry.get("stamp") is None
            or entry["stamp"] != dataset_stamp(root)
        ):
            return None
        if fmt == "hdf5":
            h5 = header["hdf5"]
            st = p.hdf5_path.stat()
            if (h5["size"], h5["mtime_ns"]) != (st.st_size, st.st_mtime_ns) or fingerprint_file(
                p.hdf5_path
            ) != h5["xxh3"]:
                return None
    except (CacheError, OSError, KeyError, TypeError):
        return None
    return Metadata(doc)
