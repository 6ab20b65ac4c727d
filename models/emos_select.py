"""The local EMOS chosen on validation: each candidate (a form of :mod:`emos_forms` and a pooling of
:mod:`emos_pool`) is fitted to its training-CRPS optimum, scored on the validation dates, and the lowest
validation CRPS (area-weighted over the points with a validation truth) is kept. The test dates are never read.

Every candidate is fitted a latitude band at a time (:class:`emos_bands.BandScratch`, with a halo of rows for
pooling), so the memory held does not grow with the training dates. Up to :data:`FITS_AT_ONCE` fits run on a band
at the same time, in threads: a fit's last iterations move a few hard points, where torch's per-call cost leaves a
core idle (the tp24 preset's two forms on the targets world: 130 % of a core one after the other, 170 % side by
side). A stage with fewer candidates than that splits each candidate's points into parts (every ``parts``-th point
of the band's core), fitted side by side: the points do not interact, so each point ends where one fit over them
all leaves it, up to round-off (torch's sums over the dates take an order that can depend on how many points are
active; a location-scale fit is bit-identical, the csg's can settle elsewhere in a flat valley: 6.5e-9 (1 + CRPS)
apart at most at 40 points of tests/test_emos_optimum.py's world). The bands are sized for the fits held at once
(:func:`emos_bands.band_rows`'s ``fits``; a candidate's parts together hold one fit's memory), a constant, as the
parts are, so that the bands, and with them the coefficients, do not depend on the machine.
"""

from __future__ import annotations

import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from postcast.models import emos_fit, emos_forms
from postcast.models.emos_bands import BandScratch
from postcast.models.emos_fit import FitSettings
from postcast.models.emos_objective import PointData, crps_per_point
from postcast.models.emos_pool import Pooling, Shrinkage, centres, pooled, prior
from postcast.models.emos_report import FitReport

DEFAULT = FitSettings()
FITS_AT_ONCE = 2  # candidates fitted on a band at the same time (threads): see the module docstring
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    form: str
    pooling: Pooling
    shrinkage: Shrinkage | None = None
    centre: torch.Tensor | None = field(default=None, compare=False, repr=False)  # (P, n): the shrinkage's

    def label(self) -> str:
        return f"{self.form} form, {self.pooling.label() if self.shrinkage is None else self.shrinkage.label()}"

    def to_dict(self) -> dict[str, Any]:
        out = {"form": self.form, "radius": self.pooling.radius, "weight": self.pooling.weight}
        if self.shrinkage is not None:
            out |= {"shrink_radius": self.shrinkage.radius, "shrink_weight": self.shrinkage.weight}
        return out


@dataclass
class _Tally:
    """A candidate's coefficients and unit by band, fit reports, and validation CRPS sums."""

    thetas: list[torch.Tensor]
    units: list[torch.Tensor]
    reports: list[FitReport]
    score: float = 0.0
    weight: float = 0.0
    seconds: float = 0.0


@dataclass(frozen=True)
class Selection:
    """The chosen candidate's coefficients theta (P, n), its unit per point (P,), its fit report, and every
    candidate's validation CRPS (for the log, ``summary.json`` and the checkpoint)."""

    chosen: Candidate
    theta: torch.Tensor
    unit: torch.Tensor
    report: FitReport
    table: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen.to_dict(), "candidates": self.table}


@dataclass(frozen=True)
class _Part:
    """One thread's share of a candidate's fit on a band: every ``parts``-th point of the core from ``index``."""

    candidate: Candidate
    index: int = 0
    parts: int = 1

    def of(self, points: int) -> torch.Tensor:
        return torch.arange(self.index, points, self.parts)  # (A / parts,)


def _fit_band(
    band: Any, width: int, family: str, part: _Part, settings: FitSettings, wrap: bool, start: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, FitReport, float]:  # fmt: skip
    """One part of a candidate on one band (:class:`emos_bands.HaloBand`): (theta (A', n), unit (A',), report,
    seconds) of its share of the core's points, warm-started from ``start`` (A, n, the whole core) where given."""
    t0 = time.perf_counter()
    candidate = part.candidate
    d: PointData = band.data
    d = d.with_unit(d.training_unit(settings.min_std))  # each point's unit from its own training spread
    core = slice(band.core.start - band.first, band.core.stop - band.first)
    data = pooled(d, (band.rows, width), core, candidate.pooling, wrap)
    share = part.of(data.y.shape[0])  # (A',) into the core's points
    data, start = data.take(share), None if start is None else start[share]
    if candidate.shrinkage is not None and start is not None:
        theta, report = _fit_shrunk(data, candidate, family, settings, start, band.core.start * width + share)
    else:
        theta, report = emos_fit.fit(data, family, settings, candidate.form, start)
    theta = emos_fit.representable(theta, data, family, candidate.form)
    assert d.u is not None
    unit = d.u[core.start * width : core.stop * width, 0][share]
    return theta, unit, report, time.perf_counter() - t0


def _joined(
    fits: list[tuple[torch.Tensor, torch.Tensor, FitReport, float]], parts: int
) -> tuple[torch.Tensor, torch.Tensor, FitReport, float]:
    """A candidate's ``parts`` fits on a band (:func:`_fit_band`, in part order) as one: theta (A, n) and unit (A,)
    in the core's order, the merged report, and the seconds of the slowest part (they ran side by side)."""
    if parts == 1:
        return fits[0]
    points = sum(f[0].shape[0] for f in fits)
    theta = fits[0][0].new_empty(points, fits[0][0].shape[1])
    unit = fits[0][1].new_empty(points)
    for i, (t, u, _, _) in enumerate(fits):
        theta[i::parts], unit[i::parts] = t, u
    report = FitReport.merged([f[2] for f in fits])
    seconds = max(f[3] for f in fits)
    return theta, unit, replace(report, seconds=seconds), seconds


def _fit_shrunk(
    data: PointData,
    candidate: Candidate,
    family: str,
    settings: FitSettings,
    local: torch.Tensor,
    points: torch.Tensor,
) -> tuple[torch.Tensor, FitReport]:
    """The band's points refitted with the penalty of ``candidate``'s shrinkage from their local fit ``local``
    (A, n), each point's weight scaled by its local training CRPS; ``points`` (A,): their indices in the whole
    grid's row-major order. The points :func:`_free` leaves alone keep their local coefficients, untouched:
    refitted, the sh form's far basin walked its shift out again (to 1e9 spreads, where the model's float32 law
    is wrong)."""
    assert candidate.shrinkage is not None and candidate.centre is not None
    with torch.no_grad():
        crps = crps_per_point(local, data, family, candidate.form)  # (A,)
    free = _free(local, candidate.form) | ~torch.isfinite(crps)
    penalty = prior(candidate.centre[points], torch.nan_to_num(crps), candidate.form, candidate.shrinkage, free)
    fitted, kept = (~free).nonzero().squeeze(1), int(free.sum())
    theta = local.clone()
    with torch.no_grad():  # the report's CRPS over every point of the band: the raw ensemble's, the local fit's
        raw = crps_per_point(emos_forms.raw_start(local.shape[0], local.shape[1], candidate.form, data.y), data,
                             family, candidate.form)  # fmt: skip
    crps_raw, crps_start = float(raw.mean()), float(crps.mean())
    if fitted.numel() == 0:  # every point of the band keeps its local fit
        nothing = FitReport("none: every point kept its local fit", 0, kept, 0, 0, 0, 0.0, 0.0, 0.0, settings.tol_grad,
                            settings.tol_decrease, crps_raw, crps_start, crps_start, 0.0, kept)  # fmt: skip
        return theta, nothing
    theta[fitted], report = emos_fit.fit(
        replace(data, prior=penalty).take(fitted), family, settings, candidate.form, local[fitted]
    )
    with torch.no_grad():  # the training CRPS without the penalty
        crps = crps_per_point(theta, data, family, candidate.form)
    fit_mean = float(crps.mean())
    return theta, replace(report, points=report.points + kept, kept_points=kept, crps_raw=crps_raw,
                          crps_start=crps_start, crps_fit=fit_mean)  # fmt: skip


def _free(theta: torch.Tensor, form: str) -> torch.Tensor:
    """The points (P,) a shrinkage leaves alone: a coefficient not finite, or (sh form) the shift in the far basin."""
    free = ~torch.isfinite(theta).all(1)
    return free | (theta[:, 4] > emos_fit.FAR_SHIFT / 2) if form == "sh" else free


def _validation(
    theta: torch.Tensor, unit: torch.Tensor, val: PointData, family: str, form: str, weights: torch.Tensor
) -> tuple[float, float]:
    """The weighted sum of the band's points' validation CRPS and of their weights (points with a truth)."""
    with torch.no_grad():
        crps = crps_per_point(theta, val.with_unit(unit), family, form)  # (A,)
    has = (val.w.sum(1) > 0) & torch.isfinite(crps)
    w = weights * has
    return float((torch.where(has, crps, 0.0) * w).sum()), float(w.sum())


def _run(
    train: BandScratch,
    val: BandScratch,
    family: str,
    candidates: list[Candidate],
    row_weights: torch.Tensor,
    wrap: bool,
    settings: FitSettings,
    starts: list[torch.Tensor] | None,
) -> list[_Tally]:
    """Every candidate fitted band by band (``starts``: a warm start per band) and scored on validation."""
    halo = max((c.pooling.radius for c in candidates), default=0)
    tallies = [_Tally([], [], []) for _ in candidates]
    bands = zip(train.halo_bands(settings.min_std, halo), val.bands(settings.min_std), strict=True)
    # one pool for every band: a pool per band started new threads each time, and each new thread's glibc arena
    # kept the band's freed tensors (0.5 deg, 12 bands: the fit's peak 2.70 GB against 2.17 with one pool)
    parts = max(1, FITS_AT_ONCE // max(1, len(candidates)))  # each candidate's share of the threads
    shares = [_Part(c, i, parts) for c in candidates for i in range(parts)]
    with ThreadPoolExecutor(max_workers=fits_at_once(len(shares))) as pool:
        for b, (band, val_band) in enumerate(bands):
            width = band.data.y.shape[0] // band.rows
            weights = row_weights[band.core].repeat_interleave(width).to(torch.float64)  # (A,)
            warm = None if starts is None else starts[b]
            fit = functools.partial(_fit_band, band, width, family, settings=settings, wrap=wrap, start=warm)
            done = list(pool.map(fit, shares))
            fits = [_joined(done[i : i + parts], parts) for i in range(0, len(done), parts)]
            for candidate, (theta, unit, report, seconds), tally in zip(candidates, fits, tallies, strict=True):
                tally.seconds += seconds
                score, weight = _validation(theta, unit, val_band, family, candidate.form, weights)
                tally.thetas.append(theta)
                tally.units.append(unit)
                tally.reports.append(report)
                tally.score, tally.weight = tally.score + score, tally.weight + weight
    return tallies


def fits_at_once(candidates: int) -> int:
    """How many of a stage's ``candidates`` are fitted on a band at the same time."""
    return max(1, min(candidates, FITS_AT_ONCE))


def held_at_once(forms: list[str], pools: list[Pooling], shrinks: int = 0) -> int:
    """The most fits :func:`select` holds at once over its two stages (the forms', then the poolings' and the
    ``shrinks`` shrinkages')."""
    return fits_at_once(max(len(forms), sum(not p.local for p in pools) + shrinks))


def _row(candidate: Candidate, tally: _Tally) -> dict[str, Any]:
    val_crps = tally.score / max(tally.weight, 1e-300)
    train_crps = FitReport.merged(tally.reports).crps_fit
    log.info("local EMOS candidate %s: validation CRPS %.6f, training CRPS %.6f, %.1f s",
             candidate.label(), val_crps, train_crps, tally.seconds)  # fmt: skip
    return {**candidate.to_dict(), "val_crps": val_crps, "train_crps": train_crps, "seconds": tally.seconds}


def select(
    train: BandScratch,
    val: BandScratch,
    family: str,
    forms: list[str],
    pools: list[Pooling],
    row_weights: torch.Tensor,
    wrap: bool,
    settings: FitSettings = DEFAULT,
    shrinks: tuple[Shrinkage, ...] = (),
) -> Selection:
    """The candidate of lowest validation CRPS, fitted on ``train``'s bands; ``val`` holds the validation dates
    in the same bands; ``row_weights`` (H,) weight each latitude row's points (cos latitude). In two stages, so
    that the costly pooled fits (a neighbour's dates count at every point near it) run for one form only: each
    form's local fit, then the poolings ``pools`` of the form whose local fit validated best, each warm-started
    from that local fit, and its shrinkages ``shrinks`` towards that local fit's neighbours (warm-started too)."""
    t0 = time.perf_counter()
    local = [Candidate(f, Pooling()) for f in forms]
    tallies = _run(train, val, family, local, row_weights, wrap, settings, None)
    rows = [_row(c, t) for c, t in zip(local, tallies, strict=True)]
    form = min(range(len(local)), key=lambda i: rows[i]["val_crps"])
    pooled_ = [Candidate(forms[form], p) for p in pools if not p.local]
    if shrinks:
        local_theta = torch.cat(tallies[form].thetas)  # (P, n), row-major over the grid
        shape = (train.height, local_theta.shape[0] // train.height)
        for shrink in shrinks:
            free = _free(local_theta, forms[form])
            centre = centres(local_theta, shape, forms[form], shrink.radius, wrap, free)
            pooled_.append(Candidate(forms[form], Pooling(), shrink, centre))
    if pooled_:
        more = _run(train, val, family, pooled_, row_weights, wrap, settings, tallies[form].thetas)
        local, tallies = local + pooled_, tallies + more
        rows += [_row(c, t) for c, t in zip(pooled_, more, strict=True)]
    best = min(range(len(local)), key=lambda i: rows[i]["val_crps"])
    log.info("local EMOS chosen on validation: %s", local[best].label())
    t = tallies[best]
    report = replace(FitReport.merged(t.reports), seconds=time.perf_counter() - t0)  # every candidate's fit
    return Selection(local[best], torch.cat(t.thetas), torch.cat(t.units), report, rows)
