"""Evaluation's work on chunks of init dates, in this process or on a dask cluster.

* :func:`efi_fields`: the EFI of each date against its model climate, a band of latitudes at a time (the
  climate window's members of one band at most :data:`EFI_TILE_BYTES`), each window date of a task decoded once
  into a scratch on local disk (a store chunk holds a date's whole grid: read a band at a time, the store was
  decoded bands x window times a date, quadratic in the window);
* :func:`climate_thresholds`: the training truth's 10 / 90 % quantiles per point, a band at a time (a task
  each on a cluster: the driver never holds the training truth);
* :class:`LeadJob` and :func:`score_dates`: one target's lead, and the
  :class:`~postcast.pipeline.verify.accumulate.Part` of :data:`DATES_PER_TASK` of its dates (truth, members and each
  checkpoint's prediction of those dates only);
* :func:`parts`: the parts of a lead in date order, from a dask client (:func:`in_order`: a bounded number of
  tasks in flight, so the driver holds a few parts at a time; ``postcast forecast`` uses it too) or here.

Memory: a task holds its dates' arrays (members, forecasts, a Gaussian's 50 quantile members of one date) and
one band of an EFI climate window (its window dates' members are on local disk, in a temporary directory, while
the task runs), the driver one lead's accumulator; neither grows with the number of dates beyond T numbers per
score.
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import contract, reads, schema
from postcast.datasets.core.cluster import in_order
from postcast.datasets.core.errors import BadInputError, PostcastError
from postcast.models import distributions
from postcast.pipeline.checkpoints import OpenedCheckpoint
from postcast.pipeline.verify import metrics, scores
from postcast.pipeline.verify.accumulate import Part, part_of
from postcast.pipeline.verify.chunk import Chunk, GaussianForecast
from postcast.pipeline.verify.forecasts import (
    ENSEMBLE,
    RAW,
    FamilyForecast,
    add_forecast,
    check_finite,
    check_shape,
    oracle_forecast,
    predict_opened,
    step_field,
    target_members,
    verification_dataset,
)

DATES_PER_TASK = 4  # a checkpoint's prediction batch: a task predicts the same batches as one pass would
TILE_BYTES = 512 << 20  # float64 bytes of one latitude band of the training truth (:func:`climate_thresholds`)
EFI_TILE_BYTES = 128 << 20  # ... of an EFI climate window (read back from its scratch: more bands cost no decoding)
READ_BYTES = 64 << 20  # float32 bytes of the whole-grid fields one read of the store decodes (:func:`_date_groups`)


def _bands(n_lat: int, row_bytes: int, tile_bytes: int) -> list[slice]:
    """Latitude bands of at most ``tile_bytes`` (``row_bytes`` per latitude row), at least one row each."""
    rows = max(1, tile_bytes // max(1, row_bytes))
    return [slice(i, min(i + rows, n_lat)) for i in range(0, n_lat, rows)]


def _date_groups(n: int, date_bytes: int) -> list[slice]:
    """Groups of the n dates read from the store at a time (a band of the training truth, each group copied into
    the band's float64 array as it comes: no float32 copy of the whole band; an EFI window's whole grids, each
    date saved to the scratch as it comes): at most READ_BYTES of whole-grid fields (``date_bytes`` per date,
    float32; a store chunk holds one date's whole grid) each, at least one date."""
    size = max(1, READ_BYTES // max(1, date_bytes))
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def efi_fields(store: xr.Dataset, ver: xr.Dataset) -> np.ndarray:
    """EFI (init_time, lat, lon) of the raw ensemble against the model climate of each date (the members of
    the init dates in its ENS-10 climate window, :func:`postcast.pipeline.verify.scores.climate_window`); the
    quantiles are per point, so a band of latitudes at a time gives the same values. The members of each date
    in any of the windows are decoded once (the windows of ``ver``'s dates overlap), into ``.npy`` files of a
    temporary directory (TMPDIR; removed on return), and each band is read back from there."""
    times = store[schema.INIT_TIME].values
    mds = sorted(set(zip(pd.DatetimeIndex(times).month, pd.DatetimeIndex(times).day, strict=True)))
    windows = [np.flatnonzero(scores.climate_window(times, t, month_days=mds)) for t in ver[schema.INIT_TIME].values]
    out = np.empty(ver["truth"].shape)  # (T, lat, lon)
    with tempfile.TemporaryDirectory(prefix="postcast-efi-") as scratch:
        files = _decoded(store, ver, np.unique(np.concatenate([np.empty(0, int), *windows])), Path(scratch))
        for i, window in enumerate(windows):
            out[i] = _efi_of_date(ver["members"].values[i], [files[int(d)] for d in window])
    return out


def _decoded(store: xr.Dataset, ver: xr.Dataset, rows: np.ndarray, scratch: Path) -> dict[int, Path]:
    """The ``.npy`` file in ``scratch`` of the members (M, lat, lon) of ``ver``'s target at its lead of each
    init-time row of ``rows``, as the store gives them (float32; float64 for a derived target), read a group
    of dates at a time."""
    target, (n_members, n_lat, n_lon) = schema.target(ver.attrs["target"]), ver["members"].shape[1:]
    files = {}
    for group in _date_groups(rows.size, n_members * n_lat * n_lon * 4):
        sub = store.isel({schema.INIT_TIME: rows[group]})
        values = target_members(sub, target, ver.attrs["step_h"]).values  # (dates, M, lat, lon)
        for row, members in zip(rows[group], values, strict=True):
            files[int(row)] = scratch / f"{row}.npy"
            np.save(files[int(row)], members)
    return files


def _efi_of_date(members: np.ndarray, window: list[Path]) -> np.ndarray:
    """EFI (lat, lon) of one date's ``members`` (M, lat, lon) against the members of its ``window`` dates (their
    ``.npy`` files), a band of latitudes at a time: each band's float64 climate filled from the files (a date's
    file mapped only while its band is copied) and sorted in place for the quantiles."""
    n_members, n_lat, n_lon = members.shape
    out = np.empty((n_lat, n_lon))
    for band in _bands(n_lat, len(window) * n_members * n_lon * 8, EFI_TILE_BYTES):
        clim = np.empty((len(window), n_members, band.stop - band.start, n_lon))  # (n, M, band, lon) float64
        for k, path in enumerate(window):
            clim[k] = np.load(path, mmap_mode="r")[:, band]  # the memmap is dropped (unmapped) at once
        pooled = clim.reshape(-1, *clim.shape[2:])  # (n M, band, lon), a view
        pooled.sort(axis=0)  # in place: the quantiles' partitions of sorted columns are cheap (3x less in all)
        q = np.quantile(pooled, scores.EFI_LEVELS, axis=0, overwrite_input=True)
        out[band] = scores.efi(q, members[:, band])
    return out


def climate_thresholds(
    store: xr.Dataset, target: schema.Target, step_h: int, client: Any | None = None, store_path: str = ""
) -> dict[str, np.ndarray]:
    """Events of the tail scores and reliability diagrams, each a threshold (lat, lon): below the 10 % and above
    the 90 % quantile of the training-split truth at each grid point (none when the training split has no
    truth), and above the target's own thresholds (tp24: 1 and 10 mm; ws10: 10 and 20 m/s) everywhere. The
    quantiles are taken a latitude band at a time (:class:`ThresholdJob`): here, or on ``client``'s cluster from
    ``store_path``, so that the driver never holds the training truth."""
    tg = target
    shape = (store.sizes[schema.LAT], store.sizes[schema.LON])
    fixed = {e: np.full(shape, t) for e, t in zip(metrics.THRESHOLD_EVENTS, tg.thresholds, strict=False)}
    rows = contract.split_rows(store, "train", target=tg, step_h=step_h)
    if not rows.size:
        return fixed
    bands = tuple(_bands(shape[0], rows.size * shape[1] * 8, TILE_BYTES))
    job = ThresholdJob(store_path, tg, step_h, tuple(int(r) for r in rows), bands)
    if client is None:
        q = [job.quantiles(store, band) for band in bands]
    else:
        q = list(in_order(client, threshold_band, job, len(bands)))
    return dict(zip(metrics.QUANTILE_EVENTS, np.concatenate(q, axis=1), strict=True)) | fixed


@dataclass(frozen=True)
class ThresholdJob:
    """The training truth's 10 / 90 % quantiles of one target's lead, a latitude band per task."""

    store: str
    target: schema.Target
    step_h: int
    rows: tuple[int, ...]  # the training split's init-time rows
    bands: tuple[slice, ...]
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    def quantiles(self, store: xr.Dataset, band: slice) -> np.ndarray:
        """(2, band, lon): the 10 and 90 % quantiles over the training dates of each point of ``band``."""
        tg = self.target
        truth = step_field(store, contract.truth_name(tg.name), self.step_h, tg.level)
        n_lat, n_lon = truth.shape[-2:]
        y = np.empty((len(self.rows), band.stop - band.start, n_lon))  # (n, band, lon) float64
        for dates in _date_groups(len(self.rows), n_lat * n_lon * 4):
            y[dates] = truth.isel({schema.INIT_TIME: list(self.rows[dates]), schema.LAT: band}).values
        return np.nanquantile(y, [0.1, 0.9], axis=0, overwrite_input=True)


def threshold_band(job: ThresholdJob, k: int) -> np.ndarray:
    """The quantiles of the job's ``k``-th band, on a worker (the store opened once per job and process)."""
    if job.token not in _OPENED:
        share_store(job.token, contract.open_store(job.store))
    return job.quantiles(_OPENED[job.token], job.bands[k])


def chunks_of(ver: xr.Dataset, efi: np.ndarray, families: dict[str, FamilyForecast]) -> tuple[list[str], list[Chunk]]:
    """The names and chunks of every Gaussian of ``ver``, the ``families`` and the raw members (last)."""
    y = ver["truth"].values  # (T, lat, lon)
    names = [str(f) for f in ver["forecast"].values]
    chunks = [
        Chunk(y, efi, dist=GaussianForecast(ver["mu"].sel(forecast=f).values, ver["sigma"].sel(forecast=f).values))
        for f in names
    ]
    chunks += [Chunk(y, efi, dist=d) for d in families.values()]
    return [*names, *families, ENSEMBLE], [*chunks, Chunk(y, efi, members=ver["members"].values)]


@dataclass(frozen=True)
class LeadJob:
    """What every chunk of dates of one target's lead shares (sent once to each worker)."""

    store: str
    target: schema.Target
    split: str
    step_h: int
    n_dates: int
    arrays: tuple[str, ...]  # the store arrays read (a chunk that does not decode is named among them)
    checkpoints: tuple[tuple[str, OpenedCheckpoint], ...] = ()  # (display name, checkpoint) of those at this lead
    thresholds: dict[str, np.ndarray] = field(default_factory=dict)
    rank_skips: tuple[int, ...] = ()  # per task: the finite outcomes of the dates before it
    token: str = field(default_factory=lambda: uuid.uuid4().hex)  # the evaluation's: its store opened once

    @property
    def n_tasks(self) -> int:
        return -(-self.n_dates // DATES_PER_TASK)


_OPENED: dict[str, xr.Dataset] = {}  # the store of the evaluation running in this process, by its token


def share_store(token: str, store: xr.Dataset) -> None:
    """Let this process's tasks of the evaluation ``token`` read ``store`` (the driver's, already open)."""
    _OPENED.clear()
    _OPENED[token] = store


def _opened(job: LeadJob) -> xr.Dataset:
    if job.token not in _OPENED:
        share_store(job.token, contract.open_store(job.store))
    return _OPENED[job.token]


@contextlib.contextmanager
def chunk_named(store_path: str, names: list[str]) -> Iterator[None]:
    """A read inside xarray that fails (which names neither variable nor chunk) becomes the BadInputError
    naming the first chunk of ``names`` that does not decode; any other failure passes unchanged."""
    try:
        yield
    except PostcastError:
        raise
    except Exception as err:
        bad = reads.first_undecodable(store_path, names)
        if bad is None:
            raise
        raise bad from err


def score_dates(job: LeadJob, k: int) -> Part:
    """The part of the lead's ``k``-th chunk of DATES_PER_TASK dates: the raw Gaussian, the oracle, each
    checkpoint and the raw members on those dates."""
    start = k * DATES_PER_TASK
    dates = slice(start, min(start + DATES_PER_TASK, job.n_dates))
    store = _opened(job)
    with chunk_named(job.store, list(job.arrays)):
        ver = verification_dataset(store, job.target, job.split, step_h=job.step_h, dates=dates)
        families: dict[str, FamilyForecast] = {}
        for name, ckpt in job.checkpoints:
            times, dist = predict_opened(ckpt, job.store, store, job.split, DATES_PER_TASK, dates)
            if not np.array_equal(times, ver[schema.INIT_TIME].values):
                msg = f"{name}: predicted init times differ from the verification dates of {job.target.name}"
                raise BadInputError(msg)
            raw = [ver[k].sel(forecast=RAW).values for k in ("mu", "sigma")]
            check_finite(name, ckpt, dist, np.isfinite(raw[0]) & np.isfinite(raw[1]))
            if isinstance(dist, distributions.Gaussian):  # the closed forms of every release so far
                ver = add_forecast(ver, name, dist.mu.numpy(), dist.sigma.numpy())
            else:
                families[name] = FamilyForecast(dist)
                check_shape(ver, name, families[name].shape)
        names, chunks = chunks_of(ver, efi_fields(store, ver), oracle_forecast(ver) | families)
        lat, lon = ver[schema.LAT].values, ver[schema.LON].values
        skip = job.rank_skips[k] if job.rank_skips else 0
        return part_of(names, chunks, lat, lon, start=start, thresholds=job.thresholds, rank_skip=skip)


def rank_skips(store: xr.Dataset, job: LeadJob) -> tuple[int, ...]:
    """Per task: the finite outcomes of the lead's dates before it (where its rank tie-breaks go on)."""
    tg = job.target
    rows = contract.split_rows(store, job.split, target=tg, step_h=job.step_h)
    truth = step_field(store, contract.truth_name(tg.name), job.step_h, tg.level)
    counts = [
        int(np.isfinite(truth.isel({schema.INIT_TIME: rows[s : s + DATES_PER_TASK]}).values).sum())
        for s in range(0, rows.size, DATES_PER_TASK)
    ]
    return tuple(int(c) for c in np.cumsum([0, *counts[:-1]]))


def lead_parts(jobs: list[LeadJob], client: Any | None) -> Iterator[tuple[int, Part]]:
    """(j, part) for every part of every lead's job ``jobs[j]``: the leads in turn, each lead's parts in date
    order; computed here (``client`` None), or on the cluster as one pipeline through all the leads
    (:func:`in_order`), which stays full at a lead's end (a lead of one task kept one task in flight)."""
    index = tuple((j, k) for j, job in enumerate(jobs) for k in range(job.n_tasks))
    if client is None:
        return ((j, score_dates(jobs[j], k)) for j, k in index)
    return zip((j for j, _ in index), in_order(client, score_indexed, (tuple(jobs), index), len(index)), strict=True)


def score_indexed(shared: tuple[tuple[LeadJob, ...], tuple[tuple[int, int], ...]], i: int) -> Part:
    """The part of the ``i``-th (lead, chunk) of ``shared`` (the jobs, the (lead, chunk) pairs in order)."""
    jobs, index = shared
    j, k = index[i]
    return score_dates(jobs[j], k)
