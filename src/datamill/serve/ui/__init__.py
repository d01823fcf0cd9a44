"""The web UI of ``datamill serve`` at ``/ui`` (needs the ``serve`` extra: fastapi, Jinja2).

Server-rendered pages (:mod:`datamill.serve.ui.pages` for datasets, samples and keys,
:mod:`datamill.serve.ui.runs` for iterations and runs, both rendered through
:mod:`datamill.serve.ui.render`), charts as SVG (:mod:`datamill.serve.ui.svg`), per-client counters
journaled for the UI (:mod:`datamill.serve.observe.ledger`), one CSS file, a favicon and one small
script of our own, all shipped as package data: nothing is built with node or npm and nothing is
downloaded. :func:`datamill.serve.http.app.create_app` mounts the pages and the JSON views
(:mod:`~datamill.serve.data.views`) with the API's routers.
"""
