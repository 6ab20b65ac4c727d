"""The forecast service: FastAPI over the forecast archive that ``postcast forecast`` writes
(``pipeline/products/archive.py`` is the contract: layout, content, atomic writes, scores).

Endpoints (OpenAPI document at ``/openapi.json``, docs at ``/docs``):

* ``GET /health``: liveness, the numbers of forecasts and models, and ``degraded`` with the skipped
  entries (foreign names, unreadable content, a broken scores file) when there are any; never needs a
  token, and shows no server path unless the token comes with it;
* ``GET /metrics``: Prometheus text; labels are route templates and status codes only;
* ``GET /forecasts``: per target its models, best first, with their CRPS and the default model; then
  every forecast (target, init and valid time, product, model);
* ``GET /forecast/point``: mean, std, quantiles and exceedance probabilities at the nearest grid
  point for a target, model and valid time (the latest init time that covers it);
* ``GET /forecast/bbox``: mean and std on the grid points inside a latitude/longitude box;
* ``GET /map.png``: a map of a forecast (mean, spread, a quantile or an exceedance probability, with
  coastlines; rendered once per file and parameters);
* ``GET /`` and ``GET /forecast/law``: the forecaster's page and the law of a forecast (``page``);
* ``GET /docs``, ``GET /redoc``: the API pages, offline (``openapi``).

Every answer names its law: the point and box answers carry ``law`` (the predictive family, its
definition, units, where the thresholds come from, a note when the family can give values the target
cannot take); ``/forecasts`` gives each target's score units.

``model=`` picks a model; without it the target's models are tried best first: the lowest CRPS in
evaluate's ``metrics.json`` (``archive.SCORE_FILES``), then the unscored ones by name. The OpenAPI
document enumerates the archive's models as they are.

Every GET also answers HEAD. With a token (``--token`` or ``POSTCAST_TOKEN``) every path but
``/health`` (and ``/metrics`` with ``--public-metrics``) needs ``Authorization: Bearer <token>``,
unknown paths included. Errors are ``{"detail": "<message>"}``: 401, 404 (unknown target or time, or
only unreadable files for it; a model without that target), 422 (bad parameters, a model not in the
archive).

The archive is watched: at most every ``watch_s`` seconds a request rescans it (cheap: names and
``stat``), replaced files are reloaded, removed ones dropped, and files that cannot be read are
skipped with a warning and listed by ``/health``; a valid query is answered from the best readable
forecast and never with 500.

Modules: ``catalog`` (the archive, its caches, the model ranking), ``grid`` (a loaded field and its
nearest-point lookup), ``auth`` (the ASGI gate: token, HEAD, unknown parameters), ``metrics``
(Prometheus), ``schemas`` (answers and parameters), ``openapi`` (the document), ``rendering`` (map
and page); this module holds the application and its routes.
"""

from __future__ import annotations

import functools
import gc
import json
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Scope

from postcast.datasets import schema
from postcast.datasets.core.version import __version__
from postcast.pipeline.products import archive
from postcast.serve.auth import Gate, bearer_ok
from postcast.serve.catalog import Catalog
from postcast.serve.fast import FastRoute, point_params
from postcast.serve.grid import Served, as_asked, box_columns
from postcast.serve.law import QUANTITIES, describe
from postcast.serve.metrics import Stats
from postcast.serve.openapi import document, offline_docs
from postcast.serve.page import page_routes
from postcast.serve.rendering import PNGResponse, Shown, cached_map, render_map
from postcast.serve.schemas import (
    BoxAnswer,
    Health,
    Lat,
    Listing,
    Lon,
    Model,
    PointAnswer,
    Target,
    Time,
    check_threshold,
    error_answers,
    parse_time,
)

_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode  # json.dumps(obj, separators, allow_nan)


def _json(obj: dict[str, Any]) -> Response:
    """A compact strict-JSON answer (the routes build their dicts; the response models only document them;
    what is served is checked on loading, serve/grid.py, so no NaN reaches here)."""
    return Response(_ENCODE(obj).encode(), media_type="application/json")


def _grid_extent(lat: np.ndarray, lon: np.ndarray) -> str:
    """Where a product's grid points lie, for a box that holds none of them."""
    step = float(np.abs(np.diff(lat)).min()) if lat.size > 1 else 0.0
    return (
        f"the grid's points lie every {step:g} deg at latitude {lat.min():g}..{lat.max():g}, "
        f"longitude {lon.min():g}..{lon.max():g}: widen the box"
    )


def create_app(
    forecasts: str | Path, token: str | None = None, *, public_metrics: bool = False, watch_s: float | None = 2.0
) -> FastAPI:
    """The service over the archive ``forecasts``; ``token`` enables bearer auth on every path but
    /health (and /metrics when ``public_metrics``); the archive is rescanned at most every ``watch_s``
    seconds (None: only on ``/forecasts?refresh=true``)."""
    app = FastAPI(
        title="postcast",
        version=__version__,
        description="Calibrated ensemble forecasts written by `postcast forecast`.",
        docs_url=None,  # offline_docs serves them with local assets
        redoc_url=None,
    )
    catalog = Catalog(forecasts, watch_s)
    stats = Stats()
    open_paths = {"/health"} | ({"/metrics"} if public_metrics else set())
    routes: dict[str, frozenset[str] | None] = {}  # route template -> its query parameters (None: not checked)
    app.add_middleware(Gate, stats=stats, routes=routes, token=token, open_paths=open_paths)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(x) for x in e['loc'][1:]) or e['loc'][0]}: {e['msg']}" for e in exc.errors()]
        return JSONResponse({"detail": "; ".join(parts)}, status_code=422)

    _info_routes(
        app, catalog, stats, token, guarded=token is not None, metrics_guarded=token is not None and not public_metrics
    )
    _forecast_routes(app, guarded=token is not None)
    page_routes(app, catalog, guarded=token is not None)
    offline_docs(app)
    for r in app.routes:
        params = getattr(getattr(r, "dependant", None), "query_params", None)
        routes[getattr(r, "path", "")] = frozenset(p.alias for p in params) if params is not None else None
    document(app, catalog, set(routes) - open_paths if token is not None else set())
    # the point query's route is matched first (each route tried before it costs a point query ~2 us); no other
    # route's path can match /forecast/point, and the document keeps the paths in their order above
    app.router.routes.sort(key=lambda r: not isinstance(r, FastRoute))
    app.state.catalog = catalog
    return app


def _info_routes(
    app: FastAPI, catalog: Catalog, stats: Stats, token: str | None, *, guarded: bool, metrics_guarded: bool
) -> None:
    secret = token.encode() if token else None

    @app.get("/health", response_model=Health, responses=error_answers(422, guarded=False))
    async def health(request: Request) -> Response:
        """Open to probes: counts and names only (no server path); with the token, the details."""
        catalog.watch()
        header = request.headers.get("authorization")
        full = bearer_ok(header.encode("latin-1") if header is not None else None, secret)
        out: dict[str, Any] = {
            "status": "degraded" if catalog.skipped else "ok",
            "forecasts": len(catalog.entries),
            "models": len(catalog.all_models),
            "version": __version__,
            "skipped": [{"path": s.path, "reason": s.reason if full else s.public_reason} for s in catalog.skipped],
        }
        if full:
            out.update(
                archive=str(catalog.root.absolute()),
                scores=str(catalog.scores_file[1].resolve()) if catalog.scores_file else None,
            )
        return _json(out)

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses=error_answers(401, 422, guarded=metrics_guarded, json_media=True),
    )
    async def metrics() -> str:
        return stats.prometheus(catalog)


SCORE_SAYS = f"crps: {archive.SCORE}, the global area-weighted CRPS, in the target's units (lower is better)"
Show = Annotated[
    str, Query(description=f"what to draw: {', '.join(QUANTITIES)}", pattern="^(" + "|".join(QUANTITIES) + ")$")
]
Level = Annotated[
    float | None, Query(gt=0.0, lt=1.0, description="show=quantile: its probability level (default 0.5), e.g. 0.9")
]
Threshold = Annotated[
    float | None,
    Query(
        description="show=probability: the threshold (target units), e.g. 273.15 for t2m; default the file's first",
        allow_inf_nan=False,
    ),
]


def _forecast_routes(app: FastAPI, *, guarded: bool) -> None:
    """The forecast's routes (:func:`forecasts_list`, :func:`point`, :func:`bbox`, :func:`map_png`) on ``app``,
    their error answers documented with the token's 401 when ``guarded``."""
    answers = functools.partial(error_answers, guarded=guarded)
    app.add_api_route(
        "/forecasts", forecasts_list, methods=["GET"], response_model=Listing, responses=answers(401, 422)
    )
    app.router.add_api_route(
        "/forecast/point",
        point,
        methods=["GET"],
        response_model=PointAnswer,
        responses=answers(401, 404, 422),
        route_class_override=FastRoute,
    )
    fast = app.router.routes[-1]
    assert isinstance(fast, FastRoute)
    fast.fast = _point_fast
    app.add_api_route(
        "/forecast/bbox", bbox, methods=["GET"], response_model=BoxAnswer, responses=answers(401, 404, 422)
    )
    png = {"content": {"image/png": {}}, "description": MAP_SAYS}
    app.add_api_route(
        "/map.png",
        map_png,
        methods=["GET"],
        response_class=PNGResponse,
        responses={200: png, **answers(401, 404, 422, json_media=True)},
    )


async def _catalog(request: Request) -> Catalog:
    """The app's archive (``app.state.catalog``), handed to each forecast route."""
    catalog: Catalog = request.app.state.catalog
    return catalog


CatalogOf = Annotated[Catalog, Depends(_catalog)]
MAP_SAYS = "a PNG map of the forecast's mean, spread, a quantile or an exceedance probability"


async def forecasts_list(catalog: CatalogOf, refresh: bool = False) -> Response:
    """Per target its models, best first, with their scores and the default; then every forecast."""
    if refresh:
        catalog.refresh()
    else:
        catalog.watch()
    return _json(
        {
            "targets": [
                {**tm.listing(t), "units": schema.target(t).units, "score": SCORE_SAYS}
                for t, tm in catalog.models.items()
            ],
            "forecasts": [
                {
                    "target": e.target,
                    "init_time": e.init.isoformat(),
                    "valid_time": e.valid.isoformat(),
                    "product": e.product,
                    "model": e.model,
                }
                for e in catalog.entries
            ],
        }
    )


def _which(target: str, entry: archive.Product, s: Served) -> dict[str, Any]:
    """What an answer is of: the target and its units, the forecast's start and valid times, product and model."""
    return {
        "target": target,
        "units": s.field.units,
        "init_time": s.init,
        "valid_time": s.valid,
        "product": entry.product,
        "model": entry.model,
    }


async def point(
    catalog: CatalogOf,
    target: Target,
    lat: Lat,
    lon: Lon,
    time: Time = None,
    model: Model = None,
    threshold: Annotated[
        float | None, Query(description="exceedance threshold, target units", allow_inf_nan=False)
    ] = None,
) -> Response:
    # no docstring: it would be the operation's description in the OpenAPI document. FastAPI validates the
    # parameters here; a plainly valid query reaches point_answer without that (_point_fast, serve/fast.py)
    return point_answer(catalog, target, lat, lon, time, model, threshold)


def point_answer(
    catalog: Catalog, target: str, lat: float, lon: float, time: str | None, model: str | None, threshold: float | None
) -> Response:
    """The point answer for validated parameters (both ways to it: :func:`point` and :func:`_point_fast`)."""
    check_threshold(target, threshold)
    entry, s = catalog.resolve(target, model, parse_time(time))
    f = s.field
    i, j = s.lat(lat), s.lon(lon % 360.0)
    values: dict[str, Any] = {
        "latitude": float(f.lat[i]),
        "longitude": as_asked(float(f.lon[j]), lon),
        "mean": float(f.mean[i, j]),
        "std": float(f.std[i, j]),
        "quantiles": dict(zip(s.quantile_keys, f.quantiles[:, i, j].tolist(), strict=True)),
        "exceedance": dict(zip(s.threshold_keys, f.exceedance[:, i, j].tolist(), strict=True)),
    }
    if threshold is not None:
        values["exceedance"][f"{threshold:g}"] = archive.exceedance_at(f, i, j, threshold)  # the file's family
    members = None if f.members is None else f.members[:, i, j].tolist()  # finite: grid.check
    head, law = _point_parts(target, entry, s)
    # the bytes of _json({**_which(..), **values, "law": describe(..), "members": members}), the parts that
    # are the same for every point of the file encoded once
    body = f'{head}{_ENCODE(values)[1:-1]},{law},"members":{_ENCODE(members)}}}'
    return Response(body.encode(), media_type="application/json")


def _point_parts(target: str, entry: archive.Product, s: Served) -> tuple[str, str]:
    """The point answer's parts that are the same at every point of a file, encoded: the head (what the
    answer is of: :func:`_which`, up to its closing brace, exclusive) and ``"law":{..}`` (:func:`describe`)."""
    key = ("point", target, entry.product, entry.model)
    parts: tuple[str, str] | None = s.memo.get(key)
    if parts is None:
        parts = _ENCODE(_which(target, entry, s))[:-1] + ",", '"law":' + _ENCODE(describe(target, s.field))
        s.memo[key] = parts
    return parts


def _point_fast(scope: Scope) -> Response | None:
    """The point answer of a plainly valid query (:func:`postcast.serve.fast.point_params`), else None."""
    params = point_params(scope)
    if params is None:
        return None
    return point_answer(scope["app"].state.catalog, **params)


async def bbox(
    catalog: CatalogOf,
    target: Target,
    lat_min: Lat,
    lat_max: Lat,
    lon_min: Lon,
    lon_max: Lon,
    time: Time = None,
    model: Model = None,
) -> Response:
    entry, s = catalog.resolve(target, model, parse_time(time))
    f = s.field
    rows = (f.lat >= lat_min) & (f.lat <= lat_max)
    cols, shown = box_columns(f.lon, lon_min, lon_max)  # west to east, as asked
    if not rows.any() or not cols.size:  # lat_min > lat_max included: an empty box
        why = "lat_min must not exceed lat_max" if lat_min > lat_max else _grid_extent(f.lat, f.lon)
        raise HTTPException(
            404,
            f"no grid point inside the box (latitude {lat_min}..{lat_max}, longitude {lon_min}..{lon_max}; {why})",
        )
    return _json(
        {
            **_which(target, entry, s),
            "latitude": f.lat[rows].tolist(),
            "longitude": shown.tolist(),
            "mean": f.mean[np.ix_(rows, cols)].tolist(),
            "std": f.std[np.ix_(rows, cols)].tolist(),
            "law": describe(target, f),
        }
    )


async def map_png(
    catalog: CatalogOf,
    target: Target | None = None,
    time: Time = None,
    model: Model = None,
    show: Show = "mean",
    level: Level = None,
    threshold: Threshold = None,
) -> PNGResponse:
    """The map of ``target`` (default: the target of the last forecast listed, of ``model`` if given):
    ``show`` the mean, the spread, the quantile at ``level`` or the probability of exceeding ``threshold``."""
    target = target or catalog.latest_target(model)
    valid, shown = parse_time(time), Shown(show, level, threshold)
    # a map rendered already is answered on the event loop; a render (matplotlib, blocking) runs in a worker thread
    found = cached_map(catalog, target, model, valid, shown)
    if found is None:
        found = await run_in_threadpool(render_map, catalog, target, model, valid, shown)
    png, headers = found
    return PNGResponse(png, headers=headers)


def app_from_env() -> FastAPI:
    """App factory for uvicorn workers: ``POSTCAST_FORECASTS``, optional ``POSTCAST_TOKEN``,
    ``POSTCAST_PUBLIC_METRICS`` (1: /metrics open) and ``POSTCAST_WATCH_S`` (seconds; empty: no watch)."""
    import os

    watch = os.environ.get("POSTCAST_WATCH_S", "2")
    app = create_app(
        os.environ["POSTCAST_FORECASTS"],
        os.environ.get("POSTCAST_TOKEN") or None,
        public_metrics=os.environ.get("POSTCAST_PUBLIC_METRICS") == "1",
        watch_s=float(watch) if watch else None,
    )
    # The ~150,000 objects of the imports live as long as the process: frozen out of the collector, a full
    # collection no longer walks them (~170 ms each, stalling every request in flight; docs/serve.md)
    gc.collect()
    gc.freeze()
    return app
