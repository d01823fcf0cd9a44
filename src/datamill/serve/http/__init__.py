"""The HTTP side: the app (:mod:`~datamill.serve.http.app`), the routers per resource
(:mod:`~datamill.serve.http.routes`), authentication and roles, browser guards, the lease routes'
request and reply handling, and ``serve()`` (uvicorn)."""
