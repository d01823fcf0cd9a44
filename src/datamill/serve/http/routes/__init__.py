"""The JSON API of ``datamill serve``: one FastAPI router per resource (imports fastapi); each
route declares its role (:func:`datamill.serve.http.access.requires`): ``docs/serving.md``."""

from __future__ import annotations

__all__: list[str] = []  # the routers are mounted by :func:`datamill.serve.http.app.create_app`
