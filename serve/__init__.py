"""The HTTP forecast service over the files ``postcast forecast`` writes.

Modules: ``app`` (the FastAPI application and its routes: point and box queries, listing, health,
Prometheus metrics, maps), ``catalog`` (the archive as the service sees it: scanning, caches,
the models ranked by their scores), ``grid`` (a loaded field and its nearest-point lookup), ``auth``
(the ASGI gate: bearer token, HEAD, unknown query parameters), ``metrics`` (the Prometheus counters),
``schemas`` (the documented answers and query parameters), ``openapi`` (the document as served, and
the offline /docs), ``law`` (the law every answer names, the quantities a map draws), ``page`` (the
forecaster's page and its static files), ``rendering`` (the PNG map), ``server`` (how uvicorn runs it) and ``testing``
(public helpers to write a small forecast directory and run the real service in a subprocess, for
tests and load benchmarks).
"""
