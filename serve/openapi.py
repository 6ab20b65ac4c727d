"""The service's OpenAPI document as served: the archive's models as the enum of every ``model``
parameter (built again when they change) and the bearer scheme on the guarded operations."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from postcast.serve.catalog import Catalog


def document(app: FastAPI, catalog: Catalog, guarded: set[str]) -> None:
    """The OpenAPI document: the archive's models as the enum of every ``model`` parameter (built again
    when they change), and the bearer scheme required on the ``guarded`` operations (the check itself
    is :class:`postcast.serve.auth.Gate`'s)."""
    build = app.openapi
    shown: list[tuple[str, ...]] = []  # the models the cached document enumerates

    def openapi() -> dict[str, Any]:
        catalog.watch()
        models, spec = catalog.all_models, app.openapi_schema
        if spec is None or shown != [models]:
            app.openapi_schema = None  # FastAPI's build returns the document it cached
            spec = _annotate(build(), models, guarded)
            app.openapi_schema, shown[:] = spec, [models]
        return spec

    app.openapi = openapi  # type: ignore[method-assign]


def _annotate(spec: dict[str, Any], models: tuple[str, ...], guarded: set[str]) -> dict[str, Any]:
    """``spec`` with ``models`` as the enum of every ``model`` parameter and the bearer scheme required on
    the ``guarded`` operations."""
    for path, operations in spec["paths"].items():
        for op in operations.values():
            for param in op.get("parameters", ()):
                if param["name"] == "model":
                    param["schema"] = {"type": "string", "title": "Model", **({"enum": list(models)} if models else {})}
            if path in guarded:
                op["security"] = [{"bearer": []}]
    if guarded:
        spec.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
            "type": "http",
            "scheme": "bearer",
        }
    return spec
