"""What law answers a query, said with every answer: the predictive family of the forecast file (its
name and definition, :mod:`postcast.datasets.laws`), the units, where the exceedance thresholds come
from, and a warning when the family can give values the quantity cannot take (a Gaussian for rain or
wind speed gives negative amounts); and the fields the map draws (mean, spread, any quantile, the
probability of exceeding any threshold), computed by the family's own law."""

from __future__ import annotations

from typing import Any

import numpy as np

from postcast.datasets import laws, schema
from postcast.datasets.contract import CLIMATE_QUANTILES
from postcast.pipeline.products.archive import Field
from postcast.pipeline.products.content import CLIMATE, GIVEN, OWN

QUANTITIES = ("mean", "spread", "quantile", "probability")


def non_negative(target: schema.Target) -> bool:
    """Whether the target's values cannot be negative (an accumulated amount clipped at 0, a speed)."""
    d = target.derive
    return d is not None and (d.clip_min is not None or d.kind is schema.DeriveKind.HYPOT)


def threshold_source(target: schema.Target, f: Field) -> dict[str, str]:
    """Where a file's thresholds come from, as the file records it (``forecast`` writes the attribute
    threshold_source); for a file from before that, inferred: the target's own (datasets/schema.py), else the
    training climate's 10/50/90 % quantiles (the checkpoint's default when the target has none), else values
    given to ``postcast forecast --thresholds``."""
    values = tuple(float(t) for t in f.thresholds)
    source = f.threshold_source
    if source is None and target.thresholds and np.allclose(values, target.thresholds):
        source = OWN
    elif source is None:
        source = CLIMATE if not target.thresholds and len(values) == len(CLIMATE_QUANTILES) else GIVEN
    pct = "/".join(f"{100 * q:g}" for q in CLIMATE_QUANTILES)
    says = {
        OWN: f"the target's own thresholds ({target.units})",
        CLIMATE: f"the training climate's {pct} % quantiles of {target.name}",
        GIVEN: "thresholds given to postcast forecast --thresholds",
    }
    return {"source": source, "says": says[source]}


def describe(target_name: str, f: Field) -> dict[str, Any]:
    """The law of a forecast as every answer states it: family, its definition, units, the source of the
    thresholds, and a note when the family can give values the quantity cannot take."""
    target = schema.target(target_name)
    family = laws.get(f.family)
    out: dict[str, Any] = {
        "family": f.family,
        "definition": (type(family).__doc__ or f.family).strip().splitlines()[0].rstrip("."),
        "units": f.units,
        "thresholds": threshold_source(target, f),
        "note": None,
    }
    if non_negative(target) and family.lower is None and f.quantiles.size:
        share = float(np.mean(f.quantiles[0] < 0.0))  # the lowest stored quantile below zero, share of points
        out["note"] = (
            f"a {f.family} law for {target.name}, which cannot be negative: its quantiles can be negative "
            f"(the {100 * float(f.quantile_levels[0]):g} % quantile is below 0 at {100 * share:.0f} % of points)"
        )
    return out


def quantity(f: Field, what: str, level: float | None, threshold: float | None) -> np.ndarray:
    """The (lat, lon) field to draw: ``mean``, ``spread`` (the std), the ``quantile`` at ``level`` or the
    ``probability`` of exceeding ``threshold``, each by the file's own family."""
    law = laws.get(f.family)
    if what == "mean":
        return f.mean
    if what == "spread":
        return f.std
    if what == "quantile":
        return np.asarray(law.quantile(f.params, float(level if level is not None else 0.5)))
    if threshold is None:
        msg = "show=probability needs threshold="
        raise ValueError(msg)
    return np.asarray(law.sf(f.params, float(threshold)))


def title_of(what: str, level: float | None, threshold: float | None, units: str) -> str:
    """What the map shows, in words with units."""
    if what == "quantile":
        return f"{100 * (level if level is not None else 0.5):g} % quantile ({units})"
    if what == "probability":
        return f"probability of exceeding {threshold:g} {units}"
    return f"{'predictive mean' if what == 'mean' else 'spread (predictive std)'} ({units})"
