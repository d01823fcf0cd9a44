"""The web UI of ``datamill serve`` at ``/ui`` (needs the ``serve`` extra: fastapi, Jinja2).

Server-rendered pages (:mod:`datamill.serve.ui.pages` for datasets, samples and keys,
:mod:`datamill.serve.ui.runs` for iterations and runs, both rendered through
:mod:`datamill.serve.ui.render`), charts as SVG (:mod:`datamill.serve.ui.svg`), per-client counters
journaled for the UI (:mod:`datamill.serve.observe.ledger`), one CSS file, a favicon and one small
script of our own, all shipped as package data: nothing is built with node or npm and nothing is
downloaded. :func:`install_ui` mounts the pages and the JSON views (:mod:`~.data.views`) on an app.
"""

from __future__ import annotations

from typing import Any

__all__ = ["install_ui"]


def install_ui(api: Any) -> None:
    """Add the ``/ui`` pages and the dataset views (``/api/v1/datasets/{id}/...``) to a FastAPI app.

    Examples:
        >>> import tempfile
        >>> from fastapi.testclient import TestClient
        >>> from datamill.serve.http.app import create_app  # calls install_ui
        >>> client = TestClient(create_app(tempfile.mkdtemp(), auth=False), base_url="http://localhost")
        >>> css = client.get("/ui/static/ui.css")
        >>> client.get("/ui/datasets").status_code, css.headers["content-type"]
        (200, 'text/css; charset=utf-8')
    """
    from datamill.serve.data.views import router as views
    from datamill.serve.ui.pages import root, router

    api.include_router(views)
    api.include_router(router)
    api.include_router(root)
