"""The forecast service: FastAPI over the files written by ``postcast forecast``.

Endpoints (OpenAPI docs at ``/docs``):

* ``GET /health``: liveness and the number of forecasts served (never needs a token);
* ``GET /metrics``: Prometheus text (requests and latency per endpoint, forecasts loaded);
* ``GET /forecasts``: what is available (target, init and valid time, product);
* ``GET /forecast/point``: mean, std, quantiles and exceedance probabilities at the nearest grid
  point for a target and valid time (the latest init time that covers it);
* ``GET /forecast/bbox``: mean and std on the grid points inside a latitude/longitude box;
* ``GET /``: an HTML page with a map of the latest forecast (``/map.png``).

With a token configured (``--token`` or ``POSTCAST_TOKEN``) the forecast endpoints require
``Authorization: Bearer <token>``. Bad parameters get 422, unknown targets or times 404.
"""

from __future__ import annotations

import html
import io as pyio
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pandas as pd
import xarray as xr
from fastapi import Depends, FastAPI, HTTPException, Query, Response
from fastapi.responses import HTMLResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from scipy.special import ndtr

import postcast
from postcast.datasets import schema


@dataclass(frozen=True)
class Entry:
    target: str
    init: pd.Timestamp
    valid: pd.Timestamp
    product: str
    path: Path
    model: str = ""


@dataclass
class Field:
    """One forecast in memory: (lat, lon) mean/std, (Q, lat, lon) quantiles, (T, lat, lon) exceedance."""

    lat: np.ndarray
    lon: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    quantile_levels: np.ndarray
    quantiles: np.ndarray
    thresholds: np.ndarray
    exceedance: np.ndarray
    units: str


class Catalog:
    """The forecasts under a directory (``<product>/<model>/<target>/<target>_<init>.nc``, the layout
    ``postcast forecast`` writes), loaded on first use."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._lock = threading.Lock()
        self._fields: dict[Path, Field] = {}
        self.entries: list[Entry] = []
        self.refresh()

    def refresh(self) -> None:
        entries = []
        for path in sorted(self.root.glob("*/*/*/*.nc")):
            product, model, target = path.parent.parent.parent.name, path.parent.parent.name, path.parent.name
            if target not in schema.TARGETS:
                continue
            init = pd.to_datetime(path.stem.rsplit("_", 1)[-1], format="%Y%m%dT%H")
            entries.append(Entry(target, init, init + pd.Timedelta(hours=schema.TARGET_STEP_H), product, path, model))
        best: dict[tuple[str, pd.Timestamp | None], Entry] = {}  # (target, valid or None=latest) -> entry
        # later init wins, then postprocessed over fallback, then the model written last
        for e in sorted(entries, key=lambda e: (e.init, e.product == "postprocessed", e.path.stat().st_mtime_ns)):
            best[(e.target, e.valid)] = best[(e.target, None)] = e
        self.entries, self._best = entries, best

    def find(self, target: str, valid: pd.Timestamp | None) -> Entry:
        """The latest init time covering ``valid`` (postprocessed over fallback); None: the latest."""
        entry = self._best.get((target, valid))
        if entry is None:
            what = f"valid time {valid}" if valid is not None else "any time"
            raise HTTPException(404, f"no {target} forecast for {what}; see /forecasts")
        return entry

    def field(self, entry: Entry) -> Field:
        with self._lock:
            if entry.path not in self._fields:
                self._fields[entry.path] = _load(entry)
            return self._fields[entry.path]


def _load(entry: Entry) -> Field:
    t = entry.target
    with xr.open_dataset(entry.path) as ds:
        ds = ds.isel(forecast_reference_time=0).load()
    return Field(lat=ds["latitude"].values, lon=ds["longitude"].values, mean=ds[f"{t}_mean"].values,
                 std=ds[f"{t}_std"].values, quantile_levels=ds["quantile"].values, quantiles=ds[f"{t}_quantile"].values,
                 thresholds=ds["threshold"].values, exceedance=ds[f"{t}_exceedance_probability"].values,
                 units=ds[f"{t}_mean"].attrs.get("units", ""))


class Stats:
    """Requests, seconds and errors per path (served at /metrics)."""

    def __init__(self) -> None:
        self.count: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)
        self.errors: dict[str, int] = defaultdict(int)

    def prometheus(self, n_forecasts: int) -> str:
        lines = ["# TYPE postcast_requests_total counter"]
        lines += [f'postcast_requests_total{{path="{p}"}} {n}' for p, n in sorted(self.count.items())]
        lines += ["# TYPE postcast_request_seconds_total counter"]
        lines += [f'postcast_request_seconds_total{{path="{p}"}} {s:.6f}' for p, s in sorted(self.seconds.items())]
        lines += ["# TYPE postcast_request_errors_total counter"]
        lines += [f'postcast_request_errors_total{{path="{p}"}} {n}' for p, n in sorted(self.errors.items())]
        lines += ["# TYPE postcast_forecasts gauge", f"postcast_forecasts {n_forecasts}"]
        return "\n".join(lines) + "\n"


class StatsMiddleware:
    """Plain ASGI middleware feeding :class:`Stats` (far cheaper per request than ``@app.middleware``)."""

    def __init__(self, app: Any, stats: Stats) -> None:
        self.app, self.stats = app, stats

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0, status = time.perf_counter(), 500

        async def send_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            path = scope["path"]
            self.stats.count[path] += 1
            self.stats.seconds[path] += time.perf_counter() - t0
            if status >= 400:
                self.stats.errors[path] += 1


@lru_cache(maxsize=4096)  # clients ask for the same few valid times over and over
def _parse_time(text: str | None) -> pd.Timestamp | None:
    if text is None:
        return None
    try:
        stamp = pd.Timestamp(text)
        return stamp.tz_convert("UTC").tz_localize(None) if stamp.tzinfo else stamp
    except ValueError as err:
        raise HTTPException(422, f"time {text!r}: not a date-time (e.g. 2017-01-04T00:00)") from err


def _nearest(values: np.ndarray, x: float, periodic: bool = False) -> int:
    d = np.abs(values - x)
    if periodic:
        d = np.minimum(d, 360.0 - d)
    return int(np.argmin(d))


Target = Annotated[str, Query(description="z500, t850 or t2m", pattern="^(z500|t850|t2m)$")]
Lat = Annotated[float, Query(ge=-90.0, le=90.0, description="degrees north")]
Lon = Annotated[float, Query(ge=-180.0, le=360.0, description="degrees east (-180..360)")]
Time = Annotated[str | None, Query(description="valid time (ISO); default: the latest forecast")]
BEARER = HTTPBearer(auto_error=False)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]


def create_app(forecasts: str | Path, token: str | None = None) -> FastAPI:
    """The service over the forecast directory ``forecasts``; ``token`` enables bearer auth."""
    app = FastAPI(title="postcast", version=postcast.__version__,
                  description="Calibrated ensemble forecasts written by `postcast forecast`.")
    catalog = Catalog(forecasts)
    stats = Stats()

    def auth(cred: Credentials) -> None:
        if token is not None and (cred is None or cred.credentials != token):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    _info_routes(app, catalog, stats, token)
    _forecast_routes(app, catalog, auth)
    app.state.catalog = catalog
    return app


def _info_routes(app: FastAPI, catalog: Catalog, stats: Stats, token: str | None) -> None:
    app.add_middleware(StatsMiddleware, stats=stats)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "forecasts": len(catalog.entries), "version": postcast.__version__}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        return stats.prometheus(len(catalog.entries))

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        rows = "".join(f"<tr><td>{e.target}</td><td>{e.init:%Y-%m-%d %H}</td><td>{e.valid:%Y-%m-%d %H}</td>"
                       f"<td>{html.escape(e.product)}</td></tr>" for e in catalog.entries[-20:])
        latest = catalog.entries[-1].target if catalog.entries else "t850"
        img = f'<img src="/map.png?target={latest}" alt="latest forecast">' if token is None else (
            "<p>(map requires the bearer token: GET /map.png)</p>")
        return (f"<!doctype html><html><head><title>postcast</title></head><body><h1>postcast forecasts</h1>"
                f"{img}<table border=1><tr><th>target</th><th>init</th><th>valid</th><th>product</th></tr>{rows}"
                f"</table><p><a href='/docs'>API docs</a></p></body></html>")


def _forecast_routes(app: FastAPI, catalog: Catalog, auth: Any) -> None:
    @app.get("/forecasts", dependencies=[Depends(auth)])
    async def forecasts_list(refresh: bool = False) -> list[dict[str, str]]:
        if refresh:
            catalog.refresh()
        return [{"target": e.target, "init_time": e.init.isoformat(), "valid_time": e.valid.isoformat(),
                 "product": e.product, "model": e.model} for e in catalog.entries]

    @app.get("/forecast/point", dependencies=[Depends(auth)])
    async def point(target: Target, lat: Lat, lon: Lon, time: Time = None,
                    threshold: Annotated[float | None, Query(description="exceedance threshold, target units")] = None
                    ) -> dict[str, Any]:
        entry = catalog.find(target, _parse_time(time))
        f = catalog.field(entry)
        i, j = _nearest(f.lat, lat), _nearest(f.lon, lon % 360.0, periodic=True)
        mu, sd = float(f.mean[i, j]), float(f.std[i, j])
        out: dict[str, Any] = {
            "target": target, "units": f.units, "init_time": entry.init.isoformat(),
            "valid_time": entry.valid.isoformat(), "product": entry.product,
            "latitude": float(f.lat[i]), "longitude": float(f.lon[j]), "mean": mu, "std": sd,
            "quantiles": {f"{q:g}": float(v) for q, v in zip(f.quantile_levels, f.quantiles[:, i, j], strict=True)},
            "exceedance": {f"{t:g}": float(p) for t, p in zip(f.thresholds, f.exceedance[:, i, j], strict=True)},
        }
        if threshold is not None:
            out["exceedance"][f"{threshold:g}"] = float(1.0 - ndtr((threshold - mu) / sd))
        return out

    @app.get("/forecast/bbox", dependencies=[Depends(auth)])
    async def bbox(target: Target, lat_min: Lat, lat_max: Lat, lon_min: Lon, lon_max: Lon,
                   time: Time = None) -> dict[str, Any]:
        if lat_min > lat_max:
            raise HTTPException(422, f"lat_min {lat_min} > lat_max {lat_max}")
        entry = catalog.find(target, _parse_time(time))
        f = catalog.field(entry)
        rows = (f.lat >= lat_min) & (f.lat <= lat_max)
        lo, hi = lon_min % 360.0, lon_max % 360.0
        cols = (f.lon >= lo) & (f.lon <= hi) if lo <= hi else (f.lon >= lo) | (f.lon <= hi)  # across 0 deg
        if not rows.any() or not cols.any():
            raise HTTPException(404, "no grid point inside the box")
        return {"target": target, "units": f.units, "init_time": entry.init.isoformat(),
                "valid_time": entry.valid.isoformat(), "product": entry.product,
                "latitude": f.lat[rows].tolist(), "longitude": f.lon[cols].tolist(),
                "mean": f.mean[np.ix_(rows, cols)].tolist(), "std": f.std[np.ix_(rows, cols)].tolist()}

    @app.get("/map.png", dependencies=[Depends(auth)])
    def map_png(target: Target = "t850", time: Time = None) -> Response:
        return Response(_map(catalog, target, _parse_time(time)), media_type="image/png")


def _map(catalog: Catalog, target: str, valid: pd.Timestamp | None) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entry = catalog.find(target, valid)
    f = catalog.field(entry)
    fig, ax = plt.subplots(figsize=(8, 4))
    im = ax.pcolormesh(f.lon, f.lat, f.mean, shading="auto", cmap="RdYlBu_r")
    fig.colorbar(im, ax=ax, label=f"{target} mean ({f.units})")
    ax.set_title(f"{target} valid {entry.valid:%Y-%m-%d %H} UTC (init {entry.init:%Y-%m-%d %H}, {entry.product})")
    buf = pyio.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def app_from_env() -> FastAPI:
    """App factory for uvicorn workers: ``POSTCAST_FORECASTS`` and optional ``POSTCAST_TOKEN``."""
    import os

    return create_app(os.environ["POSTCAST_FORECASTS"], os.environ.get("POSTCAST_TOKEN") or None)
