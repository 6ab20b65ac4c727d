"""The service's documented interface: the pydantic models of its answers (errors included), the
query parameters of its routes, the documented error answers per route, and the parsing of ``time=``."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Annotated, Any

import pandas as pd
from fastapi import HTTPException, Query
from pandas.errors import OutOfBoundsDatetime
from pydantic import BaseModel, Field

from postcast.datasets import laws, schema


# --- the answers -------------------------------------------------------------------------------------
class Problem(BaseModel):
    """Every error: what went wrong and how to fix it."""

    detail: str


class ThresholdSource(BaseModel):
    source: str  # "target" (its own), "training_climate" (its 10/50/90 % quantiles) or "given" (--thresholds)
    says: str


class LawInfo(BaseModel):
    """The predictive law that answers (postcast.serve.law)."""

    family: str
    definition: str
    units: str
    thresholds: ThresholdSource
    note: str | None  # e.g. a Gaussian for rain: its quantiles can be negative


class LawAnswer(BaseModel):
    """The law of one forecast (``/forecast/law``)."""

    target: str
    model: str
    product: str
    init_time: str
    valid_time: str
    lead_h: int
    law: LawInfo
    quantile_levels: list[float]
    thresholds: list[float]


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
    law: LawInfo
    members: list[float] | None = Field(
        None, description="the raw ensemble's members at the point (target units), before post-processing; "
        "null for a file that does not store them"
    )  # fmt: skip


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
    law: LawInfo


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
    units: str  # of the scores (the target's)
    score: str  # what the score is


class Listing(BaseModel):
    targets: list[TargetListed]
    forecasts: list[Listed]


# --- the request parameters ------------------------------------------------------------------------
# the targets come from the schema (one home for target facts): the pattern checks, the enum documents
Target = Annotated[
    str,
    Query(
        description=f"one of {', '.join(schema.TARGETS)}",
        pattern="^(" + "|".join(map(re.escape, schema.TARGETS)) + ")$",
        json_schema_extra={"enum": list(schema.TARGETS)},
    ),
]
# the models come from the archive: the OpenAPI document enumerates them as they are (see postcast.serve.openapi)
Model = Annotated[
    str | None,
    Query(
        description="the model (see /forecasts); default: the target's best-verified "
        "model, then the next one that has a forecast for that time"
    ),
]
Lat = Annotated[float, Query(ge=-90.0, le=90.0, allow_inf_nan=False, description="degrees north")]
Lon = Annotated[float, Query(ge=-180.0, le=360.0, allow_inf_nan=False, description="degrees east (-180..360)")]
Time = Annotated[
    str | None,
    Query(
        description="valid time (ISO 8601, e.g. 2017-01-04T00:00); default: the latest",
        json_schema_extra={"format": "date-time"},
    ),
]
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "missing or wrong bearer token"},
    404: {"model": Problem, "description": "no readable forecast for that target, model and time"},
    422: {"model": Problem, "description": "invalid parameters"},
}


def error_answers(*codes: int, guarded: bool, json_media: bool = False) -> dict[int | str, dict[str, Any]]:
    """The documented error answers; ``json_media`` for a route whose own answer is not JSON (the
    errors still are)."""
    out: dict[int | str, dict[str, Any]] = {c: ERRORS[c] for c in codes if c != 401 or guarded}
    if json_media:
        ref = {"schema": {"$ref": "#/components/schemas/Problem"}}
        out = {c: {"description": r["description"], "content": {"application/json": ref}} for c, r in out.items()}
    return out


RELATIVE_TIMES = frozenset({"now", "today"})  # pandas reads them off the clock: never cached


def parse_time(text: str | None) -> pd.Timestamp | None:
    """``time=`` as a naive UTC timestamp (None: the latest); 422 when it is no date-time, 404 when no
    forecast can exist for it. Absolute times are cached; ``now`` and ``today`` are read at each request."""
    if text is not None and text.strip().lower() in RELATIVE_TIMES:
        return _parse_time(text)
    return _parse_time_cached(text)


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


# clients ask for the same few valid times over and over (errors are not cached)
_parse_time_cached = lru_cache(maxsize=4096)(_parse_time)


def check_threshold(target: str, threshold: float | None) -> None:
    """422 for a threshold below what the target can take (its law's support: 0 for wind speed and
    precipitation), where every forecast's exceedance probability is 1."""
    lower = laws.get(schema.target(target).family).lower
    if threshold is not None and lower is not None and threshold < lower:
        raise HTTPException(
            422, f"threshold {threshold:g}: {target} is never below {lower:g}; give a threshold of {lower:g} or more"
        )
