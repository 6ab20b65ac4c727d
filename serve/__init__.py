"""The HTTP forecast service over the files ``postcast forecast`` writes.

Modules: ``app`` (the FastAPI application: point and box queries, listing, health, Prometheus
metrics, a map page) and ``testing`` (public helpers to write a small forecast directory and run the
real service in a subprocess, for tests and load benchmarks).
"""
