"""The forecaster's page at ``/`` and what it needs, all served by postcast (no CDN, no tile server):

* ``GET /``: the page (``static/index.html``); its script (``static/page.js``) and style
  (``static/page.css``) under ``/static``; it picks the target, the model (the best-verified one by
  default, marked), the init time and what to draw (mean, spread, a quantile, the probability of
  exceeding one of the file's thresholds or a typed one), shows ``/map.png`` (coastlines, axes, the
  family and units) and, on a click, the point's predictive distribution from ``/forecast/point``;
* ``GET /forecast/law``: the law of one forecast (family, definition, units, where its thresholds come
  from, a note when the family can give impossible values), its quantile levels, thresholds and lead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from fastapi import FastAPI, Response
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from postcast.serve import law
from postcast.serve.catalog import Catalog
from postcast.serve.schemas import LawAnswer, Model, Target, Time, error_answers, parse_time

STATIC = Path(__file__).with_name("static")


def law_answer(catalog: Catalog, target: str, model: str | None, valid: pd.Timestamp | None) -> dict[str, Any]:
    """The law of the best forecast for (target, model, valid): what the page shows beside the map."""
    entry, s = catalog.resolve(target, model, valid)
    f = s.field
    return {
        "target": target,
        "model": entry.model,
        "product": entry.product,
        "init_time": s.init,
        "valid_time": s.valid,
        "lead_h": int((entry.valid - entry.init) / pd.Timedelta(hours=1)),
        "law": law.describe(target, f),
        "quantile_levels": [float(q) for q in f.quantile_levels],
        "thresholds": [float(t) for t in f.thresholds],
    }


def page_routes(app: FastAPI, catalog: Catalog, *, guarded: bool) -> None:
    """``/``, ``/forecast/law`` and the page's static files under ``/static``."""
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", response_class=HTMLResponse, responses=error_answers(401, 422, guarded=guarded, json_media=True))
    def index() -> HTMLResponse:
        """The forecast page: pick a forecast and what to draw; click the map for a point's distribution."""
        catalog.watch()
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))

    @app.get("/forecast/law", response_model=LawAnswer, responses=error_answers(401, 404, 422, guarded=guarded))
    def forecast_law(target: Target, time: Time = None, model: Model = None) -> Response:
        """The predictive law of a forecast: family, units, thresholds and where they come from, quantile
        levels, lead; a note when the family can give values the target cannot take."""
        import json

        body = law_answer(catalog, target, model, parse_time(time))
        return Response(json.dumps(body, separators=(",", ":")).encode(), media_type="application/json")
