"""Streaming verification: one lead's results accumulated over chunks of init dates.

A chunk of dates (a few :class:`~postcast.pipeline.verify.chunk.Chunk` s: every forecast on those dates) becomes a
:class:`Part`, what those dates add to the lead's results, and an :class:`Accumulator` merges the parts in
date order and makes the results Dataset at the end (:meth:`Accumulator.finish`). Every score is a sum and a
count (WeatherBench 2 averages its per-chunk metrics the same way), so memory does not depend on the number of
dates beyond the per-date series that the significance tests need (T numbers per score):

* scores: the per-date region means of each metric's statistics (region, weighting, T), finalised as
  :func:`postcast.pipeline.verify.metrics.finalize_means` does for the whole split, so per-date and all-dates
  values are those of the in-memory computation;
* CRPS maps: the pointwise CRPS summed date by date, in date order (the same additions as a mean over dates);
* the Hersbach decomposition: per region the additive sums of :func:`~postcast.pipeline.verify.metrics.hersbach_sums`
  and the outcomes' weighted sample as distinct values and weights (its climatological CRPS, the uncertainty),
  written to sorted runs under TMPDIR beyond a fixed size and merged at the end
  (:mod:`~postcast.pipeline.verify.outcomes`);
* reliability bins (weights, weighted probabilities and outcomes, counts), PIT and rank histograms (counts; the
  random tie-breaks and point-mass draws are the generator's draws at the chunk's offset, so the counts are
  those of one pass over the split), the mean |EFI| (sum and count).

Sums of floating-point numbers in another grouping differ in the last bits: the results equal the
in-memory computation's to about 1e-13 (bit for bit where the order is kept: per-date scores, CRPS maps,
histograms). docs/verification.md, *Streaming over dates*.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import xarray as xr

from postcast.pipeline.verify import metrics, scores
from postcast.pipeline.verify.chunk import ENSEMBLE, PREDICTIVE, Chunk
from postcast.pipeline.verify.metrics import (
    DECOMPOSITION,
    PIT_BINS,
    PROB_BINS,
    REGIONS,
    WEIGHTINGS,
    Means,
    ValueWeights,
)
from postcast.pipeline.verify.outcomes import OutcomeSample


@dataclass
class Part:
    """What a chunk of dates adds to one lead's results; lists run over the forecasts (``names``)."""

    start: int  # position of the chunk's first date in the split
    names: list[str]
    means: list[Means]  # metric -> statistic -> (region, weighting, nt) per-date region means
    crps: list[np.ndarray]  # (nt, lat, lon) pointwise CRPS
    decomposition: list[np.ndarray]  # (region, 2 (N + 1) + 3) Hersbach sums
    reliability: list[np.ndarray]  # (event, 4, PROB_BINS) reliability sums
    pit: np.ndarray  # (forecast, PIT_BINS) counts
    samples: list[ValueWeights]  # per region: the outcomes' weighted sample
    rank: np.ndarray | None = None  # (M + 1,) rank counts of the members
    efi_abs: tuple[float, int] = (0.0, 0)  # sum of |EFI| and the number of values

    @property
    def n_dates(self) -> int:
        return int(self.crps[0].shape[0])


def _reliability(chunk: Chunk, thresholds: dict[str, np.ndarray], glob: np.ndarray) -> np.ndarray:
    """(event, 4, PROB_BINS) reliability sums of the chunk's forecast at each event's threshold."""
    rows = [
        metrics.reliability_sums(
            metrics.exceedance(chunk, q, name.startswith("above")),
            (chunk.truth > q) if name.startswith("above") else (chunk.truth < q),
            glob,
        )
        for name, q in thresholds.items()
    ]
    return np.stack(rows) if rows else np.zeros((0, 4, PROB_BINS))


def part_of(
    names: list[str],
    chunks: list[Chunk],
    lat: np.ndarray,
    lon: np.ndarray,
    *,
    start: int = 0,
    thresholds: dict[str, np.ndarray] | None = None,
    rank_skip: int = 0,
) -> Part:
    """The :class:`Part` of several forecasts on the same dates (date ``start`` on of the split; ``rank_skip``:
    the finite outcomes of the split's earlier dates, where the rank histogram's tie-breaks go on)."""
    thresholds = thresholds or {}
    chunks = [replace(c, thresholds=thresholds) if thresholds else c for c in chunks]
    glob = REGIONS[0].weights(lat, lon, "area")
    pit_skip = start * lat.size * lon.size  # the point-mass draws of the dates before
    pits = [
        np.histogram(metrics.pit(c, skip=pit_skip), bins=PIT_BINS, range=(0.0, 1.0))[0]
        if c.kind == PREDICTIVE
        else np.zeros(PIT_BINS, dtype=np.int64)
        for c in chunks
    ]
    ens = [c for c in chunks if c.kind == ENSEMBLE]
    rank = (
        scores.rank_histogram(ens[0].members, ens[0].truth, axis=1, skip=rank_skip)
        if ens and ens[0].members is not None
        else None
    )
    efi = chunks[0].efi
    return Part(
        start=start,
        names=list(names),
        means=[metrics.chunk_means(c, lat, lon) for c in chunks],
        crps=[np.asarray(c.crps) for c in chunks],
        decomposition=[metrics.decomposition_sums(c, lat, lon) for c in chunks],
        reliability=[_reliability(c, thresholds, glob) for c in chunks],
        pit=np.stack(pits).astype(np.int64),
        samples=metrics.region_samples(chunks[0].truth, lat, lon),
        rank=rank,
        efi_abs=(float(np.abs(efi).sum()), int(efi.size)),
    )


@dataclass
class Accumulator:
    """The parts of one lead merged in date order (each must start where the last ended)."""

    names: list[str] = field(default_factory=list)
    n_dates: int = 0
    means: list[list[Means]] = field(default_factory=list)  # per forecast, the parts' means in date order
    crps_sum: list[np.ndarray] = field(default_factory=list)  # (lat, lon) per forecast, summed date by date
    decomposition: list[np.ndarray] = field(default_factory=list)
    reliability: list[np.ndarray] = field(default_factory=list)
    pit: np.ndarray | None = None
    samples: list[OutcomeSample] = field(default_factory=list)  # per region (spilled to TMPDIR when large)
    rank: np.ndarray | None = None
    efi_abs: tuple[float, int] = (0.0, 0)

    def add(self, part: Part) -> None:
        if part.start != self.n_dates or (self.names and part.names != self.names):
            msg = f"part at date {part.start} of {part.names}: expected date {self.n_dates} of {self.names}"
            raise ValueError(msg)
        if not self.names:
            self._first(part)
        else:
            self._merge(part)
        for f, crps in enumerate(part.crps):
            for row in crps[int(not self.n_dates) :]:  # in date order: the additions of a mean over dates
                self.crps_sum[f] += row
        self.n_dates += part.n_dates

    def _first(self, part: Part) -> None:
        self.names = list(part.names)
        self.means = [[m] for m in part.means]
        self.crps_sum = [np.array(c[0], dtype=np.float64) for c in part.crps]
        self.decomposition = [d.copy() for d in part.decomposition]
        self.reliability = [r.copy() for r in part.reliability]
        self.pit, self.rank, self.efi_abs = part.pit.copy(), part.rank, part.efi_abs
        self.samples = [OutcomeSample() for _ in part.samples]
        for sample, values in zip(self.samples, part.samples, strict=True):
            sample.add(values)

    def _merge(self, part: Part) -> None:
        assert self.pit is not None
        for f in range(len(self.names)):
            self.means[f].append(part.means[f])
            self.decomposition[f] += part.decomposition[f]
            self.reliability[f] += part.reliability[f]
        self.pit += part.pit
        for sample, values in zip(self.samples, part.samples, strict=True):
            sample.add(values)
        if part.rank is not None:
            self.rank = part.rank if self.rank is None else self.rank + part.rank
        self.efi_abs = (self.efi_abs[0] + part.efi_abs[0], self.efi_abs[1] + part.efi_abs[1])

    def _scores(self, f: int) -> tuple[np.ndarray, np.ndarray]:
        parts = self.means[f]
        joined = {i: {s: np.concatenate([p[i][s] for p in parts], axis=-1) for s in parts[0][i]} for i in parts[0]}
        return metrics.finalize_means(joined)

    def finish(
        self, lat: np.ndarray, lon: np.ndarray, init_time: np.ndarray, events: list[str], *, extras: bool = True
    ) -> xr.Dataset:
        """The lead's results Dataset (dims forecast, metric, region, weighting, init_time, ...); ``extras``: with
        the members' rank histogram and the mean |EFI|."""
        assert self.pit is not None
        scores = [self._scores(f) for f in range(len(self.names))]
        unc = [s.crps() for s in self.samples]
        decomp = [
            np.stack(
                [[metrics.hersbach_terms(d[j], unc[j])[c] for c in DECOMPOSITION] for j in range(len(REGIONS))],
                axis=-1,
            )
            for d in self.decomposition
        ]  # (component, region) each
        dims = ("forecast", "metric", "region", "weighting")
        ds = xr.Dataset(
            {
                "score": (dims, np.stack([s[0] for s in scores])),
                "score_per_date": ((*dims, "init_time"), np.stack([s[1] for s in scores])),
                "decomposition": (("forecast", "component", "region"), np.stack(decomp)),
                "crps_map": (("forecast", "latitude", "longitude"), np.stack(self.crps_sum) / self.n_dates),
                "reliability": (
                    ("forecast", "event", "quantity", "prob_bin"),
                    np.stack(
                        [metrics.reliability_rows(r.transpose(1, 0, 2)).transpose(1, 0, 2) for r in self.reliability]
                    ),
                ),
                "pit_histogram": (("forecast", "pit_bin"), self.pit),
            },
            coords=_coords(self.names, init_time, lat, lon, events),
        )
        if extras and self.rank is not None:
            ds = ds.assign(rank_histogram=(("rank",), self.rank), mean_abs_efi=((), self.efi_abs[0] / self.efi_abs[1]))
        return ds


def _coords(
    names: list[str], init_time: np.ndarray, lat: np.ndarray, lon: np.ndarray, events: list[str]
) -> dict[str, object]:
    return {
        "forecast": names,
        "metric": [m.name for m in metrics.METRICS],  # the registry as it is now (a metric may be added)
        "metric_label": ("metric", [m.label for m in metrics.METRICS]),
        "metric_description": ("metric", [m.description for m in metrics.METRICS]),
        "region": [r.name for r in REGIONS],
        "weighting": list(WEIGHTINGS),
        "init_time": init_time,
        "component": list(DECOMPOSITION),
        "latitude": lat,
        "longitude": lon,
        "event": events,
        "quantity": ["forecast_probability", "observed_frequency", "count"],
        "prob_bin": (np.arange(PROB_BINS) + 0.5) / PROB_BINS,
        "pit_bin": (np.arange(PIT_BINS) + 0.5) / PIT_BINS,
    }


def as_dataset(
    names: list[str],
    chunks: list[Chunk],
    lat: np.ndarray,
    lon: np.ndarray,
    init_time: np.ndarray,
    thresholds: dict[str, np.ndarray] | None = None,
) -> xr.Dataset:
    """Scores, per-date scores, decomposition, CRPS maps, reliability and PIT of several forecasts on one lead
    and all its dates at once (one part), as a Dataset with dims forecast, metric, region, weighting, init_time."""
    acc = Accumulator()
    acc.add(part_of(names, chunks, lat, lon, thresholds=thresholds))
    return acc.finish(lat, lon, init_time, list(thresholds or {}), extras=False)
