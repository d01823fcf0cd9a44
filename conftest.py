"""Collection without the optional extras (rootdir conftest: it covers ``tests/`` and the
doctests of ``src/datamill``).

* ``timeout`` (pytest-timeout's ini option, in ``pyproject.toml``) is declared here when that
  plugin is not installed, so ``--strict-config`` accepts the file on a base install.
* A test module or doctest module that cannot be imported because a **third-party** module of an
  extra is missing is reported as skipped, naming the extra (``pip install 'datamill[torch]'``);
  a missing or broken **datamill** module stays a collection error, so it fails the run.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

EXTRA_OF = {
    "torch": "torch",
    "torchdata": "torch",
    "fastapi": "serve",
    "starlette": "serve",
    "uvicorn": "serve",
    "httpx": "serve",
    "jinja2": "serve",
    "prometheus_client": "serve",
    "ray": "ray",
    "datasets": "hf",
    "playwright": "test",
    "datasketch": "test",
    "trustme": "test",
}
"""Third-party top-level module -> the extra that installs it (``pyproject.toml``)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    if importlib.util.find_spec("pytest_timeout") is None:
        parser.addini("timeout", "pytest-timeout's per-test limit (the plugin is not installed)")


def _missing_extra(report: pytest.CollectReport) -> tuple[str, str] | None:
    """``(module, extra)`` when the collection failed on ``No module named`` an extra's module."""
    text = str(report.longrepr)
    marker = "No module named '"
    if marker not in text:
        return None
    missing = text.rsplit(marker, 1)[1].split("'", 1)[0]
    top = missing.split(".")[0]
    if top not in EXTRA_OF:
        return None
    return missing, EXTRA_OF[top]


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    report: pytest.CollectReport = yield
    if report.failed and isinstance(collector, pytest.File):
        found = _missing_extra(report)
        if found is not None:
            module, extra = found
            report.outcome = "skipped"
            report.longrepr = (
                str(collector.path),
                None,
                f"Skipped: needs the {extra} extra ({module}): pip install 'datamill[{extra}]'",
            )
    return report


MARKER_MODULES = {
    "torch": ("torch", "torch"),
    "ray": ("ray", "ray"),
    "browser": ("playwright", "test"),
}
"""Marker -> (the module its tests need, the extra that installs it)."""


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``torch``/``ray``/``browser`` is skipped, naming the extra, when the extra's
    module is not installed."""
    for marker, (module, extra) in MARKER_MODULES.items():
        if item.get_closest_marker(marker) and importlib.util.find_spec(module) is None:
            pytest.skip(f"needs the {extra} extra ({module}): pip install 'datamill[{extra}]'")
