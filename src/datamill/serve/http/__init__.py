"""The HTTP side: the app, the routers per resource (the lease routes among them), authentication
and roles, browser guards, connection bounds and ``serve()`` (uvicorn).
"""
