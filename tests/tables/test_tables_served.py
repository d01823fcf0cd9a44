"""A pinned table version served by ``datamill serve`` (a subprocess on loopback), registered by its
version file, read with both transports: the in-process Loader's batches, and the version in the
served iteration's record."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datamill.client import Client, Leases, RemoteLoader, Transport
from datamill.loader import Loader
from datamill.sources import open_source
from datamill.tables import pinned_version
from tests.serve._proc import free_port, make_key, start_server, stop
from tests.tables.formats import build, rows

pytestmark = [pytest.mark.server, pytest.mark.slow]


def _version_file(kind: str, t: Any) -> Path:
    """The file that pins the table's current version (what the server registers)."""
    if kind == "delta":
        return max((Path(t.path) / "_delta_log").glob("*.json"))
    if kind == "iceberg":
        return Path(t.table.metadata_location.removeprefix("file://"))
    import lance

    version = lance.dataset(t.path).version
    from datamill.tables.registry import lance_version_of

    return next(
        p for p in (Path(t.path) / "_versions").glob("*.manifest") if lance_version_of(p) == version
    )


def _same(a: dict[str, np.ndarray[Any, Any]], b: dict[str, np.ndarray[Any, Any]]) -> None:
    assert list(a) == list(b)
    for k, v in a.items():
        assert v.dtype == b[k].dtype and v.tolist() == b[k].tolist()


@contextlib.contextmanager
def _server(root: Path, state: Path) -> Iterator[tuple[str, str, str]]:
    """``datamill serve`` over ``root`` while the block runs: (its URL, an admin key, a read
    key); stopped by its process id after."""
    admin, read = make_key(state, "admin"), make_key(state, "read")
    port = free_port()
    proc = start_server(root, state, port)
    try:
        yield f"http://127.0.0.1:{port}", admin, read
    finally:
        stop(proc)


def _served_as_local(url: str, key: str, kind: str, want: list[Any]) -> list[str]:
    """Both transports (the server's build, a direct client) serve ``want``, the in-process
    Loader's batches; returns their iteration ids."""
    ids = []
    for transport in ("built", "direct"):
        loader = RemoteLoader(
            url,
            key,
            kind,
            batch_size=16,
            seed=4,
            leases=Leases(name=f"{kind}-{transport}"),
            transport=Transport(transport),
        )
        got = list(loader)
        assert len(got) == len(want) == 4
        for a, b in zip(got, want):
            _same(a, b)
        ids.append(loader.iteration_id)
    return ids


def test_pinned_versions_served_over_both_transports(tmp_path: Path) -> None:
    root = tmp_path / "root"
    pinned = {}
    for kind in ("delta", "iceberg", "lance"):
        t = build(kind, root / kind)
        pinned[kind] = _version_file(kind, t)
        t.write(rows(60, 70))  # appended after the pin: not served
    with _server(root, tmp_path / "state") as (url, admin, read):
        with Client(url, admin) as c:
            for kind, path in pinned.items():
                c.register(str(path.relative_to(root)), name=kind, client_location=str(path))
        for kind, path in pinned.items():
            src = open_source(path)
            assert int(src.shard_sizes().sum()) == 60
            for iteration in _served_as_local(url, read, kind, list(Loader(src, 16, seed=4))):
                with Client(url, read) as c:
                    record = c.http.request("GET", f"/api/v1/iterations/{iteration}/trace")
                assert pinned_version(record.json()) == (kind, src.version)


def test_a_table_folder_is_registered_as_its_current_version(tmp_path: Path) -> None:
    """Registering the folder pins the version it has then: rows appended later are not served,
    by the server's own build or by a direct client, and the dataset's path names the version."""
    root = tmp_path / "root"
    pinned = {}
    for kind in ("delta", "iceberg", "lance"):
        t = build(kind, root / kind)
        pinned[kind] = (t, _version_file(kind, t))
    with _server(root, tmp_path / "state") as (url, admin, read):
        with Client(url, admin) as c:
            for kind in pinned:
                folder = Path(pinned[kind][0].path)
                ds = c.register(
                    str(folder.relative_to(root)), name=kind, client_location=str(folder)
                )
                assert ds["path"] == str(pinned[kind][1].relative_to(root))
                assert ds["num_samples"] == 60
                again = c.register(str(folder.relative_to(root)), name=kind)
                assert again["path"] == ds["path"]  # the same version again
        for kind, (t, path) in pinned.items():
            t.write(rows(60, 70))  # appended after the registration: not served
            _served_as_local(url, read, kind, list(Loader(open_source(path), 16, seed=4)))
