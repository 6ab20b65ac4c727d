"""The forecast service: FastAPI over the forecast archive that ``postcast forecast`` writes
(``pipeline/archive.py`` is the contract: layout, content, atomic writes, scores).

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
* ``GET /map.png`` and ``GET /``: a map of a forecast (rendered once per file and parameters) and an
  HTML page with the latest one.

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
from collections import Counter, OrderedDict, defaultdict
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

from postcast.datasets import schema
from postcast.datasets.core.errors import BadInputError
from postcast.datasets.core.version import __version__
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


Key = tuple[str, str | None, pd.Timestamp | None]  # (target, model or None = any, valid time or None = the latest)


@dataclass(frozen=True)
class TargetModels:
    """The models with forecasts of one target, best first (the first is the default), their scores
    (``crps``: only the scored ones), their number of forecasts and how the default was chosen."""

    order: tuple[str, ...]
    crps: dict[str, float]
    counts: dict[str, int]
    chosen_by: str

    def listing(self, target: str) -> dict[str, Any]:
        return {"target": target, "default_model": self.order[0], "chosen_by": self.chosen_by,
                "models": [{"model": m, "crps": self.crps.get(m), "forecasts": self.counts[m]} for m in self.order]}


class Catalog:
    """The archive under ``root``: which products exist, the models of each target ranked by their
    verification scores, the best product per (target, model, valid time), and the loaded fields (an
    LRU keyed by path and signature, so a replaced file is never served stale)."""

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
        self._bad_keys: set[tuple[str, pd.Timestamp | None]] = set()
        self._warned: set[str] = set()
        self.scores: dict[str, dict[str, float]] = {}  # target -> model -> archive.SCORE
        self.scores_file: tuple[str, Path] | None = None  # (name relative to the root, path) of the scores read
        self._scores_seen: tuple[str, archive.Signature] | None = None
        self._scores_skip: list[Skipped] = []
        self.models: dict[str, TargetModels] = {}  # target -> its models, best first
        self.all_models: tuple[str, ...] = ()  # every model of the archive, sorted
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
            self._index(found, foreign + self._load_scores())
            self._next_scan = time.monotonic() + (self.watch_s or 0.0)

    def _load_scores(self) -> list[Skipped]:
        """Read the scores file (``archive.SCORE_FILES``) again when it changed; the skipped entry
        saying why when it cannot be read."""
        found = archive.scores_path(self.root)
        try:
            seen = (found[0], archive.signature(found[1])) if found else None
        except FileNotFoundError:  # removed since it was found
            found, seen = None, None
        if seen != self._scores_seen:
            self._scores_seen, self.scores, self.scores_file, self._scores_skip = seen, {}, None, []
            if found is not None:
                try:
                    self.scores, self.scores_file = archive.read_scores(found[1]), found
                except BadInputError as err:
                    log.warning("no verification scores: %s", err)
                    self._scores_skip = [Skipped(found[0], str(err), "not the metrics.json of postcast evaluate")]
        return self._scores_skip

    def _rank_models(self, good: list[Product]) -> dict[str, TargetModels]:
        """Per target, its models best first: the scored ones by their score (lowest first), then the
        others by name; a tie by name too."""
        counts: dict[str, Counter[str]] = defaultdict(Counter)
        for p in good:
            counts[p.target][p.model] += 1
        out = {}
        for target in sorted(counts, key=list(schema.TARGETS).index):
            crps = {m: v for m, v in self.scores.get(target, {}).items() if m in counts[target]}
            order = tuple(sorted(counts[target], key=lambda m: (m not in crps, crps.get(m, 0.0), m)))
            why = (f"the lowest {archive.SCORE} in {self.scores_file[0]}" if self.scores_file and order[0] in crps
                   else "no verification score for its models: the first by name")
            out[target] = TargetModels(order, crps, dict(counts[target]), why)
        return out

    def _index(self, found: list[Product], foreign: list[Skipped]) -> None:
        good = [p for p in found if p.path not in self._unreadable]
        bad = [Skipped(str(path.relative_to(self.root)), why, "an unreadable forecast file (see the log)")
               for path, (_, why) in self._unreadable.items()]
        self._bad_keys = {(p.target, p.valid) for p, _ in self._unreadable.values()}
        models = self._rank_models(good)
        rank = {(t, m): k for t, tm in models.items() for k, m in enumerate(tm.order)}
        ranked: dict[Key, list[Product]] = defaultdict(list)
        # the target's better model first, then later init, then postprocessed over fallback, then written last
        for p in sorted(good, key=lambda p: (-rank[(p.target, p.model)], p.init, p.product == archive.POSTPROCESSED,
                                              p.signature[1]), reverse=True):
            for model in (None, p.model):
                ranked[(p.target, model, p.valid)].append(p)
                ranked[(p.target, model, None)].append(p)
        self.models, self.all_models = models, tuple(sorted({p.model for p in good}))
        self.entries, self.skipped, self._ranked = sorted(good, key=lambda p: (p.target, p.init)), foreign + bad, ranked

    def watch(self) -> None:
        if self.watch_s is not None and time.monotonic() >= self._next_scan:
            self.refresh()

    def check_model(self, target: str | None, model: str | None) -> None:
        """422 when ``model`` is not in the archive, 404 when it has no forecast of ``target``; both name
        the models there are."""
        if model is None:
            return
        if model not in self.all_models:
            raise HTTPException(422, f"model {model!r} is not in the archive; its models: "
                                     f"{', '.join(self.all_models) or 'none'}")
        have = self.models[target].order if target in self.models else ()
        if target is not None and model not in have:
            raise HTTPException(404, f"no {target} forecast of model {model!r}; the models of {target}: "
                                     f"{', '.join(have) or 'none'}")

    def latest_target(self, model: str | None) -> str:
        """The target of the last forecast listed (of ``model`` if given); 404 when there is none."""
        self.watch()
        self.check_model(None, model)
        entries = [e for e in self.entries if model in (None, e.model)]
        if not entries:
            raise HTTPException(404, "no forecast in the archive")
        return entries[-1].target

    def resolve(self, target: str, model: str | None, valid: pd.Timestamp | None) -> tuple[Product, Served]:
        """The best readable product for ``target`` of ``model`` (None: the best-ranked model that has
        one) at ``valid`` (None: the latest) and its field; 404 when there is none."""
        self.watch()
        self.check_model(target, model)
        for p in list(self._ranked.get((target, model, valid), ())):
            try:
                return p, self.field(p)
            except archive.ProductGone:
                self._drop(p, None)
            except archive.UnreadableProduct as err:
                log.warning("skipping %s", err)
                self._drop(p, str(err))
        what = f"valid time {valid}" if valid is not None else "any time"
        of = f" of model {model!r}" if model is not None else ""
        why = " (its files are unreadable; see /health)" if (target, valid) in self._bad_keys else "; see /forecasts"
        raise HTTPException(404, f"no {target} forecast{of} for {what}{why}")

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
        return bearer_ok(next((v for k, v in headers if k == b"authorization"), None), self.token)

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


def bearer_ok(authorization: bytes | None, token: bytes | None) -> bool:
    """Whether an ``Authorization`` header value carries the bearer ``token`` (never when no token is set)."""
    if authorization is None or token is None:
        return False
    scheme, _, cred = authorization.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(cred.strip(), token)


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
    """Counts and names for anyone; the archive's and the scores file's paths and the full reasons of
    the skipped entries only with the token."""

    status: str
    forecasts: int
    models: int
    version: str
    skipped: list[dict[str, str]]
    archive: str | None = None
    scores: str | None = None


class Listed(BaseModel):
    target: str
    init_time: str
    valid_time: str
    product: str
    model: str


class ModelListed(BaseModel):
    model: str
    crps: float | None  # archive.SCORE from the scores file; None: not scored
    forecasts: int


class TargetListed(BaseModel):
    target: str
    default_model: str
    chosen_by: str
    models: list[ModelListed]  # best first


class Listing(BaseModel):
    targets: list[TargetListed]
    forecasts: list[Listed]


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
# the models come from the archive: the OpenAPI document enumerates them as they are (see _document)
Model = Annotated[str | None, Query(description="the model (see /forecasts); default: the target's best-verified "
                                                "model, then the next one that has a forecast for that time")]
Lat = Annotated[float, Query(ge=-90.0, le=90.0, description="degrees north")]
Lon = Annotated[float, Query(ge=-180.0, le=360.0, description="degrees east (-180..360)")]
Time = Annotated[str | None, Query(description="valid time (ISO 8601, e.g. 2017-01-04T00:00); default: the latest",
                                   json_schema_extra={"format": "date-time"})]
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "missing or wrong bearer token"},
    404: {"model": Problem, "description": "no readable forecast for that target, model and time"},
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
    app = FastAPI(title="postcast", version=__version__,
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
    _document(app, catalog, set(routes) - open_paths if token is not None else set())
    app.state.catalog = catalog
    return app


def _document(app: FastAPI, catalog: Catalog, guarded: set[str]) -> None:
    """The OpenAPI document: the archive's models as the enum of every ``model`` parameter (built again
    when they change), and the bearer scheme required on the ``guarded`` operations (the check itself
    is :class:`Gate`'s)."""
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
        spec.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {"type": "http",
                                                                                         "scheme": "bearer"}
    return spec


def _info_routes(app: FastAPI, catalog: Catalog, stats: Stats, token: str | None, *, guarded: bool,
                 metrics_guarded: bool) -> None:
    secret = token.encode() if token else None

    @app.get("/health", response_model=Health, responses=_errors(422, guarded=False))
    async def health(request: Request) -> Response:
        """Open to probes: counts and names only (no server path); with the token, the details."""
        catalog.watch()
        header = request.headers.get("authorization")
        full = bearer_ok(header.encode("latin-1") if header is not None else None, secret)
        out: dict[str, Any] = {"status": "degraded" if catalog.skipped else "ok", "forecasts": len(catalog.entries),
                               "models": len(catalog.all_models), "version": __version__,
                               "skipped": [{"path": s.path, "reason": s.reason if full else s.public_reason}
                                           for s in catalog.skipped]}
        if full:
            out.update(archive=str(catalog.root.absolute()),
                       scores=str(catalog.scores_file[1].resolve()) if catalog.scores_file else None)
        return _json(out)

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
    @app.get("/forecasts", response_model=Listing, responses=_errors(401, 422, guarded=guarded))
    async def forecasts_list(refresh: bool = False) -> Response:
        """Per target its models, best first, with their scores and the default; then every forecast."""
        if refresh:
            catalog.refresh()
        else:
            catalog.watch()
        return _json({"targets": [tm.listing(t) for t, tm in catalog.models.items()],
                      "forecasts": [{"target": e.target, "init_time": e.init.isoformat(),
                                     "valid_time": e.valid.isoformat(), "product": e.product, "model": e.model}
                                    for e in catalog.entries]})

    @app.get("/forecast/point", response_model=PointAnswer, responses=_errors(401, 404, 422, guarded=guarded))
    async def point(target: Target, lat: Lat, lon: Lon, time: Time = None, model: Model = None,
                    threshold: Annotated[float | None, Query(description="exceedance threshold, target units",
                                                             allow_inf_nan=False)] = None) -> Response:
        entry, s = catalog.resolve(target, model, _parse_time(time))
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
            out["exceedance"][f"{threshold:g}"] = archive.exceedance_at(f, i, j, threshold)  # the file's family
        return _json(out)

    @app.get("/forecast/bbox", response_model=BoxAnswer, responses=_errors(401, 404, 422, guarded=guarded))
    async def bbox(target: Target, lat_min: Lat, lat_max: Lat, lon_min: Lon, lon_max: Lon,
                   time: Time = None, model: Model = None) -> Response:
        entry, s = catalog.resolve(target, model, _parse_time(time))
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
    def map_png(target: Target | None = None, time: Time = None, model: Model = None) -> PNGResponse:
        """The map of ``target`` (default: the target of the last forecast listed, of ``model`` if given)."""
        target = target or catalog.latest_target(model)
        return PNGResponse(_map(catalog, target, model, _parse_time(time)))


def _map(catalog: Catalog, target: str, model: str | None, valid: pd.Timestamp | None) -> bytes:
    """The PNG of the best forecast for (target, model, valid), rendered once per file and parameters."""
    entry, s = catalog.resolve(target, model, valid)
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
