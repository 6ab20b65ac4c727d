"""Evaluation: score the raw ensemble, trained post-processors and the oracle side by side.

Pure core: :func:`~postcast.pipeline.verify.forecasts.verification_dataset` gathers, for one target, lead and
split, the truth, the raw members and the Gaussian forecasts of every entry (dims ``forecast, init_time, latitude,
longitude``); a checkpoint of another predictive family (``model.distribution``) joins as a
:class:`FamilyForecast` beside it; :func:`score_lead` turns them into a results Dataset (metrics and regions of
:mod:`postcast.pipeline.verify.metrics`, significance of :mod:`postcast.pipeline.verify.significance`),
:func:`score_target` scores every lead with truth a chunk of dates at a time (:mod:`postcast.pipeline.verify.tasks`,
here or on a dask cluster; the sums of :mod:`postcast.pipeline.verify.accumulate`: memory that does not grow with
the dates) and stacks the leads, :func:`summary` is its JSON summary. Drivers:
:func:`evaluate` (checkpoints + store -> ``results.nc``, ``metrics.json`` and the report, see
:mod:`postcast.pipeline.verify.report`) and ``postcast evaluate``.

Conventions (docs/verification.md): CRPS and EECRPS unweighted (ENS-10) and area-weighted
(WeatherBench 2: sum_t sum_p w_p s_tp / (T sum_p w_p)); EFI from the forecasts' own model climate
(members of the init dates within the ENS-10 climate window); ``gap_closed`` = (CRPS_raw - CRPS) /
(CRPS_raw - CRPS_oracle); differences against the raw Gaussian tested per init date (Diebold-Mariano
with HAC variance, stationary bootstrap interval).

Bad inputs are one line each: a chunk of the target's arrays deleted after ingest (66) or of another
size (65) is named before scoring (:func:`postcast.datasets.reads.check_chunks`), one that does not
decode when the read fails (65); a checkpoint that does not fit the store (another grid or region,
inputs the store lacks, another ensemble size) names what differs (65: the two inputs disagree).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import contract, io, reads, schema
from postcast.datasets.core.cluster import client_for
from postcast.datasets.core.errors import BadInputError, ConfigError, MissingInputError
from postcast.pipeline.checkpoints import OpenedCheckpoint
from postcast.pipeline.verify import metrics, significance
from postcast.pipeline.verify.accumulate import Accumulator, part_of
from postcast.pipeline.verify.forecasts import (
    ENSEMBLE,
    ORACLE,
    RAW,
    FamilyForecast,
    baseline,
    check_fits,
    oracle_forecast,
)
from postcast.pipeline.verify.summary import summary
from postcast.pipeline.verify.tasks import (
    LeadJob,
    chunk_named,
    chunks_of,
    climate_thresholds,
    efi_fields,
    lead_parts,
    rank_skips,
)

__all__ = ["climate_thresholds", "efi_fields"]  # re-exported: where evaluation's callers find them

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalConfig:
    store: str
    checkpoints: tuple[str, ...] = ()
    targets: tuple[str, ...] | None = None  # None: the checkpoints' targets, else those the store has truth for
    split: str = "test"
    out: str = "reports/eval"
    bootstrap: int = 1000
    names: dict[str, str] = field(default_factory=dict)  # checkpoint path -> display name
    scheduler: str | None = None  # dask scheduler address or file (None: a LocalCluster, or this process)
    workers: int | None = None  # LocalCluster workers (0: this process; None: 2, or 0 for a small store)
    processes: bool = True  # the LocalCluster's workers as processes (False: threads of this process)

    def __post_init__(self) -> None:
        if self.split not in contract.SPLITS:
            msg = f"split {self.split!r}: use one of {list(contract.SPLITS)}"
            raise ConfigError(msg)
        if self.bootstrap < 1:
            msg = (
                f"--bootstrap {self.bootstrap}: the 95 % interval needs resamples: give a positive number "
                "(default 1000; a few hundred at least for a stable interval)"
            )
            raise ConfigError(msg)
        for t in self.targets or ():
            schema.target(t)  # ConfigError naming the targets
        if self.workers is not None and self.workers < 0:
            msg = f"--workers {self.workers}: give 0 (score in this process) or a positive number"
            raise ConfigError(msg)


# --- scoring: one lead -> a results Dataset (postcast.pipeline.verify.metrics) -------------------
def _significance(res: xr.Dataset, bootstrap: int) -> xr.Dataset:
    """Paired per-date CRPS differences of every forecast against the baseline (:func:`baseline`; the
    variable names say ``raw``), per region and weighting: mean, stationary-bootstrap 95 % interval,
    Diebold-Mariano p-value, significant."""
    crps = res["score_per_date"].sel(metric="crps")  # (forecast, region, weighting, init_time)
    out = np.full((4, *crps.shape[:-1]), np.nan)
    for idx in np.ndindex(*crps.shape[:-1]):
        ref = crps.sel(forecast=res.attrs["baseline"]).values[idx[1:]]
        p = significance.paired(crps.values[idx], ref, n=bootstrap)
        out[(slice(None), *idx)] = (p.mean, p.low, p.high, p.p_value)
    dims = crps.dims[:-1]
    return res.assign(
        crps_minus_raw=(dims, out[0]),
        crps_minus_raw_low=(dims, out[1]),
        crps_minus_raw_high=(dims, out[2]),
        dm_p_value=(dims, out[3]),
        significant=(dims, (out[3] < 1 - significance.LEVEL).astype(np.int8)),
    )


def score_lead(
    ver: xr.Dataset,
    efi: np.ndarray,
    *,
    thresholds: dict[str, np.ndarray] | None = None,
    bootstrap: int = 1000,
    families: dict[str, FamilyForecast] | None = None,
) -> xr.Dataset:
    """Every forecast of ``ver`` (all its dates in memory), then the ``families`` (name -> a checkpoint's
    non-Gaussian forecast on ``ver``'s dates), and the raw members as ``raw_ensemble``, on one lead: scores per
    metric, region and weighting, per-date scores, significance against the target's :func:`baseline`, the CRPS
    decomposition, CRPS maps, reliability, PIT and rank histograms. :func:`score_target` streams the same."""
    names, chunks = chunks_of(ver, efi, oracle_forecast(ver) | (families or {}))
    lat, lon = ver[schema.LAT].values, ver[schema.LON].values
    acc = Accumulator()
    acc.add(part_of(names, chunks, lat, lon, thresholds=thresholds))
    res = acc.finish(lat, lon, ver[schema.INIT_TIME].values, list(thresholds or {}))
    res.attrs["baseline"] = baseline(schema.target(ver.attrs["target"]))
    return _significance(res, bootstrap)


def score(ver: xr.Dataset, efi: np.ndarray, *, bootstrap: int = 1000) -> dict[str, Any]:
    """The JSON summary (:func:`summary`) of :func:`score_lead` on one lead."""
    return summary(score_lead(ver, efi, bootstrap=bootstrap))


# --- driver ----------------------------------------------------------------------------------
def _checkpoint_name(path: str, names: dict[str, str], taken: set[str]) -> str:
    """Display name: given, else the run directory (the one above ``lightning_logs``), else the file
    stem; made unique with a suffix."""
    p = Path(path).resolve()
    name = names.get(path)
    if name is None:
        parts = p.parts
        name = parts[parts.index("lightning_logs") - 1] if "lightning_logs" in parts[1:] else p.stem
    unique, i = name, 2
    while unique in taken or unique in (RAW, ORACLE, ENSEMBLE):
        unique, i = f"{name}_{i}", i + 1
    taken.add(unique)
    return unique


@dataclass(frozen=True)
class Entry:
    """A checkpoint as evaluation scores it: display name and the checkpoint, opened once."""

    name: str
    checkpoint: OpenedCheckpoint

    @property
    def lead(self) -> int:
        """The lead it predicts (h)."""
        return self.checkpoint.spec.step_h


def checkpoint_entries(
    cfg: EvalConfig, store: xr.Dataset, progress: Callable[[Iterable[Any]], Iterable[Any]] = iter
) -> dict[schema.Target, list[Entry]]:
    """Each checkpoint's target and entry, each checkpoint opened once (the one read of it in this process), after
    checking that it fits the store and is for one of ``cfg.targets`` when given (nothing predicted yet: each chunk
    of dates is predicted where it is scored)."""
    entries: dict[schema.Target, list[Entry]] = {}
    taken: dict[str, set[str]] = {}  # display names are unique per target
    for path in progress(cfg.checkpoints):
        ckpt = OpenedCheckpoint.open(path)
        check_fits(path, ckpt.model.meta, ckpt.spec, store)
        target = ckpt.spec.resolved_target
        if cfg.targets and target.name not in cfg.targets:
            given = ",".join(cfg.targets)
            msg = f"{path}: a checkpoint for {target.name}, but --targets is {given}; add {target.name} or drop it"
            raise ConfigError(msg)
        name = _checkpoint_name(path, cfg.names, taken.setdefault(target.name, set()))
        entries.setdefault(target, []).append(Entry(name, ckpt))
    return entries


def leads_with_truth(store: xr.Dataset, target: schema.Target, split: str) -> list[int]:
    """Every lead (h) of the store with truth for ``target`` on some date of ``split`` (and, for a derived
    target, every lead its inputs are read at: tp24 at +24 h needs +0 h)."""
    steps = [int(pd.Timedelta(s) / pd.Timedelta(hours=1)) for s in store[schema.STEP].values]
    offsets = [off for _, off in target.inputs]
    return [
        h
        for h in steps
        if all(h + off in steps for off in offsets) and contract.split_rows(store, split, target=target, step_h=h).size
    ]


def lead_job(
    store: xr.Dataset,
    store_path: str,
    target: schema.Target,
    split: str,
    h: int,
    entries: list[Entry],
    client: Any | None = None,
) -> LeadJob:
    """The job of one lead, after checking that each checkpoint at it predicts the lead's verification dates
    (its climate thresholds computed on ``client``'s cluster when given)."""
    rows = contract.split_rows(store, split, target=target, step_h=h)
    for e in entries:
        spec = e.checkpoint.spec
        if not np.array_equal(contract.split_rows(store, split, target=spec.resolved_target, step_h=h), rows):
            msg = f"{e.name}: predicted init times differ from the verification dates of {target.name} at +{h} h"
            raise BadInputError(msg)
    job = LeadJob(
        store_path,
        target,
        split,
        h,
        int(rows.size),
        tuple(target_arrays(store, target, store_path)),
        tuple((e.name, e.checkpoint) for e in entries),
        climate_thresholds(store, target, h, client, store_path),
    )
    return replace(job, rank_skips=rank_skips(store, job))


def score_target(
    store: xr.Dataset,
    target: schema.Target,
    split: str,
    entries: list[Entry],
    bootstrap: int,
    *,
    store_path: str,
    client: Any | None = None,
) -> xr.Dataset:
    """Results of ``target`` at every lead with truth (dim ``lead``, hours); models at their own lead. Each
    lead's dates are scored a chunk at a time (:mod:`postcast.pipeline.verify.tasks`), on ``client``'s
    cluster when given, and accumulated (:mod:`postcast.pipeline.verify.accumulate`)."""
    per_lead = []
    leads = leads_with_truth(store, target, split)
    if not leads:
        msg = f"no lead of {target.name} has truth in split {split!r}"
        raise MissingInputError(msg)
    for e in entries:  # a model's lead the store lacks: ConfigError naming the leads it holds
        contract.step_position(store.get_index(schema.STEP), e.lead)
    jobs = [lead_job(store, store_path, target, split, h, [e for e in entries if e.lead == h], client) for h in leads]
    oracle = [ORACLE] if any(n in store for n in contract.oracle_parameters(target).values()) else []
    for job in jobs:
        names = [RAW, *oracle, *(n for n, _ in job.checkpoints)]
        log.info("scoring %s +%d h: %s (%d dates)", target.name, job.step_h, ", ".join(names), job.n_dates)
    results = stream_leads(store, jobs, bootstrap, client)
    per_lead = [ds.expand_dims(lead=[job.step_h]) for job, ds in zip(jobs, results, strict=True)]
    out = xr.concat(per_lead, dim="lead", join="outer", data_vars="all", coords="different", compat="equals")
    out.attrs.update(target=target.name, units=target.units, split=split)
    return out


def stream_leads(store: xr.Dataset, jobs: list[LeadJob], bootstrap: int, client: Any | None) -> Iterator[xr.Dataset]:
    """Each lead's results, in the order of ``jobs``, from its parts in date order (one pipeline through every
    lead: :func:`lead_parts`), with the significance tests of its per-date scores; a lead is finished as soon as
    its last part is in."""
    done, acc = 0, Accumulator()
    for j, part in lead_parts(jobs, client):
        for _ in range(done, j):  # the leads before lead j are complete
            yield _finish_lead(store, jobs[done], acc, bootstrap)
            done, acc = done + 1, Accumulator()
        acc.add(part)
    for _ in range(done, len(jobs)):
        yield _finish_lead(store, jobs[done], acc, bootstrap)
        done, acc = done + 1, Accumulator()


def _finish_lead(store: xr.Dataset, job: LeadJob, acc: Accumulator, bootstrap: int) -> xr.Dataset:
    rows = contract.split_rows(store, job.split, target=job.target, step_h=job.step_h)
    lat, lon = store[schema.LAT].values, store[schema.LON].values
    res = acc.finish(lat, lon, store[schema.INIT_TIME].values[rows], list(job.thresholds))
    res.attrs["baseline"] = baseline(job.target)
    return _significance(res, bootstrap)


def results_dataset(per_target: dict[str, xr.Dataset]) -> xr.Dataset:
    """One Dataset over targets (dim ``target``; forecasts and dates joined, NaN where absent), with
    the units of each target and of each score (``metric_units``: the target's, or 1)."""
    parts = [ds.expand_dims(target=[t]) for t, ds in per_target.items()]
    out = xr.concat(parts, dim="target", join="outer", data_vars="all", coords="different", compat="equals")
    units = [ds.attrs["units"] for ds in per_target.values()]
    baselines = [ds.attrs["baseline"] for ds in per_target.values()]  # score_target's (the target's :func:`baseline`)
    out = out.assign_coords(
        units=("target", units),
        baseline=("target", baselines),
        metric_units=(("target", "metric"), [[u if m.units else "1" for m in metrics.METRICS] for u in units]),
    )
    out["lead"].attrs["units"] = "hours"
    out.attrs = {}
    out.attrs.update(
        title="postcast verification",
        conventions="docs/verification.md",
        split=next(iter(per_target.values())).attrs["split"],
    )
    return out


def headline_lead(res: xr.Dataset, entries: list[Entry]) -> int:
    """The lead the summary and scorecard show: the models' lead, else the target lead (48 h)."""
    leads = [int(x) for x in res["lead"].values]
    for e in entries:
        if e.lead in leads:
            return e.lead
    return schema.TARGET_STEP_H if schema.TARGET_STEP_H in leads else leads[-1]


def _target_summary(res: xr.Dataset, lead: int, target: schema.Target) -> dict[str, Any]:
    one = (
        res.sel(lead=lead)
        .dropna("forecast", how="all", subset=["score"])
        .dropna("init_time", how="all", subset=["score_per_date"])
    )
    out = summary(one)
    out.update(
        units=res.attrs["units"],
        lead_h=lead,
        n_dates=int(one.sizes[schema.INIT_TIME]),
        latitude=res[schema.LAT].values.tolist(),
        longitude=res[schema.LON].values.tolist(),
        baseline=res.attrs["baseline"],
        thresholds=dict(zip(metrics.THRESHOLD_EVENTS, target.thresholds, strict=False)),
    )
    crps = res["score"].sel(metric="crps", region="global")
    out["leads"] = {
        int(h): {
            str(f): {w: float(crps.sel(lead=h, forecast=f, weighting=w)) for w in ("none", "area")}
            for f in res["forecast"].values
            if np.isfinite(crps.sel(lead=h, forecast=f)).all()
        }
        for h in res["lead"].values
    }
    return out


def write_results(ds: xr.Dataset, out: Path) -> Path:
    """``results.nc`` (atomic) in ``out``."""
    path = out / "results.nc"
    io.write_netcdf(ds, path, compress=False)
    return path


def target_arrays(store: xr.Dataset, target: schema.Target, store_path: str) -> list[str]:
    """The store arrays scoring ``target`` reads (members, or the members it is derived from; ensemble mean and
    std of a variable target; truth; the oracle's parameters when there)."""
    names, missing = _target_names(store, target)
    if missing:
        msg = f"{store_path} has no {', '.join(missing)}: cannot score {target.name}; evaluate other --targets"
        raise MissingInputError(msg, missing=missing)
    return names + [n for n in contract.oracle_parameters(target).values() if n in store]


def _target_names(store: xr.Dataset, tg: schema.Target) -> tuple[list[str], list[str]]:
    """The arrays scoring ``tg`` reads, and what of them the store lacks (an array, or the target's pressure
    level: "z at 500 hPa (its levels: 850)")."""
    stats = [] if tg.derived else [contract.ens_mean(tg.variable), contract.ens_std(tg.variable)]
    names = [*tg.input_variables, *stats, contract.truth_name(tg.name)]
    missing = [n for n in names if n not in store]
    if tg.level is not None and tg.variable in store and schema.LEVEL in store[tg.variable].dims:
        levels = [int(v) for v in store[schema.LEVEL].values]
        if tg.level not in levels:
            missing.append(f"{tg.variable} at {tg.level} hPa (its levels: {', '.join(map(str, levels))})")
    return names, missing


def default_targets(store: xr.Dataset) -> list[schema.Target]:
    """The targets of a store scored when neither checkpoints nor --targets name any: those it holds truth
    and every input (the pressure level included) for."""
    return [t for t in schema.TARGETS.values() if not _target_names(store, t)[1]]


SMALL_STORE_VALUES = 20_000_000  # member values (dates x members x points) scored in this process by default


@contextlib.contextmanager
def cluster_for(cfg: EvalConfig, store: xr.Dataset) -> Iterator[Any | None]:
    """The dask client the dates are scored on: the scheduler given, else a LocalCluster of ``workers``
    (default 2, or none for a store of at most SMALL_STORE_VALUES member values); None: this process."""
    values = (
        store.sizes[schema.INIT_TIME] * store.sizes[schema.MEMBER] * store.sizes[schema.LAT] * store.sizes[schema.LON]
    )
    workers = cfg.workers if cfg.workers is not None else (0 if values <= SMALL_STORE_VALUES else 2)
    with client_for(cfg.scheduler, workers, cfg.processes) as client:
        yield client


def evaluate(cfg: EvalConfig, progress: Callable[[Iterable[Any]], Iterable[Any]] = iter) -> dict[str, Any]:
    """Score every checkpoint plus raw ensemble and oracle at every lead with truth; writes
    ``results.nc`` (the results Dataset), ``metrics.json`` (its summary) and the report."""
    from postcast.pipeline.verify import report

    store = contract.open_store(cfg.store)  # the one open of this evaluation: read below and by every checkpoint
    entries = checkpoint_entries(cfg, store, progress)
    targets = [schema.target(t) for t in cfg.targets] if cfg.targets else list(entries) or default_targets(store)
    per_target: dict[str, xr.Dataset] = {}
    with cluster_for(cfg, store) as client:
        for tg in targets:
            names = target_arrays(store, tg, cfg.store)
            reads.check_chunks(cfg.store, names, range(store.sizes[schema.INIT_TIME]))
            with chunk_named(cfg.store, names):
                per_target[tg.name] = score_target(
                    store, tg, cfg.split, entries.get(tg, []), cfg.bootstrap, store_path=cfg.store, client=client
                )
    results: dict[str, Any] = {
        "store": cfg.store,
        "split": cfg.split,
        "results": "results.nc",
        "targets": {
            tg.name: _target_summary(per_target[tg.name], headline_lead(per_target[tg.name], entries.get(tg, [])), tg)
            for tg in targets
        },
    }
    for tg, es in entries.items():  # each checkpoint's family beside its scores
        for e in es:
            if tg.name in results["targets"] and e.name in results["targets"][tg.name]["forecasts"]:
                results["targets"][tg.name]["forecasts"][e.name]["global"]["distribution"] = e.checkpoint.family
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    ds = results_dataset(per_target)
    write_results(ds, out)
    io.write_json(out / "metrics.json", results)
    report.write_report(ds, results, out)
    return results
