"""The web UI of ``datamill serve`` at ``/ui`` (needs the ``serve`` extra: fastapi, Jinja2):
server-rendered pages, SVG charts, one CSS file and one small script shipped as package data
(nothing built with node or downloaded), mounted by :func:`datamill.serve.http.app.create_app`.
"""
