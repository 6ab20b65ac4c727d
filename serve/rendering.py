"""What the service draws: the PNG map of a forecast (mean, spread, a quantile or the probability of
exceeding a threshold, by the file's own family; coastlines, latitude/longitude axes, a colour scale
that fits the quantity, the family and units in the title), rendered once per file and parameters, one
render at a time.

The map's axes sit at a fixed place in the picture (:data:`AXES`, fractions of its width and height from
its top left corner), so a page can turn a click into a latitude and longitude: the answer's headers
``X-Map-Axes`` (left, top, right, bottom fractions) and ``X-Map-Extent`` (west, east, south, north
degrees) say where."""

from __future__ import annotations

import io as pyio
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from fastapi import HTTPException, Response

from postcast.pipeline.products import maps
from postcast.pipeline.products.archive import Field, Product
from postcast.serve import law
from postcast.serve.catalog import Catalog
from postcast.serve.grid import Served

FIGSIZE, DPI = (10.0, 5.0), 80  # 800 x 400 pixels
AXES = (0.08, 0.14, 0.84, 0.88)  # left, top, right, bottom of the map, fractions from the top left
COLORBAR = (0.87, 0.14, 0.885, 0.88)


class PNGResponse(Response):
    """A PNG answer (``image/png``)."""

    media_type = "image/png"


class Shown(NamedTuple):
    """What a map shows: the quantity (:data:`postcast.serve.law.QUANTITIES`) and its level or threshold."""

    what: str = "mean"
    level: float | None = None
    threshold: float | None = None


MEAN = Shown()


def render_map(
    catalog: Catalog, target: str, model: str | None, valid: pd.Timestamp | None, shown: Shown = MEAN
) -> tuple[bytes, dict[str, str]]:
    """The PNG of the best forecast for (target, model, valid) showing ``shown``, and the headers that say
    where its axes are; rendered once per file and parameters (blocking: call it off the event loop)."""
    entry, s, key, found = _lookup(catalog, target, model, valid, shown)
    if found is not None:
        return found
    with catalog.maps.render_lock:
        png = catalog.maps.get(key)
        if png is None:
            png = _render(entry, s.field, key[-1])
            catalog.maps.renders += 1
            catalog.maps.put(key, png)
    return bytes(png), _headers(s)


def cached_map(
    catalog: Catalog, target: str, model: str | None, valid: pd.Timestamp | None, shown: Shown = MEAN
) -> tuple[bytes, dict[str, str]] | None:
    """:func:`render_map`'s answer when that map is rendered already (no rendering: fit for the event loop),
    else None; the same errors."""
    return _lookup(catalog, target, model, valid, shown)[3]


def _lookup(
    catalog: Catalog, target: str, model: str | None, valid: pd.Timestamp | None, shown: Shown
) -> tuple[Product, Served, tuple[Any, ...], tuple[bytes, dict[str, str]] | None]:
    """The product and field of the map, its cache key (``shown`` last, with the file's first threshold for a
    probability without one) and the cached answer (None: not rendered yet)."""
    entry, s = catalog.resolve(target, model, valid)
    if shown.what == "probability" and shown.threshold is None:  # the file's first threshold
        if not s.field.thresholds.size:
            raise HTTPException(422, f"this {target} forecast has no thresholds: give threshold= ({s.field.units})")
        shown = shown._replace(threshold=float(s.field.thresholds[0]))
    key = (entry.path, entry.signature, target, valid, shown)
    png = catalog.maps.get(key)
    return entry, s, key, None if png is None else (bytes(png), _headers(s))


def _west_first(f: Field, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Longitudes -180..180 and ``values`` (lat, lon) in that order."""
    east = f.lon >= 180.0
    return np.concatenate([f.lon[east] - 360.0, f.lon[~east]]), np.concatenate([values[:, east], values[:, ~east]], 1)


def _extent(lon: np.ndarray, lat: np.ndarray) -> tuple[float, float, float, float]:
    """(west, east, south, north) of the grid's cells (half a step beyond the outer points, within +-90)."""
    dx = float(np.min(np.diff(lon))) if lon.size > 1 else 1.0
    dy = float(np.min(np.abs(np.diff(lat)))) if lat.size > 1 else 1.0
    south, north = max(-90.0, float(lat.min()) - dy / 2), min(90.0, float(lat.max()) + dy / 2)
    return float(lon.min()) - dx / 2, float(lon.max()) + dx / 2, south, north


def _headers(s: Served) -> dict[str, str]:
    """Where the map's axes are and what they span: the same for every map of a file, worked out once."""
    headers: dict[str, str] | None = s.memo.get("map headers")
    if headers is None:
        lon, _ = _west_first(s.field, s.field.mean)
        headers = s.memo["map headers"] = {
            "X-Map-Axes": ",".join(f"{v:g}" for v in AXES),
            "X-Map-Extent": ",".join(f"{v:g}" for v in _extent(lon, s.field.lat)),
        }
    return dict(headers)  # a copy: the answer's own


def _render(entry: Product, f: Field, shown: Shown) -> bytes:
    buf = pyio.BytesIO()
    figure(entry, f, shown).savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def figure(entry: Product, f: Field, shown: Shown) -> Any:
    """The matplotlib figure of ``shown`` of ``f`` on longitudes -180..180, titled with what ``entry`` is."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    values = law.quantity(f, shown.what, shown.level, shown.threshold)  # (lat, lon)
    lon, values = _west_first(f, values)
    scale = maps.scale_for(entry.target, shown.what, values)
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    left, top, right, bottom = AXES
    ax = fig.add_axes((left, 1 - bottom, right - left, bottom - top))
    west, east, south, north = _extent(lon, f.lat)
    im = ax.imshow(
        values,
        origin="lower" if f.lat[0] < f.lat[-1] else "upper",
        cmap=scale.cmap,
        vmin=scale.vmin,
        vmax=scale.vmax,
        aspect="auto",
        extent=(west, east, south, north),
        interpolation="nearest",
    )
    maps.draw_coastlines(ax, np.array([west, east]), np.array([south, north]))
    c0, ct, c1, cb = COLORBAR
    fig.colorbar(im, cax=fig.add_axes((c0, 1 - cb, c1 - c0, cb - ct)), label=law.title_of(*shown, f.units))
    lead_h = int((entry.valid - entry.init) / pd.Timedelta(hours=1))
    ax.set_title(
        f"{entry.target}: {law.title_of(*shown, f.units)}, {f.family} law\n"
        f"valid {entry.valid:%Y-%m-%d %H} UTC (init {entry.init:%Y-%m-%d %H} +{lead_h} h, "
        f"{entry.model}, {entry.product}); coastlines: {maps.COASTLINE_SOURCE}",
        fontsize=9,
    )
    return fig
