"""Small tables of each format for the tests: create, append, compact, delete, vacuum, open."""

from __future__ import annotations

import datetime
import json
import struct
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from datamill.core.source import Source


def rows(lo: int, hi: int, *, extra: bool = False) -> pa.Table:
    """Rows ``uid`` in ``[lo, hi)``: an int, a float, a ragged list and a string column."""
    uid = np.arange(lo, hi, dtype=np.int64)
    cols: dict[str, Any] = {
        "uid": uid,
        "x": (uid * 0.5).astype(np.float32),
        "tok": pa.array([[int(u)] * int(u % 3) for u in uid], pa.list_(pa.int32())),
        "label": pa.array([f"c{u % 4}" for u in uid]),
    }
    if extra:
        cols["extra"] = uid * 10
    return pa.table(cols)


class Delta:
    kind = "delta"

    def __init__(self, root: Path, storage_options: dict[str, str] | None = None) -> None:
        self.path = str(root / "delta_t") if "://" not in str(root) else f"{root}/delta_t"
        self.opts = storage_options

    def write(self, table: pa.Table, *, mode: str = "append", **kw: Any) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.path, table, mode=mode, storage_options=self.opts, **kw)

    def add_column(self, table: pa.Table) -> None:
        self.write(table, schema_mode="merge")

    def compact(self) -> None:
        from deltalake import DeltaTable

        DeltaTable(self.path, storage_options=self.opts).optimize.compact()

    def delete(self, predicate: str) -> None:
        from deltalake import DeltaTable

        DeltaTable(self.path, storage_options=self.opts).delete(predicate)

    def vacuum(self) -> None:
        from deltalake import DeltaTable

        DeltaTable(self.path, storage_options=self.opts).vacuum(
            retention_hours=0, enforce_retention_duration=False, dry_run=False
        )

    def open(self, version: int | None = None, **kw: Any) -> Source:
        from datamill.tables import DeltaSource

        return DeltaSource(self.path, version=version, **kw)


class Iceberg:
    kind = "iceberg"

    def __init__(self, root: Path, props: dict[str, str] | None = None) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        local = Path(props.pop("catalog_dir")) if props and "catalog_dir" in props else root
        local.mkdir(parents=True, exist_ok=True)
        warehouse = props.pop("warehouse") if props and "warehouse" in props else f"file://{root}"
        self.catalog = SqlCatalog(
            "t", uri=f"sqlite:///{local}/catalog.db", warehouse=warehouse, **(props or {})
        )
        self.catalog.create_namespace("db")
        self.table: Any = None

    @property
    def path(self) -> str:
        loc = self.table.metadata.location
        return loc.removeprefix("file://")

    def write(self, table: pa.Table, *, mode: str = "append") -> None:
        if self.table is None:
            self.table = self.catalog.create_table("db.t", schema=table.schema)
        if mode == "overwrite":
            self.table.overwrite(table)
        else:
            self.table.append(table)

    def add_column(self, table: pa.Table) -> None:
        with self.table.update_schema() as upd:
            upd.union_by_name(table.schema)
        self.table.append(table)

    def compact(self) -> None:
        """Every row rewritten into one new file (an overwrite snapshot), as a compaction does."""
        self.table.overwrite(self.table.scan().to_arrow())

    def delete(self, predicate: str) -> None:
        self.table.delete(predicate)

    def vacuum(self) -> None:
        """Expire every snapshot but the current one."""
        current = self.table.current_snapshot().snapshot_id
        old = [s.snapshot_id for s in self.table.snapshots() if s.snapshot_id != current]
        self.table.maintenance.expire_snapshots().by_ids(old).commit()

    def open(self, version: int | None = None, **kw: Any) -> Source:
        from datamill.tables import IcebergSource

        return IcebergSource(self.path, snapshot_id=version, **kw)


class Lance:
    kind = "lance"

    def __init__(self, root: Path, storage_options: dict[str, str] | None = None) -> None:
        self.path = str(root / "t.lance") if "://" not in str(root) else f"{root}/t.lance"
        self.opts = storage_options

    def write(self, table: pa.Table, *, mode: str = "append") -> None:
        import lance

        if mode == "append" and not self._exists():
            mode = "create"
        lance.write_dataset(
            table, self.path, mode=mode, max_rows_per_file=20, storage_options=self.opts
        )

    def _exists(self) -> bool:
        import lance

        try:
            lance.dataset(self.path, storage_options=self.opts)
        except (ValueError, OSError):
            return False
        return True

    def _ds(self) -> Any:
        import lance

        return lance.dataset(self.path, storage_options=self.opts)

    def add_column(self, table: pa.Table) -> None:
        raise NotImplementedError

    def compact(self) -> None:
        self._ds().optimize.compact_files()

    def delete(self, predicate: str) -> None:
        self._ds().delete(predicate)

    def vacuum(self) -> None:
        self._ds().cleanup_old_versions(older_than=datetime.timedelta(0), delete_unverified=True)

    def open(self, version: int | None = None, **kw: Any) -> Source:
        from datamill.tables import LanceSource

        return LanceSource(self.path, version=version, **kw)


FORMATS = {"delta": Delta, "iceberg": Iceberg, "lance": Lance}


def build(kind: str, root: Path, *, parts: int = 3, per: int = 20) -> Any:
    """A table of ``kind`` with ``parts`` appends of ``per`` rows (one data file each)."""
    t = FORMATS[kind](root)
    for i in range(parts):
        t.write(rows(i * per, (i + 1) * per))
    return t


def add_deletion_vector(table: Path, deleted: dict[str, list[int]]) -> None:
    """Commit Delta deletion vectors (``storageType: p``, a file beside the data) by hand:
    delta-rs reads them but does not write them."""
    from pyroaring import BitMap

    log = table / "_delta_log"
    last = max(int(p.stem) for p in log.glob("*.json"))
    live: dict[str, dict[str, Any]] = {}
    for p in sorted(log.glob("*.json")):
        for line in p.read_text().splitlines():
            a = json.loads(line)
            if "add" in a:
                live[a["add"]["path"]] = a["add"]
            if "remove" in a:
                live.pop(a["remove"]["path"], None)
    actions: list[dict[str, Any]] = []
    for path, positions in deleted.items():
        add = dict(live[path])
        bitmap = struct.pack("<QI", 1, 0) + BitMap(positions).serialize()
        data = struct.pack("<I", 1681511377) + bitmap
        dv = table / f"deletion_vector_{uuid.uuid4()}.bin"
        dv.write_bytes(
            b"\x01" + struct.pack(">I", len(data)) + data + struct.pack(">I", zlib.crc32(data))
        )
        actions.append(
            {
                "remove": {
                    "path": path,
                    "dataChange": True,
                    "deletionTimestamp": int(time.time() * 1000),
                    "extendedFileMetadata": True,
                    "partitionValues": add["partitionValues"],
                    "size": add["size"],
                }
            }
        )
        add["deletionVector"] = {
            "storageType": "p",
            "pathOrInlineDv": dv.resolve().as_uri(),
            "offset": 1,
            "sizeInBytes": len(data),
            "cardinality": len(positions),
        }
        actions.append({"add": add})
    (log / f"{last + 1:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def add_iceberg_deletes(
    table: Any, data_path: str, positions: list[int], *, equality: bool = False
) -> None:
    """Commit a positional (or equality) delete file by hand: pyiceberg reads them but writes
    copy-on-write deletes only (its fast append takes any content of data file)."""
    import os

    import pyarrow.parquet as pq
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    local = data_path.removeprefix("file://")
    out = f"{os.path.dirname(local)}/delete-{uuid.uuid4()}.parquet"
    if equality:
        pq.write_table(pa.table({"uid": pa.array(positions, pa.int64())}), out)
        content, extra = DataFileContent.EQUALITY_DELETES, {"equality_ids": [1]}
    else:
        pos = pa.array(positions, pa.int64())
        pq.write_table(pa.table({"file_path": [data_path] * len(positions), "pos": pos}), out)
        content, extra = DataFileContent.POSITION_DELETES, {}
    df = DataFile.from_args(
        content=content,
        file_path="file://" + out,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=len(positions),
        file_size_in_bytes=os.path.getsize(out),
        **extra,
    )
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(df)
