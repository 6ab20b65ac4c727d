"""The service's OpenAPI document as served: the archive's models as the enum of every ``model``
parameter (built again when they change) and the bearer scheme on the guarded operations; and its
pages (``/docs``, ``/redoc``) offline, their assets served by postcast."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI

from postcast.serve.catalog import Catalog

DOCS_ASSETS = "/docs/assets"  # where the Swagger UI and ReDoc assets are served


def document(app: FastAPI, catalog: Catalog, guarded: set[str]) -> None:
    """The OpenAPI document: the archive's models as the enum of every ``model`` parameter (built again
    when they change), the bearer scheme required on the ``guarded`` operations (the check itself
    is :class:`postcast.serve.auth.Gate`'s), and the paths in the order of the routes at this call."""
    build = app.openapi
    shown: list[tuple[str, ...]] = []  # the models the cached document enumerates
    # the paths in the order the routes are registered now (the app then moves its hot routes first, for speed)
    order = {path: k for k, path in enumerate(getattr(r, "path", "") for r in app.routes)}

    def openapi() -> dict[str, Any]:
        catalog.watch()
        models, spec = catalog.all_models, app.openapi_schema
        if spec is None or shown != [models]:
            app.openapi_schema = None  # FastAPI's build returns the document it cached
            spec = _annotate(build(), models, guarded)
            spec["paths"] = dict(sorted(spec["paths"].items(), key=lambda item: order.get(item[0], len(order))))
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


def offline_docs(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) and ``/redoc`` with their scripts and styles served by postcast from the
    package fastapi-offline (``/docs/assets``): nothing is loaded from a CDN, and Swagger UI's online
    validator is off. The pages take no query parameters of their own (the gate does not check them)."""
    import fastapi_offline
    from fastapi import Request
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
    from fastapi.responses import HTMLResponse
    from fastapi.staticfiles import StaticFiles

    assets = Path(fastapi_offline.__file__).with_name("static")
    app.mount(DOCS_ASSETS, StaticFiles(directory=assets), name="docs-assets")
    redirect = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    async def swagger(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - API",
            oauth2_redirect_url=redirect,
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png",
            swagger_ui_parameters={"validatorUrl": None},
        )

    async def oauth2_redirect(request: Request) -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    async def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - API",
            redoc_js_url=f"{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        )

    app.add_route("/docs", swagger, include_in_schema=False)
    app.add_route(redirect, oauth2_redirect, include_in_schema=False)
    app.add_route("/redoc", redoc, include_in_schema=False)
