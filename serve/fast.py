"""The point query's fast path (issue 58): the hot route answered without FastAPI's per-request dependency
solving and pydantic validation of its query parameters, which cost most of a point query's server time.

A :class:`FastRoute` is an ordinary FastAPI route (its parameters, answer and errors are in the OpenAPI
document, and it answers exactly as before) with one addition: before the route's handler runs, its ``fast``
function reads the query itself. When every parameter is plainly valid (:func:`point_params`: each at most
once, a target of the schema, numbers written in plain decimal notation, finite and inside their bounds) it
answers from the same route function; anything else (a missing, repeated, out-of-range or oddly written
parameter) goes the usual way, through FastAPI's validation, so every error answer is FastAPI's own.
The errors the route function itself raises (404, 422 from the archive, the time or the threshold) are
``HTTPException``s either way, turned into the same answers by the app's exception handlers."""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from fastapi import Response
from fastapi.routing import APIRoute
from starlette.types import Receive, Scope, Send

from postcast.datasets import schema
from postcast.serve.schemas import Lat, Lon

QUERY = "postcast.query"  # scope key: the parsed query string, left by the gate (postcast.serve.auth)
# a number as every parser reads it alike (Python's float and pydantic's): sign, ASCII digits, optional point and
# exponent; no spaces, underscores, hex, inf or nan (those take the validated way)
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def closed_bounds(annotated: Any) -> tuple[float, float]:
    """The closed interval [ge, le] of a finite number parameter (``Annotated[float, Query(ge=.., le=..,
    allow_inf_nan=False)]``, as serve/schemas.py declares them); a ValueError for any other constraint (the
    fast path would not check it)."""
    low, high = -math.inf, math.inf
    for rule in typing.get_args(annotated)[1].metadata:
        if hasattr(rule, "ge"):
            low = float(rule.ge)
        elif hasattr(rule, "le"):
            high = float(rule.le)
        elif getattr(rule, "allow_inf_nan", None) is not False:
            msg = f"{annotated}: {rule} is not a constraint the point query's fast path checks"
            raise ValueError(msg)
    return low, high


# the point route's numeric parameters and their bounds, from the route's own declarations (threshold: any finite)
_BOUNDS = {"lat": closed_bounds(Lat), "lon": closed_bounds(Lon), "threshold": (-math.inf, math.inf)}
_TEXT = ("time", "model")  # any text: the route function checks them (parse_time, the catalog)
_TARGETS = frozenset(schema.TARGETS)  # Target's pattern is exactly these
POINT_PARAMS = frozenset({"target", *_BOUNDS, *_TEXT})  # what the fast path reads: all the route takes


class FastRoute(APIRoute):
    """A FastAPI route whose ``fast`` function (the scope -> an answer, or None to go the usual way) is
    tried first for GET (and HEAD, which the gate turns into GET)."""

    fast: Callable[[Scope], Response | None] | None = None

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = self.fast(scope) if self.fast is not None and scope["method"] == "GET" else None
        if response is None:
            await super().handle(scope, receive, send)
        else:
            await response(scope, receive, send)


def query_pairs(scope: Scope) -> list[tuple[str, str]]:
    """The query's (name, value) pairs as Starlette reads them (latin-1, percent-decoded, blanks kept);
    parsed once per request: the gate leaves them in the scope."""
    pairs: list[tuple[str, str]] | None = scope.get(QUERY)
    if pairs is None:
        pairs = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    return pairs


def number(text: str, low: float, high: float) -> float | None:
    """``text`` as a finite float within [low, high] when it is plainly written, else None."""
    if _NUMBER.fullmatch(text) is None:
        return None
    x = float(text)
    return x if math.isfinite(x) and low <= x <= high else None  # 1e400 overflows to inf


def point_params(scope: Scope) -> dict[str, Any] | None:
    """The point route's arguments (target, lat, lon, time, model, threshold) when the query is plainly valid,
    the values FastAPI's validation would give; None when it is not (FastAPI then validates and answers)."""
    out: dict[str, Any] = {}
    for name, value in query_pairs(scope):
        if name in out:  # a repeated parameter: FastAPI takes the last one
            return None
        bounds = _BOUNDS.get(name)
        if bounds is not None:
            x = number(value, *bounds)
            if x is None:
                return None
            out[name] = x
        elif name in _TEXT or (name == "target" and value in _TARGETS):
            out[name] = value
        else:  # an unknown parameter (the gate refuses those) or a target that is not one of the schema's
            return None
    if "target" not in out or "lat" not in out or "lon" not in out:
        return None
    return {"time": None, "model": None, "threshold": None, **out}
