"""``LanceSource``: a Lance dataset, pinned to one version, as a Source.

Each fragment of the version is a shard (its rows counted after deletions, when the source opens);
a shard is read with ``pylance`` (``fragment.to_table(columns=...)``), which applies the fragment's
deletion file.

On object storage (``s3://``, opened by Lance with the ``AWS_*`` variables datamill's own S3
filesystem reads) a shard is read from a local *mirror* of the version in the shard cache folder:
the version's manifest and each fragment's data and deletion files, downloaded when the fragment is
first read (checked copies, :func:`~datamill.core.objstore.fetch_input`) and linked into the
dataset's layout (``<cache>/lance/<hash of the URL>/``). Lance files are never rewritten in place
(new names for new data), so a warm mirror is read with no request to the store.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import xxhash
from numpy.typing import NDArray

from datamill.core.errors import ConfigError, DataFileError, DataFileNotFoundError
from datamill.core.objstore import default_cache_dir, fetch_input
from datamill.core.optional import require
from datamill.core.source import SchemaColumns, check_read_args
from datamill.core.storage import filesystem_for, scheme_of, storage_error
from datamill.tables.common import (
    check_uid_column,
    lance_version_of,
    pinned_table_url,
    s3_env_options,
    table_fingerprint,
)

__all__ = ["LanceSource", "lance_storage_options"]

_LANCE_S3 = {
    "region": "region",
    "endpoint": "endpoint",
    "allow_http": "allow_http",
    "AWS_ACCESS_KEY_ID": "access_key_id",
    "AWS_SECRET_ACCESS_KEY": "secret_access_key",
}


def lance_storage_options(location: str) -> dict[str, str]:
    """Lance storage options for ``location``: on ``s3://``, from the ``AWS_*`` variables.

    Examples:
        >>> lance_storage_options("/tmp/t.lance")
        {}
    """
    return s3_env_options(location, _LANCE_S3)


def _open(location: str, version: int | None) -> Any:
    lance = require("lance", extra="tables")
    uri = location if scheme_of(location).remote else os.path.abspath(location)
    try:
        return lance.dataset(uri, version=version, storage_options=lance_storage_options(location))
    except (ValueError, OSError) as exc:
        text = " ".join(str(exc).split()).split(", /")[0]
        if "not found" in text.lower() or "does not exist" in text.lower():
            if version is not None:
                raise DataFileNotFoundError(
                    f"Lance version {version} is not there ({text}): it was cleaned up "
                    "(cleanup_old_versions) or never existed",
                    path=location,
                    shard=f"version {version}",
                    hint="resume from a version that still exists",
                ) from exc
            raise DataFileNotFoundError(f"no Lance dataset here ({text})", path=location) from exc
        raise DataFileError(f"cannot open the Lance dataset ({text})", path=location) from exc


class LanceSource(SchemaColumns):
    """A Lance dataset at one version (the latest when not given), one shard per fragment.

    Args:
        path: the dataset's folder (``x.lance``) or URL (``s3://bucket/x.lance``).
        version: the version to read. Defaults to ``None`` (the latest, resolved once now).
        cache_dir: on object storage: where the local mirror of the version goes. Defaults to
            ``None`` (:func:`~datamill.core.objstore.default_cache_dir`).
        cache_limit: unused (the mirror keeps what it fetched). Defaults to ``None``.
        uid_column: the column identifying a sample. Defaults to ``None``.

    Raises:
        DataFileNotFoundError: no dataset there, or the version was cleaned up (named).

    Examples:
        >>> import tempfile, lance
        >>> path = tempfile.mkdtemp() + "/t.lance"
        >>> _ = lance.write_dataset(pa.table({"x": [1, 2, 3]}), path)
        >>> _ = lance.write_dataset(pa.table({"x": [4]}), path, mode="append")
        >>> src = LanceSource(path, version=1)
        >>> src.version, src.shard_sizes().tolist(), src.read_shard(0).to_pydict()
        (1, [3], {'x': [1, 2, 3]})
        >>> LanceSource(path).shard_sizes().tolist()
        [3, 1]
    """

    kind = "lance"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        version: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        uid_column: str | None = None,
    ) -> None:
        self.location = os.fspath(path).rstrip("/")
        if version is not None and (isinstance(version, bool) or int(version) < 1):
            raise ConfigError(f"version must be an integer >= 1, got {version!r}")
        ds = _open(self.location, None if version is None else int(version))
        self.version: int = int(ds.version)
        self._ds: Any = ds
        self.schema: pa.Schema = ds.schema
        self.uid_column = check_uid_column(uid_column, self.schema, self.location)
        frags = sorted(ds.get_fragments(), key=lambda f: f.fragment_id)
        self._ids = [int(f.fragment_id) for f in frags]
        self._files = [
            [f"data/{d.path}" for d in f.data_files()]
            + ([str(f.deletion_file())] if f.deletion_file() else [])
            for f in frags
        ]
        self.remote = scheme_of(self.location).remote
        self.fetched = 0
        self._mirror: Path | None = None
        self._manifest = ""
        if self.remote:
            base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
            key = xxhash.xxh3_64_hexdigest(self.location.encode("utf-8"))
            self._mirror = base / "lance" / key
            self._manifest = self._manifest_name()
            self._ds = None  # shards are read from the local mirror
        self._sizes = np.array([f.count_rows() for f in frags], dtype=np.int64)
        content = [
            self.schema.remove_metadata().to_string(),
            [
                [i, [d.path for d in f.data_files()], _deletion_path(f), int(n)]
                for i, f, n in zip(self._ids, frags, self._sizes)
            ],
        ]
        self._fingerprint = table_fingerprint("lance", self.version, content)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_ds": None}  # reopened (same version) where it is unpickled

    def _dataset(self) -> Any:
        if self._ds is None:
            where = self.location if self._mirror is None else str(self._mirror)
            self._ds = _open(where, self.version)
        return self._ds

    def _manifest_name(self) -> str:
        """``_versions/<name>.manifest`` of this version on the store (one listing)."""
        fs, root = filesystem_for(self.location)
        try:
            infos = fs.get_file_info(pafs.FileSelector(f"{root}/_versions"))
        except OSError as exc:
            raise storage_error(exc, self.location) from exc
        for info in infos:
            name = info.path.rpartition("/")[2]
            ok = name.endswith(".manifest") and name[:-9].isdigit()
            if ok and lance_version_of(Path(name)) == self.version:
                return f"_versions/{name}"
        raise DataFileNotFoundError(
            f"Lance version {self.version} has no manifest on the store",
            path=self.location,
            shard=f"version {self.version}",
        )

    def _fetch(self, index: int) -> None:
        """The manifest and fragment ``index``'s files into the local mirror (checked copies,
        linked under their names in the dataset's layout; present ones are not fetched again)."""
        assert self._mirror is not None
        for rel in [self._manifest, *self._files[index]]:
            link = self._mirror / rel
            if link.exists():
                continue
            copy = fetch_input(f"{self.location}/{rel}", cache_dir=self._mirror.parent / "files")
            self.fetched += 1
            link.parent.mkdir(parents=True, exist_ok=True)
            # one name per thread: the shard readers fetch fragments (and the manifest) at once
            tmp = link.with_name(f".{link.name}.{os.getpid()}.{threading.get_ident()}.partial")
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(copy)
            os.replace(tmp, link)

    @property
    def num_shards(self) -> int:
        """Fragments."""
        return len(self._ids)

    def shard_sizes(self) -> NDArray[np.int64]:
        """Rows per fragment, deleted rows not counted."""
        return self._sizes.copy()

    def fingerprint(self) -> str:
        """``"lance@v<version>-<hash>"``: the pinned version and its fragments."""
        return self._fingerprint

    def read_shard(self, index: int, *, columns: Sequence[str] | None = None) -> pa.Table:
        """Fragment ``index`` with the chosen columns, deleted rows dropped."""
        cols = check_read_args(self, index, columns, path=self.location)
        if self._mirror is not None:
            self._fetch(index)
        try:
            frag = self._dataset().get_fragment(self._ids[index])
            table = frag.to_table(columns=cols)
        except (ValueError, OSError) as exc:
            raise DataFileError(
                f"cannot read fragment {self._ids[index]} ({' '.join(str(exc).split())})",
                path=self.location,
                shard=index,
            ) from exc
        return table.select(cols).replace_schema_metadata(None)

    @property
    def pinned_url(self) -> str:
        """A URL that opens this version again (``lance:///path?version=N``)."""
        return pinned_table_url("lance", self.location, f"version={self.version}")

    def __repr__(self) -> str:
        return (
            f"LanceSource({self.location!r}, version={self.version}, shards={self.num_shards}, "
            f"rows={int(self._sizes.sum())})"
        )


def _deletion_path(fragment: Any) -> str | None:
    d = fragment.deletion_file()
    return None if d is None else str(d)
