"""Read-only views of registered datasets for the web UI: kind, statistics, checks
(:mod:`datamill.loader.describe`), samples. :class:`Inspector` opens and caches the server's
datasets; :data:`router` exposes it as JSON under ``/api/v1/datasets/{id}/`` (``describe``,
``columns/{column}/values``, ``samples``: ``docs/serving.md``). No request names a file: an image
stored as a path is served by ``(dataset, row, column)``, only inside the server's roots.
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
from fastapi import APIRouter, Depends, Query, Request

from datamill.core.errors import ConfigError, DatamillError, NotFoundError
from datamill.core.source import Source, take_rows
from datamill.loader import describe
from datamill.loader.describe import check_column, column_values
from datamill.loader.samples import IMAGE_EXT, MAX_LIMIT, row_of, sample_page
from datamill.serve.http.access import Reader, check_dataset
from datamill.shards.check import check_report
from datamill.shards.dataset import ShardsetDataset

__all__ = [
    "Inspector",
    "LimitQuery",
    "OffsetQuery",
    "ValueJob",
    "ValueStats",
    "inspector",
    "router",
]


@dataclass
class ValueJob:
    """One column's computation: ``done`` of ``total`` shards read, then ``result`` or ``error``."""

    total: int
    done: int = 0
    result: dict[str, Any] | None = None
    error: str | None = None

    def view(self) -> dict[str, Any]:
        """``{"status": "running"|"done"|"error", "done", "total", ...}`` as JSON."""
        status = "error" if self.error else "done" if self.result is not None else "running"
        return {"status": status} | {
            k: getattr(self, k) for k in ("done", "total", "error", "result")
        }


class ValueStats:
    """Compute :func:`~datamill.loader.describe.column_values` on a background thread (so the page
    can show progress) and cache it per ``(dataset fingerprint, column)``.

    Examples:
        >>> from datamill.core.source import TableSource
        >>> vs = ValueStats()
        >>> job = vs.get("fp", "x", lambda: TableSource(pa.table({"x": [1, 1, 2]}), shard_size=2))
        >>> vs.wait("fp", "x", timeout=10).result["top"][0]
        {'value': 1, 'count': 2}
    """

    def __init__(self) -> None:
        self._jobs: dict[tuple[str, str], ValueJob] = {}
        self._events: dict[tuple[str, str], threading.Event] = {}
        self._lock = threading.Lock()

    def get(self, fingerprint: str, column: str, open_source: Callable[[], Source]) -> ValueJob:
        """The job of ``column`` (started now on a background thread if new)."""
        key = (fingerprint, column)
        with self._lock:
            job = self._jobs.get(key)
            if job is not None:
                return job
            source = open_source()
            job = self._jobs[key] = ValueJob(total=int(source.num_shards))
            event = self._events[key] = threading.Event()
        threading.Thread(
            target=self._run,
            args=(job, source, column, event),
            daemon=True,
            name=f"datamill-ui-stats-{column}",
        ).start()
        return job

    def wait(self, fingerprint: str, column: str, *, timeout: float) -> ValueJob:
        """The job after it finished (or after ``timeout`` seconds)."""
        self._events[(fingerprint, column)].wait(timeout)
        return self._jobs[(fingerprint, column)]

    @staticmethod
    def _run(job: ValueJob, source: Source, column: str, event: threading.Event) -> None:
        try:
            job.result = column_values(source, column, on_shard=lambda k: setattr(job, "done", k))
        except DatamillError as exc:
            job.error = exc.one_line()
        except (pa.ArrowException, ValueError, OSError) as exc:
            job.error = f"{type(exc).__name__}: {exc}"
        finally:
            event.set()


class Inspector:
    """Describe the registered datasets (each opened once, by the catalog's ``source``).

    Args:
        state: the server's :class:`~datamill.serve.server.ServeState`.

    Examples:
        >>> import tempfile, pyarrow as pa
        >>> from pathlib import Path
        >>> from datamill.serve.server import ServeState
        >>> from datamill.shards.dataset import ShardsetDataset
        >>> root = Path(tempfile.mkdtemp())
        >>> ds = ShardsetDataset.create(
        ...     root / "d",
        ...     pa.table({"uid": [1, 2], "x": [3, 4]}),
        ...     uid="uid",
        ...     shardset="a",
        ...     shard_size=2,
        ... )
        >>> _ = ds.add("b", pa.table({"uid": [2], "y": ["z"]}), route=True)
        >>> state = ServeState(root / ".state", roots=[root], auth=False)
        >>> insp = Inspector(state)
        >>> ds_id = state.register("d", name="d")["id"]
        >>> insp.summary("d")["kind"], insp.detail("d")["describe"]["shardsets"][1]["missing"]
        ('shardset dataset', 1)
        >>> [[c["t"] for c in r["cells"]] for r in insp.samples("d", columns=["y"])["rows"]]
        [['missing'], ['value']]
        >>> state.close()
    """

    def __init__(self, state: Any) -> None:
        self.state = state
        self.stats = ValueStats()
        self._checks: dict[str, list[dict[str, Any]]] = {}

    def source(self, ref: str, *, column: str | None = None) -> Source:
        """The opened source of a dataset (:meth:`~datamill.serve.catalog.Catalog.source`), which
        must have ``column`` when one is named (:class:`~datamill.core.errors.SchemaError`)."""
        src: Source = self.state.source(ref)
        if column is not None:
            check_column(src, column)
        return src

    def summary(self, ref: str) -> dict[str, Any]:
        """``id, name, path`` and :func:`~datamill.loader.describe.summary` (``kind: unreadable``
        and ``error`` if unreadable)."""
        row = self.state.dataset(ref)
        out = {"id": row["id"], "name": row["name"], "path": self.state.relative(row["path"])}
        try:
            return out | describe.summary(self.source(ref), path=row["path"])
        except DatamillError as exc:
            return {**out, "kind": "unreadable", "error": exc.one_line()}

    def detail(self, ref: str) -> dict[str, Any]:
        """:meth:`summary` plus :func:`~datamill.loader.describe.details` (a shardset dataset's
        ``check`` cached by its fingerprint)."""
        out = self.summary(ref)
        if "error" in out:
            return out
        src, path = self.source(ref), self.state.dataset(ref)["path"]
        out |= describe.details(src, path=path, check=False)
        if isinstance(src, ShardsetDataset):
            key = f"{path}@{src.fingerprint()}"
            if key not in self._checks:
                self._checks[key] = check_report(src.loc)
            out["check"] = self._checks[key]
        return out

    def samples(
        self,
        ref: str,
        *,
        offset: int = 0,
        limit: int = 20,
        columns: list[str] | None = None,
        where: tuple[str, str] | None = None,
    ) -> dict[str, Any]:
        """:func:`~datamill.loader.samples.sample_page` of a dataset, its image files served by
        the file route when they lie under the server's roots."""
        ds_id = self.state.dataset(ref)["id"]

        def image(value: str, row: int, column: str) -> dict[str, Any]:
            return _image_path_cell(value, column, row, ds_id, target=self._inside(ref, value))

        path = self.state.dataset(ref)["path"]
        src = self.source(ref)
        return sample_page(
            src, path=path, offset=offset, limit=limit, columns=columns, where=where, image=image
        )

    def locate(self, ref: str, value: str) -> int:
        """The row of a sample: its UID (shardset datasets) or its row number
        (:func:`~datamill.loader.samples.row_of`).

        Raises:
            NotFoundError: no sample has that UID or row.
        """
        return row_of(self.source(ref), value, name=self.state.dataset(ref)["name"])

    def values(self, ref: str, column: str) -> dict[str, Any]:
        """Top values and histogram of a column (:meth:`ValueStats.get`'s job as JSON: ``status``
        ``running`` until computed)."""
        src = self.source(ref, column=column)
        return self.stats.get(src.fingerprint(), column, lambda: src).view()

    def cell_file(self, ref: str, *, row: int, column: str) -> tuple[bytes, str]:
        """``(bytes, mime)`` of the image a cell names by path, resolved inside the server's
        roots."""
        src = self.source(ref, column=column)
        if not 0 <= row < int(np.asarray(src.shard_sizes()).sum()):
            raise NotFoundError(f"no row {row}")
        value = take_rows(src, [row], [column]).column(column)[0].as_py()
        if not isinstance(value, str):
            raise NotFoundError(f"row {row} column {column!r} holds no file path")
        target = self._inside(ref, value)
        if target is None:
            raise ConfigError(
                f"row {row} column {column!r} points outside the server's roots", column=column
            )
        mime = IMAGE_EXT.get(target.suffix.lower())
        if mime is None or not target.is_file():
            raise NotFoundError(
                f"row {row} column {column!r}: no image file there", path=str(value)
            )
        return target.read_bytes(), mime

    def _inside(self, ref: str, value: str) -> Path | None:
        """The file a cell's path names (from the dataset's folder) if it lies under a root."""
        base = Path(self.state.dataset(ref)["path"])
        target = Path(os.path.realpath((base if base.is_dir() else base.parent) / value))
        return target if any(r == target or r in target.parents for r in self.state.roots) else None


def _image_path_cell(
    value: str, column: str, row: int, ds_id: str, *, target: Path | None
) -> dict[str, Any]:
    """An image file's path: the image (served by the file route) when it lies under a root."""
    if target is None or not target.is_file():
        # a path column whose files are elsewhere (the demo's cifar): its text, not an error
        note = f"{value} (no image file there under the server's roots)"
        return {"t": "value", "v": value, "full": note}
    return {
        "t": "image",
        "mime": IMAGE_EXT[Path(value).suffix.lower()],
        "path": value,
        "src": f"/ui/datasets/{ds_id}/file?row={row}&column={urllib.parse.quote(column)}",
    }


def inspector(request: Request) -> Inspector:
    """The app's :class:`Inspector` (a dependency)."""
    insp: Inspector = request.app.state.inspector
    return insp


router = APIRouter(prefix="/api/v1/datasets")
Insp = Annotated[Inspector, Depends(inspector)]
OffsetQuery = Annotated[int, Query(ge=0, le=1 << 40)]  # a page's first sample (UI and API)
LimitQuery = Annotated[int, Query(ge=1, le=MAX_LIMIT)]  # a page's samples (UI and API)


@router.get("/{ref}/describe")
def describe_route(who: Reader, ref: str, insp: Insp) -> dict[str, Any]:
    """A dataset's :meth:`Inspector.detail`."""
    check_dataset(who, insp.state, ref)
    return insp.detail(ref)


@router.get("/{ref}/columns/{column}/values")
def values_route(who: Reader, ref: str, column: str, insp: Insp) -> dict[str, Any]:
    """Top values and histogram of a column (``status`` ``running`` until computed)."""
    check_dataset(who, insp.state, ref)
    return insp.values(ref, column)


@router.get("/{ref}/samples")
def samples_route(
    who: Reader,
    ref: str,
    insp: Insp,
    offset: OffsetQuery = 0,
    limit: LimitQuery = 20,
    columns: Annotated[str | None, Query(max_length=10_000)] = None,
) -> dict[str, Any]:
    """A page of samples (``columns`` comma-separated)."""
    check_dataset(who, insp.state, ref)
    return insp.samples(
        ref, offset=offset, limit=limit, columns=columns.split(",") if columns else None
    )
