"""What the service draws: the PNG map of a forecast's mean (rendered once per file and parameters,
one render at a time) and the HTML page with the latest forecasts."""

from __future__ import annotations

import html
import io as pyio

import numpy as np
import pandas as pd
from fastapi import Response

from postcast.pipeline.archive import Field, Product
from postcast.serve.catalog import Catalog


class PNGResponse(Response):
    """A PNG answer (``image/png``)."""

    media_type = "image/png"


def render_map(catalog: Catalog, target: str, model: str | None, valid: pd.Timestamp | None) -> bytes:
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
    """The PNG of the mean of ``f`` on longitudes -180..180, titled with what ``entry`` is."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    lon = np.concatenate([f.lon[f.lon >= 180.0] - 360.0, f.lon[f.lon < 180.0]])  # -180..180 for the picture
    mean = np.concatenate([f.mean[:, f.lon >= 180.0], f.mean[:, f.lon < 180.0]], axis=1)  # (lat, lon)
    im = ax.imshow(
        mean,
        origin="lower" if f.lat[0] < f.lat[-1] else "upper",
        cmap="RdYlBu_r",
        aspect="auto",
        extent=(float(lon.min()), float(lon.max()), float(f.lat.min()), float(f.lat.max())),
    )
    fig.colorbar(im, ax=ax, label=f"{entry.target} mean ({f.units})")
    ax.set_title(
        f"{entry.target} valid {entry.valid:%Y-%m-%d %H} UTC (init {entry.init:%Y-%m-%d %H}, "
        f"{entry.product}, {entry.model})"
    )
    buf = pyio.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    return buf.getvalue()


def index_page(catalog: Catalog, token: str | None) -> str:
    """The HTML page: the map of the latest forecast (a note instead when the map needs ``token``) and
    the last 20 forecasts listed."""
    rows = "".join(
        f"<tr><td>{e.target}</td><td>{e.init:%Y-%m-%d %H}</td><td>{e.valid:%Y-%m-%d %H}</td>"
        f"<td>{html.escape(e.product)}</td><td>{html.escape(e.model)}</td></tr>"
        for e in catalog.entries[-20:]
    )
    img = (
        '<img src="/map.png" alt="latest forecast">'
        if token is None
        else ("<p>(the map needs the bearer token: GET /map.png)</p>")
    )
    return (
        f"<!doctype html><html><head><title>postcast</title></head><body><h1>postcast forecasts</h1>"
        f"{img}<table border=1><tr><th>target</th><th>init</th><th>valid</th><th>product</th><th>model</th>"
        f"</tr>{rows}</table><p><a href='/docs'>API docs</a></p></body></html>"
    )
