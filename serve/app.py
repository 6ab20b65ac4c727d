"""The forecast service: FastAPI over the forecast archive that ``postcast forecast`` writes
(``pipeline/archive.py`` is the contract: layout, content, atomic writes).

Endpoints (OpenAPI document at ``/openapi.json``, docs at ``/docs``):

* ``GET /health``: liveness, the number of forecasts served, and ``degraded`` with the skipped files
  (foreign names, unreadable content) when there are any; never needs a token;
* ``GET /metrics``: Prometheus text; labels are route templates and status codes only;
* ``GET /forecasts``: what is available (target, init and valid time, product, model);
* ``GET /forecast/point``: mean, std, quantiles and exceedance probabilities at the nearest grid
  point for a target and valid time (the latest init time that covers it);
* ``GET /forecast/bbox``: mean and std on the grid points inside a latitude/longitude box;
* ``GET /map.png`` and ``GET /``: a map of a forecast (rendered once per file and parameters) and an
  HTML page with the latest one.

Every GET also answers HEAD. With a token (``--token`` or ``POSTCAST_TOKEN``) every path but
``/health`` (and ``/metrics`` with ``--public-metrics``) needs ``Authorization: Bearer <token>``,
unknown paths included. Errors are ``{"detail": "<message>"}``: 401, 404 (unknown target or time, or
only unreadable files for it), 422 (bad parameters).

The archive is watched: at most every ``watch_s`` seconds a request rescans it (cheap: names and
``stat``), replaced files are reloaded, removed ones dropped, and files that cannot be read are
skipped with a warning and listed by ``/health``; a valid query is answered from the best readable
forecast and never with 500.
"""

from __future__ import annotations

import hmac
import html
import io as pyio
import json
import logging
import re
import threading
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl

import numpy as np
import pandas as pd
from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from pandas.errors import OutOfBoundsDatetime
from pydantic import BaseModel
from scipy.special import ndtr

import postcast
from postcast.datasets import schema
from postcast.pipeline import archive
from postcast.pipeline.archive import Field, Product, Skipped

log = logging.getLogger(__name__)


# --- the archive as the service sees it ------------------------------------------------------------
class LRU:
    """A small thread-safe least-recently-used mapping."""

    def __init__(self, size: int) -> None:
        self.size, self._items, self._lock = size, OrderedDict[Any, Any](), threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


class MapCache(LRU):
    """Rendered PNG maps by (file, its signature, target, requested time); counts its renders."""

    def __init__(self, size: int = 64) -> None:
        super().__init__(size)
        self.renders = 0
        self.render_lock = threading.Lock()  # matplotlib is not thread-safe; one render at a time


Key = tuple[str, pd.Timestamp | None]  # (target, valid time or None = the latest)


class Catalog:
    """The archive under ``root``: which products exist, the best one per (target, valid time), and
    the loaded fields (an LRU keyed by path and signature, so a replaced file is never served stale)."""

    def __init__(self, root: str | Path, watch_s: float | None = 2.0, cache_fields: int = 32) -> None:
        self.root, self.watch_s = Path(root), watch_s
        self._fields = LRU(cache_fields)
        self._unreadable: dict[Path, tuple[Product, str]] = {}  # until replaced
        self._lock = threading.Lock()
        self._next_scan = 0.0
        self.maps = MapCache()
        self.entries: list[Product] = []
        self.skipped: list[Skipped] = []
        self._ranked: dict[Key, list[Product]] = {}
        self._bad_keys: set[Key] = set()
        self._warned: set[str] = set()
        self.refresh()

    def refresh(self) -> None:
        """Rescan the archive: new, replaced and removed files take effect now."""
        found, foreign = archive.scan(self.root)
        for skip in foreign:
            if skip.path not in self._warned:  # once per entry, not at every rescan
                log.warning("skipping %s: %s", skip.path, skip.reason)
                self._warned.add(skip.path)
        with self._lock:
            sigs = {p.path: p.signature for p in found}
            self._unreadable = {k: v for k, v in self._unreadable.items() if sigs.get(k) == v[0].signature}
            self._index(found, foreign)
            self._next_scan = time.monotonic() + (self.watch_s or 0.0)

    def _index(self, found: list[Product], foreign: list[Skipped]) -> None:
        good = [p for p in found if p.path not in self._unreadable]
        bad = [Skipped(str(path.relative_to(self.root)), why) for path, (_, why) in self._unreadable.items()]
        self._bad_keys = {(p.target, p.valid) for p, _ in self._unreadable.values()}
        ranked: dict[Key, list[Product]] = defaultdict(list)
        # later init first, then postprocessed over fallback, then the model written last
        for p in sorted(good, key=lambda p: (p.init, p.product == archive.POSTPROCESSED, p.signature[1]), reverse=True):
            ranked[(p.target, p.valid)].append(p)
            ranked[(p.target, None)].append(p)
        self.entries, self.skipped, self._ranked = sorted(good, key=lambda p: (p.target, p.init)), foreign + bad, ranked

    def watch(self) -> None:
        if self.watch_s is not None and time.monotonic() >= self._next_scan:
            self.refresh()

    def resolve(self, target: str, valid: pd.Timestamp | None) -> tuple[Product, Served]:
        """The best readable product for ``target`` at ``valid`` (None: the latest) and its field;
        404 when there is none."""
        self.watch()
        for p in list(self._ranked.get((target, valid), ())):
            try:
                return p, self.field(p)
            except archive.ProductGone:
                self._drop(p, None)
            except archive.UnreadableProduct as err:
                log.warning("skipping %s", err)
                self._drop(p, str(err))
        what = f"valid time {valid}" if valid is not None else "any time"
        why = " (its files are unreadable; see /health)" if (target, valid) in self._bad_keys else "; see /forecasts"
        raise HTTPException(404, f"no {target} forecast for {what}{why}")

    def field(self, p: Product) -> Served:
        key = (p.path, p.signature)
        served = self._fields.get(key)
        if served is None:
            served = Served.of(p, archive.read_field(p))
            self._fields.put(key, served)
        return served

    def _drop(self, p: Product, reason: str | None) -> None:
        """Take ``p`` out of service: unreadable (``reason``, listed by /health until replaced) or gone."""
        with self._lock:
            if reason is not None:
                self._unreadable[p.path] = (p, reason)
            found = [e for e in self.entries if e.path != p.path]
            foreign = [s for s in self.skipped if (self.root / s.path) not in self._unreadable]
            self._index(found, foreign)


# --- metrics, auth, HEAD: one plain ASGI middleware (cheap per request) ---------------------------
class Stats:
    """Requests per (route template, status) and seconds per route template: bounded label sets."""

    def __init__(self) -> None:
        self.count: dict[tuple[str, int], int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)

    def prometheus(self, catalog: Catalog) -> str:
        lines = ["# HELP postcast_requests_total HTTP requests by route template and status",
                 "# TYPE postcast_requests_total counter"]
        lines += [f'postcast_requests_total{{path="{p}",status="{s}"}} {n}' for (p, s), n in sorted(self.count.items())]
        lines += ["# HELP postcast_request_seconds_total time spent answering, by route template",
                  "# TYPE postcast_request_seconds_total counter"]
        lines += [f'postcast_request_seconds_total{{path="{p}"}} {s:.6f}' for p, s in sorted(self.seconds.items())]
        lines += ["# HELP postcast_forecasts forecasts served", "# TYPE postcast_forecasts gauge",
                  f"postcast_forecasts {len(catalog.entries)}",
                  "# HELP postcast_skipped_files archive entries skipped (foreign or unreadable)",
                  "# TYPE postcast_skipped_files gauge", f"postcast_skipped_files {len(catalog.skipped)}"]
        return "\n".join(lines) + "\n"


UNMATCHED = "unmatched"
UNAUTHORIZED = json.dumps({"detail": "missing or wrong bearer token"}).encode()


class Gate:
    """Plain ASGI middleware: HEAD answered as GET (the server drops the body), the bearer token
    checked on every path but the open ones, unknown query parameters refused (a misspelt ``tme=``
    would otherwise silently give the latest forecast), and :class:`Stats` fed with the route template.

    ``routes`` maps each route template to the query parameters it takes (filled once the routes exist)."""

    def __init__(self, app: Any, stats: Stats, routes: dict[str, frozenset[str] | None], token: str | None,
                 open_paths: set[str]) -> None:
        self.app, self.stats, self.routes, self.open_paths = app, stats, routes, open_paths
        self.token = token.encode() if token else None

    def _unknown(self, path: str, query: bytes) -> list[str]:
        allowed = self.routes.get(path)
        if not query or allowed is None:
            return []
        return sorted({k for k, _ in parse_qsl(query.decode("latin-1"), keep_blank_values=True)} - allowed)

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        for name, value in headers:
            if name == b"authorization":
                scheme, _, cred = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(cred.strip(), self.token or b"")
        return False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0, status, path = time.perf_counter(), 500, scope["path"]
        label = path if path in self.routes else UNMATCHED
        if scope["method"] == "HEAD":
            scope = {**scope, "method": "GET"}  # a copy: the server still knows it is HEAD and sends no body

        async def send_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if self.token is not None and path not in self.open_paths and not self._authorized(scope["headers"]):
                await _problem(send_status, 401, UNAUTHORIZED, [(b"www-authenticate", b"Bearer")])
            elif unknown := self._unknown(path, scope.get("query_string", b"")):
                allowed = ", ".join(sorted(self.routes[path] or ())) or "none"
                body = json.dumps({"detail": f"unknown query parameter(s) {', '.join(unknown)}: {path} takes "
                                             f"{allowed}"}).encode()
                await _problem(send_status, 422, body, [])
            else:
                await self.app(scope, receive, send_status)
        finally:
            self.stats.count[(label, status)] += 1
            self.stats.seconds[label] += time.perf_counter() - t0


async def _problem(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


# --- request parameters and documented answers ------------------------------------------------------
class Problem(BaseModel):
    """Every error: what went wrong and how to fix it."""

    detail: str


class PointAnswer(BaseModel):
    target: str
    units: str
    init_time: str
    valid_time: str
    product: str
    model: str
    latitude: float
    longitude: float
    mean: float
    std: float
    quantiles: dict[str, float]
    exceedance: dict[str, float]


class BoxAnswer(BaseModel):
    target: str
    units: str
    init_time: str
    valid_time: str
    product: str
    model: str
    latitude: list[float]
    longitude: list[float]
    mean: list[list[float]]
    std: list[list[float]]


class Health(BaseModel):
    status: str
    forecasts: int
    version: str
    skipped: list[dict[str, str]]


class Listed(BaseModel):
    target: str
    init_time: str
    valid_time: str
    product: str
    model: str


class PNGResponse(Response):
    media_type = "image/png"


@lru_cache(maxsize=4096)  # clients ask for the same few valid times over and over (errors are not cached)
def _parse_time(text: str | None) -> pd.Timestamp | None:
    if text is None:
        return None
    try:
        stamp = pd.Timestamp(text)
    except OutOfBoundsDatetime as err:  # a date-time, but no forecast can exist for it
        raise HTTPException(404, f"time {text!r}: no forecast for that time") from err
    except ValueError as err:
        raise HTTPException(422, f"time {text!r}: not a date-time (e.g. 2017-01-04T00:00)") from err
    if stamp is pd.NaT:
        raise HTTPException(422, f"time {text!r}: not a date-time (e.g. 2017-01-04T00:00)")
    return stamp.tz_convert("UTC").tz_localize(None) if stamp.tzinfo else stamp


def _nearest(values: np.ndarray, x: float, periodic: bool = False) -> int:
    d = np.abs(values - x)
    if periodic:
        d = np.minimum(d, 360.0 - d)
    return int(np.argmin(d))


class Locator:
    """Nearest grid indices: arithmetic on a regular axis (the ENS-10 grids), argmin otherwise."""

    def __init__(self, values: np.ndarray, periodic: bool) -> None:
        self.values, self.periodic = values, periodic
        steps = np.diff(values)
        self.regular = values.size > 1 and bool(np.allclose(steps, steps[0])) and steps[0] > 0
        self.start, self.step, self.n = float(values[0]), float(steps[0]) if values.size > 1 else 1.0, values.size
        if self.regular and periodic:
            self.regular = abs(self.n * self.step - 360.0) < 1e-6  # wraps exactly

    def __call__(self, x: float) -> int:
        if not self.regular:
            return _nearest(self.values, x, self.periodic)
        k = round((x - self.start) / self.step)
        return k % self.n if self.periodic else min(max(k, 0), self.n - 1)


@dataclass(frozen=True)
class Served:
    """What a point query needs of a product, prepared once per loaded file."""

    field: Field
    lat: Locator
    lon: Locator
    init: str
    valid: str
    quantile_keys: tuple[str, ...]
    threshold_keys: tuple[str, ...]

    @classmethod
    def of(cls, p: Product, f: Field) -> Served:
        return cls(f, Locator(f.lat, False), Locator(f.lon, True), p.init.isoformat(), p.valid.isoformat(),
                   tuple(f"{q:g}" for q in f.quantile_levels), tuple(f"{t:g}" for t in f.thresholds))


def _json(obj: dict[str, Any]) -> Response:
    return Response(json.dumps(obj, separators=(",", ":")).encode(), media_type="application/json")


# the targets come from the schema (one home for target facts): the pattern checks, the enum documents
Target = Annotated[str, Query(description=f"one of {', '.join(schema.TARGETS)}",
                              pattern="^(" + "|".join(map(re.escape, schema.TARGETS)) + ")$",
                              json_schema_extra={"enum": list(schema.TARGETS)})]
Lat = Annotated[float, Query(ge=-90.0, le=90.0, description="degrees north")]
Lon = Annotated[float, Query(ge=-180.0, le=360.0, description="degrees east (-180..360)")]
Time = Annotated[str | None, Query(description="valid time (ISO 8601, e.g. 2017-01-04T00:00); default: the latest",
                                   json_schema_extra={"format": "date-time"})]
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "missing or wrong bearer token"},
    404: {"model": Problem, "description": "no readable forecast for that target and time"},
    422: {"model": Problem, "description": "invalid parameters"},
}


def _errors(*codes: int, guarded: bool, json_media: bool = False) -> dict[int | str, dict[str, Any]]:
    """The documented error answers; ``json_media`` for a route whose own answer is not JSON (the
    errors still are)."""
    out: dict[int | str, dict[str, Any]] = {c: ERRORS[c] for c in codes if c != 401 or guarded}
    if json_media:
        ref = {"schema": {"$ref": "#/components/schemas/Problem"}}
        out = {c: {"description": r["description"], "content": {"application/json": ref}} for c, r in out.items()}
    return out


# --- the application ----------------------------------------------------------------------------------
def create_app(forecasts: str | Path, token: str | None = None, *, public_metrics: bool = False,
               watch_s: float | None = 2.0) -> FastAPI:
    """The service over the archive ``forecasts``; ``token`` enables bearer auth on every path but
    /health (and /metrics when ``public_metrics``); the archive is rescanned at most every ``watch_s``
    seconds (None: only on ``/forecasts?refresh=true``)."""
    app = FastAPI(title="postcast", version=postcast.__version__,
                  description="Calibrated ensemble forecasts written by `postcast forecast`.")
    catalog = Catalog(forecasts, watch_s)
    stats = Stats()
    open_paths = {"/health"} | ({"/metrics"} if public_metrics else set())
    routes: dict[str, frozenset[str] | None] = {}  # route template -> its query parameters (None: not checked)
    app.add_middleware(Gate, stats=stats, routes=routes, token=token, open_paths=open_paths)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(x) for x in e['loc'][1:]) or e['loc'][0]}: {e['msg']}" for e in exc.errors()]
        return JSONResponse({"detail": "; ".join(parts)}, status_code=422)

    _info_routes(app, catalog, stats, token, guarded=token is not None, metrics_guarded=token is not None
                 and not public_metrics)
    _forecast_routes(app, catalog, guarded=token is not None)
    for r in app.routes:
        params = getattr(getattr(r, "dependant", None), "query_params", None)
        routes[getattr(r, "path", "")] = frozenset(p.alias for p in params) if params is not None else None
    if token is not None:
        _document_bearer(app, set(routes) - open_paths)
    app.state.catalog = catalog
    return app


def _document_bearer(app: FastAPI, guarded: set[str]) -> None:
    """Declare the bearer scheme in the OpenAPI document and require it on the guarded operations
    (the check itself is :class:`Gate`'s)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = build()
            spec.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
                "type": "http", "scheme": "bearer"}
            for path, operations in spec["paths"].items():
                if path in guarded:
                    for op in operations.values():
                        op["security"] = [{"bearer": []}]
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _info_routes(app: FastAPI, catalog: Catalog, stats: Stats, token: str | None, *, guarded: bool,
                 metrics_guarded: bool) -> None:
    @app.get("/health", response_model=Health, responses=_errors(422, guarded=False))
    async def health() -> Response:
        catalog.watch()
        skipped = [{"path": s.path, "reason": s.reason} for s in catalog.skipped]
        return _json({"status": "degraded" if skipped else "ok", "forecasts": len(catalog.entries),
                      "version": postcast.__version__, "skipped": skipped})

    @app.get("/metrics", response_class=PlainTextResponse,
             responses=_errors(401, 422, guarded=metrics_guarded, json_media=True))
    async def metrics() -> str:
        return stats.prometheus(catalog)

    @app.get("/", response_class=HTMLResponse, responses=_errors(401, 422, guarded=guarded, json_media=True))
    def index() -> str:
        catalog.watch()
        rows = "".join(f"<tr><td>{e.target}</td><td>{e.init:%Y-%m-%d %H}</td><td>{e.valid:%Y-%m-%d %H}</td>"
                       f"<td>{html.escape(e.product)}</td><td>{html.escape(e.model)}</td></tr>"
                       for e in catalog.entries[-20:])
        img = '<img src="/map.png" alt="latest forecast">' if token is None else (
            "<p>(the map needs the bearer token: GET /map.png)</p>")
        return (f"<!doctype html><html><head><title>postcast</title></head><body><h1>postcast forecasts</h1>"
                f"{img}<table border=1><tr><th>target</th><th>init</th><th>valid</th><th>product</th><th>model</th>"
                f"</tr>{rows}</table><p><a href='/docs'>API docs</a></p></body></html>")


def _forecast_routes(app: FastAPI, catalog: Catalog, *, guarded: bool) -> None:
    @app.get("/forecasts", response_model=list[Listed], responses=_errors(401, 422, guarded=guarded))
    async def forecasts_list(refresh: bool = False) -> Response:
        if refresh:
            catalog.refresh()
        else:
            catalog.watch()
        return Response(json.dumps([{"target": e.target, "init_time": e.init.isoformat(),
                                     "valid_time": e.valid.isoformat(), "product": e.product, "model": e.model}
                                    for e in catalog.entries]).encode(), media_type="application/json")

    @app.get("/forecast/point", response_model=PointAnswer, responses=_errors(401, 404, 422, guarded=guarded))
    async def point(target: Target, lat: Lat, lon: Lon, time: Time = None,
                    threshold: Annotated[float | None, Query(description="exceedance threshold, target units",
                                                             allow_inf_nan=False)] = None) -> Response:
        entry, s = catalog.resolve(target, _parse_time(time))
        f = s.field
        i, j = s.lat(lat), s.lon(lon % 360.0)
        mu, sd = float(f.mean[i, j]), float(f.std[i, j])
        out: dict[str, Any] = {
            "target": target, "units": f.units, "init_time": s.init, "valid_time": s.valid,
            "product": entry.product, "model": entry.model,
            "latitude": float(f.lat[i]), "longitude": float(f.lon[j]), "mean": mu, "std": sd,
            "quantiles": dict(zip(s.quantile_keys, f.quantiles[:, i, j].tolist(), strict=True)),
            "exceedance": dict(zip(s.threshold_keys, f.exceedance[:, i, j].tolist(), strict=True)),
        }
        if threshold is not None:
            out["exceedance"][f"{threshold:g}"] = float(1.0 - ndtr((threshold - mu) / sd))
        return _json(out)

    @app.get("/forecast/bbox", response_model=BoxAnswer, responses=_errors(401, 404, 422, guarded=guarded))
    async def bbox(target: Target, lat_min: Lat, lat_max: Lat, lon_min: Lon, lon_max: Lon,
                   time: Time = None) -> Response:
        entry, s = catalog.resolve(target, _parse_time(time))
        f = s.field
        rows = (f.lat >= lat_min) & (f.lat <= lat_max)
        lo, hi = lon_min % 360.0, lon_max % 360.0
        cols = (f.lon >= lo) & (f.lon <= hi) if lo <= hi else (f.lon >= lo) | (f.lon <= hi)  # across 0 deg
        if not rows.any() or not cols.any():  # lat_min > lat_max included: an empty box
            raise HTTPException(404, f"no grid point inside the box (latitude {lat_min}..{lat_max}, longitude "
                                     f"{lon_min}..{lon_max}; lat_min must not exceed lat_max)")
        return _json({"target": target, "units": f.units, "init_time": s.init, "valid_time": s.valid,
                      "product": entry.product, "model": entry.model,
                      "latitude": f.lat[rows].tolist(), "longitude": f.lon[cols].tolist(),
                      "mean": f.mean[np.ix_(rows, cols)].tolist(), "std": f.std[np.ix_(rows, cols)].tolist()})

    @app.get("/map.png", response_class=PNGResponse, responses={
        200: {"content": {"image/png": {}}, "description": "a PNG map of the forecast mean"},
        **_errors(401, 404, 422, guarded=guarded, json_media=True)})
    def map_png(target: Target | None = None, time: Time = None) -> PNGResponse:
        """The map of ``target`` (default: the target of the latest forecast in the archive)."""
        if target is None:
            catalog.watch()
            if not catalog.entries:
                raise HTTPException(404, "no forecast in the archive")
            target = catalog.entries[-1].target
        return PNGResponse(_map(catalog, target, _parse_time(time)))


def _map(catalog: Catalog, target: str, valid: pd.Timestamp | None) -> bytes:
    """The PNG of the best forecast for (target, valid), rendered once per file and parameters."""
    entry, s = catalog.resolve(target, valid)
    key = (entry.path, entry.signature, target, valid)
    png = catalog.maps.get(key)
    if png is None:
        with catalog.maps.render_lock:
            png = catalog.maps.get(key)
            if png is None:
                png = _render(entry, s.field)
                catalog.maps.renders += 1
                catalog.maps.put(key, png)
    return bytes(png)


def _render(entry: Product, f: Field) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    lon = np.concatenate([f.lon[f.lon >= 180.0] - 360.0, f.lon[f.lon < 180.0]])  # -180..180 for the picture
    mean = np.concatenate([f.mean[:, f.lon >= 180.0], f.mean[:, f.lon < 180.0]], axis=1)  # (lat, lon)
    im = ax.imshow(mean, origin="lower" if f.lat[0] < f.lat[-1] else "upper", cmap="RdYlBu_r", aspect="auto",
                   extent=(float(lon.min()), float(lon.max()), float(f.lat.min()), float(f.lat.max())))
    fig.colorbar(im, ax=ax, label=f"{entry.target} mean ({f.units})")
    ax.set_title(f"{entry.target} valid {entry.valid:%Y-%m-%d %H} UTC (init {entry.init:%Y-%m-%d %H}, "
                 f"{entry.product}, {entry.model})")
    buf = pyio.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    return buf.getvalue()


def app_from_env() -> FastAPI:
    """App factory for uvicorn workers: ``POSTCAST_FORECASTS``, optional ``POSTCAST_TOKEN``,
    ``POSTCAST_PUBLIC_METRICS`` (1: /metrics open) and ``POSTCAST_WATCH_S`` (seconds; empty: no watch)."""
    import os

    watch = os.environ.get("POSTCAST_WATCH_S", "2")
    return create_app(os.environ["POSTCAST_FORECASTS"], os.environ.get("POSTCAST_TOKEN") or None,
                      public_metrics=os.environ.get("POSTCAST_PUBLIC_METRICS") == "1",
                      watch_s=float(watch) if watch else None)
