"""Ingestion: raw ENS-10 forecasts (+ ERA5-like truth) -> the canonical training store (zarr 3).

Layout of the store (see docs/store.md for the reasoning):

* member fields ``z, t, q, w, d, u, v`` (init_time, member, step, level, latitude, longitude) and
  ``sst .. skt`` (init_time, member, step, latitude, longitude), float32, one chunk per
  (init time, step, level, variable) holding all members and the whole grid (10 MB at 0.5 deg);
  on coarse grids levels and steps join the chunk while it stays under ~4 MB;
* per-sample ensemble statistics ``ens_mean_F`` / ``ens_std_F`` (population std, ddof 0), chunked
  the same way without the member axis;
* ``truth_<target>`` and, for synthetic data, ``oracle_mean_<target>`` / ``oracle_std_<target>``,
  (init_time, step, latitude, longitude), one chunk per init time;
* coordinate ``split`` (train/val/test/none) per init time; group ``statistics`` (training years
  only); attributes: format version, plan, provenance (sources, SHA-256, code version), completeness.

Execution: a dask.distributed cluster (a local one by default, an existing one with
``scheduler=ADDRESS`` or ``scheduler=SCHEDULER_FILE``) runs one task per init date (or a few dates on
coarse grids), each writing whole chunks and returning the partial statistics of its training dates;
the partials are merged on the workers as tasks finish and the statistics group is written from them,
without reading the store back. Progress (dates, MB/s, ETA) goes to the log and the bar.
Crash safety: the store is built at ``OUT.partial/store.zarr`` with one marker file per finished
date under ``OUT.partial/done/``; every ``checkpoint_dates`` training dates the merged partial statistics
are saved to ``OUT.partial/stats/merged.npz`` with the dates they cover. A rerun with the same settings
resumes: it reads back from the store only the training dates finished after the last checkpoint; only a
finished store is renamed to ``OUT``, so a store at ``OUT`` is always complete.
"""

from __future__ import annotations

import collections
import datetime as dt
import functools
import hashlib
import json
import logging
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr

import postcast
from postcast.datasets import config, grib, integrity, io, schema, sources, statistics
from postcast.datasets import store as contract
from postcast.datasets.errors import ConfigError, MissingInputError

log = logging.getLogger(__name__)


STATISTICS_MODES = ("auto", "one-pass", "two-pass")


@config.register("ingest")
@dataclass(frozen=True)
class IngestConfig:
    """Options of ``postcast ingest`` (YAML preset: configs/ingest/default.yaml; a preset may leave
    ``source`` and ``out`` to the command line)."""

    source: str = ""  # forecasts: a directory written by `postcast synth`, GRIB/netCDF files or a zarr store
    out: str = ""  # the store to write
    truth: str | None = None  # ERA5-like truth; default: era5.zarr / era5/*.nc next to the forecasts
    variables: tuple[str, ...] | None = None  # required forecast variables; None: the ENS-10 ones the source has
    levels: tuple[int, ...] | None = None  # None: the levels the source holds
    members: str | int = "all"  # all | a count N | an inclusive range A:B (0:9)
    steps: tuple[int, ...] | None = None  # lead times in hours; None: the steps the source holds
    grid: float | None = None  # store resolution (deg); None: the source's regular global grid (or the closest)
    regrid_method: str = "bilinear"  # bilinear | nearest | conservative, when the source is on another grid
    splits: schema.Splits = field(default_factory=schema.Splits)
    scheduler: str | None = None  # dask.distributed address or scheduler file (JSON); None: start a LocalCluster
    workers: int = 2  # LocalCluster workers
    processes: bool = True  # LocalCluster of processes (False: threads in this process, for tests/debugging)
    dates_per_task: int | None = None  # init dates per dask task; None: about 64 MB of member data (1 at 0.5 deg)
    checkpoint_dates: int = 16  # save the merged partial statistics every this many training dates
    statistics: str = "auto"  # one-pass | two-pass | auto (one-pass while it fits the budget below)
    one_pass_max_gb: float | None = None  # auto: GB one-pass may use per worker; None: 60% of a worker's memory
    overwrite: bool = False  # rebuild a complete store
    restart: bool = False  # discard an interrupted ingest with other settings
    progress: bool = True

    def __post_init__(self) -> None:
        try:
            self.expectation  # noqa: B018  (validates)
        except ValueError as err:
            raise ConfigError(str(err)) from err
        if self.workers < 1:
            msg = f"workers={self.workers}: need at least 1"
            raise ConfigError(msg)
        if self.checkpoint_dates < 1:
            msg = f"checkpoint_dates={self.checkpoint_dates}: need at least 1"
            raise ConfigError(msg)
        if self.statistics not in STATISTICS_MODES:
            msg = f"statistics={self.statistics!r}: use one of {', '.join(STATISTICS_MODES)}"
            raise ConfigError(msg)
        if self.one_pass_max_gb is not None and self.one_pass_max_gb <= 0:
            msg = f"one_pass_max_gb={self.one_pass_max_gb}: need a positive size in GB (or leave it unset: automatic)"
            raise ConfigError(msg)
        if self.dates_per_task is not None and self.dates_per_task < 1:
            msg = f"dates_per_task={self.dates_per_task}: need at least 1 (or leave it unset: automatic)"
            raise ConfigError(msg)

    @property
    def expectation(self) -> sources.Expectation:
        return sources.Expectation(self.variables, self.levels, self.members, self.steps, self.grid,
                                   self.regrid_method)

    def fingerprint(self) -> str:
        """Hash of everything that determines the store's content (not how it is computed)."""
        keep = {k: v for k, v in asdict(self).items()
                if k not in ("scheduler", "workers", "processes", "dates_per_task", "checkpoint_dates",
                             "statistics", "one_pass_max_gb", "overwrite", "restart", "progress", "out")}
        keep["source"] = str(Path(self.source).resolve())
        return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class IngestResult:
    store: Path
    skipped: bool
    n_dates: int
    n_written: int
    seconds: float
    bytes_read: int = 0


# --- layout --------------------------------------------------------------------------------------
def _chunks(plan: sources.Plan) -> dict[str, tuple[int, ...]]:
    """Chunk shapes: one init date per chunk (whole-chunk region writes), all members and the whole
    grid; levels, then steps, merged in while a chunk stays under ~4 MB (coarse grids)."""
    ny, nx = plan.grid.shape
    nm, ns, nl = len(plan.members), len(plan.steps_h), len(plan.levels)
    out: dict[str, tuple[int, ...]] = {}
    grow = (schema.LEVEL, schema.STEP)
    for v in plan.variables:
        pl = schema.VARIABLES[v].level_type is schema.LevelType.PRESSURE
        dims = schema.PL_DIMS if pl else schema.SFC_DIMS
        shape = (1, nm, ns, nl, ny, nx) if pl else (1, nm, ns, ny, nx)
        out[v] = io.chunk_shape(dims, shape, whole=(schema.MEMBER, schema.LAT, schema.LON), grow=grow)
        edims = tuple(d for d in dims if d != schema.MEMBER)
        eshape = tuple(n for d, n in zip(dims, shape, strict=True) if d != schema.MEMBER)
        out[contract.ens_mean(v)] = out[contract.ens_std(v)] = io.chunk_shape(
            edims, eshape, whole=(schema.LAT, schema.LON), grow=grow)
    for t in schema.TARGETS:
        for name in (contract.truth_name(t), contract.oracle_mean(t), contract.oracle_std(t)):
            out[name] = (1, ns, ny, nx)
    return out


def template(plan: sources.Plan, *, truth: list[str], oracle: list[str], splits: schema.Splits) -> xr.Dataset:
    """The empty store: every variable as lazy NaNs with the store's chunking (metadata only)."""
    n_t, nm, ns, nl = len(plan.init_times), len(plan.members), len(plan.steps_h), len(plan.levels)
    ny, nx = plan.grid.shape
    chunks = _chunks(plan)
    times = pd.DatetimeIndex(plan.init_times)
    steps = pd.to_timedelta(list(plan.steps_h), unit="h")
    coords: dict[str, Any] = {
        schema.INIT_TIME: times, schema.MEMBER: np.array(plan.members), schema.STEP: steps,
        schema.LEVEL: (schema.LEVEL, np.array(plan.levels, dtype=np.int64), {"units": "hPa"}),
        schema.LAT: (schema.LAT, plan.grid.latitudes(), {"units": "degrees_north", "standard_name": "latitude"}),
        schema.LON: (schema.LON, plan.grid.longitudes(), {"units": "degrees_east", "standard_name": "longitude"}),
        schema.VALID_TIME: ((schema.INIT_TIME, schema.STEP), times.values[:, None] + steps.values[None, :]),
        contract.SPLIT: (schema.INIT_TIME, np.array([contract.split_code(splits.split_of(t.year)) for t in times],
                                                    dtype=np.int8),
                         {"long_name": "data split of the init time",
                          "flag_values": sorted(contract.SPLIT_CODES.values()),
                          "flag_meanings": contract.SPLIT_FLAG_MEANINGS}),
    }
    data: dict[str, xr.Variable] = {}

    def empty(shape: tuple[int, ...], name: str) -> da.Array:
        return da.full(shape, np.nan, dtype=np.float32, chunks=chunks[name])

    for v in plan.variables:
        var = schema.VARIABLES[v]
        attrs = schema.cf_attrs(var)
        shape: tuple[int, ...]
        dims: tuple[str, ...]
        if var.level_type is schema.LevelType.PRESSURE:
            dims, shape = schema.PL_DIMS, (n_t, nm, ns, nl, ny, nx)
        else:
            dims, shape = schema.SFC_DIMS, (n_t, nm, ns, ny, nx)
        edims = tuple(d for d in dims if d != schema.MEMBER)
        eshape = tuple(s for d, s in zip(dims, shape, strict=True) if d != schema.MEMBER)
        data[v] = xr.Variable(dims, empty(shape, v), attrs)
        data[contract.ens_mean(v)] = xr.Variable(edims, empty(eshape, contract.ens_mean(v)),
                                            {**attrs, "long_name": f"ensemble mean of {var.long_name}"})
        data[contract.ens_std(v)] = xr.Variable(edims, empty(eshape, contract.ens_std(v)),
                                           {**attrs, "long_name": f"ensemble std (ddof=0) of {var.long_name}"})
    tdims = (schema.INIT_TIME, schema.STEP, schema.LAT, schema.LON)
    for name in [*truth, *oracle]:
        target = name.split("_")[-1]
        data[name] = xr.Variable(tdims, empty((n_t, ns, ny, nx), name),
                                 {"units": schema.TARGETS[target].units, "target": target})
    return xr.Dataset(data, coords=coords)


# --- the per-date task (runs on dask workers) ----------------------------------------------------
def ensemble_statistics(ds: xr.Dataset) -> xr.Dataset:
    """Per-sample ensemble mean and population std (ddof 0) of every member field, accumulated in float64
    and stored as float32 (numpy or dask). Ingest computes the same bits in one sweep with the training
    partials (:func:`statistics.ensemble_moments`), so a model sees at forecast time what it trained on."""
    out = {}
    for name, x in ds.data_vars.items():
        # skipna=False: missing SST is missing in every member, and NaN-aware reductions are slow
        out[contract.ens_mean(str(name))] = x.mean(schema.MEMBER, skipna=False, dtype=np.float64).astype(np.float32)
        out[contract.ens_std(str(name))] = x.std(schema.MEMBER, ddof=0, skipna=False,
                                                 dtype=np.float64).astype(np.float32)
    return xr.Dataset(out)


def ingest_dates(forecast: sources.ForecastSource, truth: sources.TruthSource | None,
                 oracle: sources.TruthSource | None, plan: sources.Plan, indices: list[int], store: str,
                 done_dir: str, train: frozenset[int] = frozenset()) -> statistics.FieldPartials | None:
    """Load, check and write consecutive init dates ``indices`` with one region write (whole chunks), then
    mark each done (the marker holds the checksums of the date's chunk files). Returns the merged partial
    statistics of this batch's training dates (in ``train``; None: none of them), computed from the values
    in hand in the same sweep as the ensemble statistics."""
    keep_freed_memory()
    loaded = [_load_date(forecast, truth, oracle, plan, i, partials=i in train) for i in indices]
    parts = [day for day, _ in loaded]
    full = xr.concat(parts, dim=schema.INIT_TIME) if len(parts) > 1 else parts[0]
    io.write_region(full, store, {schema.INIT_TIME: slice(indices[0], indices[-1] + 1)})
    merged: statistics.FieldPartials | None = None
    arrays = [str(n) for n in full.data_vars]
    for i, (_, mine) in zip(indices, loaded, strict=True):
        merged = statistics.combine_fields(merged, mine)
        chunks = integrity.date_chunks(store, arrays, i)  # hashed now, while in the page cache
        io.write_json(Path(done_dir) / _stamp(plan.init_times[i]), {"chunks": chunks})
    return merged


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
KEEP_FREED_BYTES = 1 << 30  # free heap memory a worker keeps for the next temporaries
MMAP_ABOVE_BYTES = 32 << 20  # blocks larger than this are mapped and unmapped (glibc's largest threshold)


@functools.cache  # once per process (finding libc can run ldconfig)
def keep_freed_memory() -> bool:
    """Let this process reuse freed memory for its next temporaries instead of handing it back to the
    kernel. dask starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which also freezes glibc's mmap
    threshold at 128 kB: every float64 temporary of a slice (a few MB) is then a fresh mapping whose pages
    the kernel faults in and zeroes again, a third of an ingest's CPU time on a virtual machine
    (docs/ingest.md). Blocks up to 32 MB now come from the heap, which keeps up to 1 GB free; larger
    blocks (a date's member array) are still returned at once. No-op (False) outside glibc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_ABOVE_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES))


def _load_date(forecast: sources.ForecastSource, truth: sources.TruthSource | None,
               oracle: sources.TruthSource | None, plan: sources.Plan, i: int, *, partials: bool = False,
               ) -> tuple[xr.Dataset, statistics.FieldPartials | None]:
    """One init date as the store holds it (members, their ensemble statistics, truth and oracle) and, with
    ``partials``, the partial statistics of its fields (from the float32 values the store gets)."""
    t = plan.init_times[i]
    ds = forecast.load(t, plan)
    ens: dict[str, xr.Variable] = {}
    parts: statistics.FieldPartials = {}
    for name, x in ds.data_vars.items():
        name = str(name)
        if x.dims[1] != schema.MEMBER or x.dims[-2:] != (schema.LAT, schema.LON):
            msg = f"{name}: dims {x.dims}, expected (init_time, member, ..., latitude, longitude)"
            raise AssertionError(msg)
        mean, std, p = statistics.ensemble_moments(np.asarray(x.values, dtype=np.float32), with_partial=partials)
        dims = tuple(d for d in x.dims if d != schema.MEMBER)
        ens[contract.ens_mean(name)] = xr.Variable(dims, mean)
        ens[contract.ens_std(name)] = xr.Variable(dims, std)
        if p is not None:
            parts |= {name: p, contract.ens_mean(name): statistics.value_partial(mean),
                      contract.ens_std(name): statistics.value_partial(std)}
    pieces = [ds, xr.Dataset(ens)]
    pieces += [extra.load(t, plan) for extra in (truth, oracle) if extra is not None]
    day = xr.merge(pieces, compat="override", join="override")
    if partials:
        parts |= statistics.date_partials(day[[n for n in statistics.statistic_fields(day) if n not in parts]])
    return day, parts if partials else None


def stored_partials(store: str, index: int) -> statistics.FieldPartials:
    """The partial statistics of init date ``index`` read back from the store: a resumed ingest's training
    dates finished after its last checkpoint of merged partials (the same float32 values, the same
    partials as the task that wrote them computed)."""
    ds = io.open_zarr(store)
    day = ds[statistics.statistic_fields(ds)].isel({schema.INIT_TIME: [index]}).load(scheduler="synchronous")
    return statistics.date_partials(day)


def _stamp(t: Any) -> str:
    """The name of an init date's done-marker (and of its partial statistics, with .npz)."""
    return f"{pd.Timestamp(t):%Y%m%dT%H}"


def date_bytes(plan: sources.Plan) -> int:
    """Decoded bytes of member fields per init date (float32): what MB/s counts."""
    ny, nx = plan.grid.shape
    n_fields = sum(len(plan.levels) if schema.VARIABLES[v].level_type is schema.LevelType.PRESSURE else 1
                   for v in plan.variables)
    return 4 * ny * nx * len(plan.members) * len(plan.steps_h) * n_fields


def batches(todo: list[int], size: int) -> list[list[int]]:
    """Split sorted indices into runs of consecutive indices of at most ``size``."""
    out: list[list[int]] = []
    for i in todo:
        if out and out[-1][-1] == i - 1 and len(out[-1]) < size:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def batch_size(plan: sources.Plan, target_bytes: int = 64 * 2**20) -> int:
    """Dates per task: about ``target_bytes`` of member data (1 date per task at 0.5 deg)."""
    return max(1, min(16, target_bytes // max(date_bytes(plan), 1)))


# --- driver --------------------------------------------------------------------------------------
@contextmanager
def dask_client(scheduler: str | None, workers: int, processes: bool = True, *,
                connect_timeout: float = 10.0) -> Iterator[Any]:
    """A dask.distributed client: the scheduler at an address (``tcp://HOST:PORT``) or named by a
    scheduler file (the JSON that ``dask scheduler --scheduler-file F``, dask-jobqueue and dask-mpi
    write), or a LocalCluster of worker processes. A missing or unreadable scheduler file, or a
    scheduler that does not answer within ``connect_timeout`` seconds, is a MissingInputError (66)."""
    from dask.distributed import Client, LocalCluster

    for name in ("distributed", "distributed.scheduler", "distributed.nanny", "distributed.core"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
    if scheduler:
        address = scheduler if is_address(scheduler) else scheduler_file_address(scheduler)
        try:
            client = Client(address, timeout=connect_timeout)
        except (OSError, TimeoutError) as err:
            named = address if address == scheduler else f"{address} (from {scheduler})"
            msg = (f"no dask scheduler answers at {named} within {connect_timeout:g} s: start it (dask scheduler "
                   "--scheduler-file F) or pass the address of a running one with --scheduler")
            raise MissingInputError(msg) from err
        try:
            yield client
        finally:
            client.close()
        return
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=processes, dashboard_address=None,
                      memory_limit=0, silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        quiet_task_failures()  # this process (thread workers): a failed task is reported once, by the driver
        if processes:  # and our own worker processes
            client.run(quiet_task_failures)
        yield client


class _NoTaskFailureReports(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Compute Failed")


def quiet_task_failures() -> None:
    """Drop distributed's multi-line "Compute Failed ... Traceback" report in a worker process: the
    driver re-raises the task's error and reports it as one line."""
    worker_log = logging.getLogger("distributed.worker")
    if not any(isinstance(f, _NoTaskFailureReports) for f in worker_log.filters):
        worker_log.addFilter(_NoTaskFailureReports())


def is_address(scheduler: str) -> bool:
    """``tcp://HOST:PORT`` (any protocol) or ``HOST:PORT`` is an address; anything else a scheduler file."""
    return "://" in scheduler or re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[\w.-]+):\d+", scheduler) is not None


def scheduler_file_address(path: str) -> str:
    """The scheduler address in a dask scheduler file (JSON with an ``address``)."""
    fix = f"start the scheduler with `dask scheduler --scheduler-file {path}` or pass its address tcp://HOST:PORT"
    try:
        text = Path(path).read_text()
    except FileNotFoundError as err:
        msg = f"scheduler file {path} not found: {fix}"
        raise MissingInputError(msg) from err
    except (OSError, UnicodeDecodeError) as err:
        msg = f"scheduler file {path} cannot be read ({err.__class__.__name__}): {fix}"
        raise MissingInputError(msg) from err
    try:
        address = json.loads(text).get("address")
    except (ValueError, AttributeError):
        address = None
    if not isinstance(address, str) or not address:
        msg = (f"scheduler file {path} holds no scheduler address (JSON with \"address\", as `dask scheduler "
               f"--scheduler-file {path}` writes it; empty while the scheduler starts): {fix}")
        raise MissingInputError(msg)
    return address


def _code_version() -> str:
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{postcast.__version__}+g{sha}" if sha else postcast.__version__


def _checksum(path: str) -> str:
    p = Path(path)
    if p.is_dir():  # zarr store: hash the metadata and chunk sizes (cheap, detects changes)
        h = hashlib.sha256()
        for q in sorted(p.rglob("*")):
            if q.is_file():
                h.update(f"{q.relative_to(p)}:{q.stat().st_size}".encode())
                if q.name == "zarr.json":
                    h.update(q.read_bytes())
        return "tree-sha256:" + h.hexdigest()
    return "sha256:" + io.sha256_file(p)


class Progress:
    """Progress of a long ingest: dates done of the total, MB/s of decoded member data written (10^6
    bytes, this run only) and an ETA from that rate. A log line (INFO) every ``every_dates`` dates
    (default: a tenth of the run) or ``every_s`` seconds, whichever comes first, and at the end."""

    def __init__(self, total: int, done: int, bytes_per_date: int, *, every_s: float = 10.0,
                 every_dates: int | None = None, clock: Any = time.monotonic) -> None:
        self.total, self.done, self._first = total, done, done
        self.bytes_per_date, self.every_s = bytes_per_date, every_s
        self.every_dates = every_dates or max(1, (total - done) // 10)
        self._clock = clock
        self._t0 = self._last_t = clock()
        self._last_done = done

    def rate(self) -> float:
        """MB/s of decoded member data written so far in this run."""
        seconds = max(self._clock() - self._t0, 1e-9)
        return (self.done - self._first) * self.bytes_per_date / 1e6 / seconds

    def eta(self) -> float | None:
        """Seconds left at this run's pace (None before the first date of this run)."""
        if self.done <= self._first:
            return None
        per_date = (self._clock() - self._t0) / (self.done - self._first)
        return per_date * (self.total - self.done)

    def line(self) -> str:
        eta = self.eta()
        left = "?" if eta is None else str(dt.timedelta(seconds=round(eta)))
        pct = 100.0 * self.done / max(self.total, 1)
        return f"ingest: {self.done}/{self.total} dates ({pct:.0f}%), {self.rate():.1f} MB/s, ETA {left}"

    def update(self, n: int) -> None:
        """``n`` more dates are done: log a line when due."""
        self.done += n
        now = self._clock()
        if (self.done >= self.total or now - self._last_t >= self.every_s
                or self.done - self._last_done >= self.every_dates):
            log.info("%s", self.line())
            self._last_t, self._last_done = now, self.done


def _progress(futures: list[Any], weights: list[int], enabled: bool, desc: str,
              meter: Progress) -> Iterator[tuple[Any, int]]:
    """Yield (future, weight) as futures complete, with a tqdm bar counting weights (dates) and showing
    MB/s, and ``meter``'s log lines. Empties ``futures``, so that each result is held only until merged."""
    from dask.distributed import as_completed
    from tqdm import tqdm

    weight = {f.key: w for f, w in zip(futures, weights, strict=True)}
    pending = as_completed(futures)
    futures.clear()
    with tqdm(total=meter.total, initial=meter.done, desc=desc, unit="date", disable=not enabled,
              mininterval=1.0) as bar:
        for fut in pending:
            n = weight.pop(fut.key)
            yield fut, n
            meter.update(n)
            bar.set_postfix_str(f"{meter.rate():.1f} MB/s", refresh=False)
            bar.update(n)


def ingest(cfg: IngestConfig) -> IngestResult:
    """Run the whole ingestion (see the module docstring); idempotent and resumable."""
    missing = [n for n in ("source", "out") if not getattr(cfg, n)]
    if missing:
        msg = f"ingest needs {' and '.join(missing)}: pass SOURCE and --out (or set them in the preset)"
        raise ConfigError(msg)
    start = time.perf_counter()
    out = Path(cfg.out)
    partial = contract.partial_path(out)
    if out.exists() and not cfg.overwrite:
        if contract.is_complete(out):
            log.info("%s is already complete: nothing to do (use --overwrite to rebuild)", out)
            io.remove(partial)
            return IngestResult(out, True, 0, 0, time.perf_counter() - start)
        msg = f"{out} exists but is not a complete postcast store; remove it or pass --overwrite"
        raise ConfigError(msg)
    found = sources.discover(cfg.source, truth=cfg.truth)
    with dask_client(cfg.scheduler, cfg.workers, cfg.processes) as client:
        if isinstance(found.forecast, sources.GribSource):
            log.info("indexing %d GRIB files", len(found.forecast.files))
            found.forecast.set_index(client.gather(client.map(grib.index_file, found.forecast.files)))
        try:
            plan = found.forecast.plan(cfg.expectation)
        except MissingInputError as err:
            report = contract.missing_report_path(out)
            io.write_json(report, {"source": cfg.source, "missing": err.missing})
            log.error("completeness report written to %s", report)
            raise
        truth_vars = found.truth.variables() if found.truth else []
        oracle_vars = found.oracle.variables() if found.oracle else []
        store, done_dir = _prepare(cfg, plan, partial, truth_vars, oracle_vars)
        train = frozenset(np.flatnonzero(cfg.splits.mask(pd.DatetimeIndex(plan.init_times), "train")).tolist())
        one_pass = _one_pass(cfg, plan, worker_memory_gb(client))
        todo, prior, covered = _resume_state(plan, done_dir, partial / STATS_DIR, train if one_pass else frozenset())
        log.info("%d of %d init dates to ingest (%d already done)", len(todo), len(plan.init_times),
                 len(plan.init_times) - len(todo))
        t_dates = time.perf_counter()
        kept = train if one_pass else frozenset()
        submitted = _submit_dates(client, cfg, found, plan, todo, store, done_dir, kept)
        sums = _source_checksums(client, plan, found)  # on the workers, after the dates (lower priority)
        merged = _run_tasks(client, cfg, plan, todo, submitted, store, kept, prior, covered,
                            (lambda: statistics_template(store)) if train and one_pass else None)
        t_written = time.perf_counter()
        _statistics(client, cfg, plan, store, sorted(train), one_pass, merged)
        del merged
        t_stats = time.perf_counter()
        _finalise(cfg, plan, store, found, truth_vars, dict(zip(sums[0], client.gather(sums[1]), strict=True)),
                  _written_chunks(done_dir))
        log.info("dates written in %.1f s; statistics group %.1f s; checksums and metadata %.1f s",
                 t_written - t_dates, t_stats - t_written, time.perf_counter() - t_stats)
    io.replace(store, out)
    io.remove(partial)
    log.info("wrote %s (%d init dates)", out, len(plan.init_times))
    return IngestResult(out, False, len(plan.init_times), len(todo), time.perf_counter() - start,
                        len(todo) * date_bytes(plan))


STATS_DIR = "stats"  # OUT.partial/stats/merged.npz: the merged partials of the training dates it lists
MERGED = "merged.npz"
MERGE_PRIORITY = 10  # dask task priority of merges and checkpoints (date tasks: 0)


def _resume_state(plan: sources.Plan, done_dir: Path, stats_dir: Path,
                  train: frozenset[int]) -> tuple[list[int], list[int], list[str]]:
    """(indices of the dates to ingest, indices of the training dates done but not in merged.npz, whose
    partials are read back from the store, the dates merged.npz covers)."""
    done = {p.name for p in done_dir.iterdir()}
    merged = stats_dir / MERGED
    covered = set(statistics.partial_dates(merged)) if merged.exists() else set()
    todo, prior = [], []
    for i, t in enumerate(plan.init_times):
        stamp = _stamp(t)
        if stamp not in done:
            todo.append(i)
        elif i in train and stamp not in covered:
            prior.append(i)
    return todo, prior, sorted(covered)


class _Merger:
    """The running merge of training partials, as a dask future on the workers; every ``every`` dates it
    is saved to merged.npz with the dates it covers (a checkpoint: a resumed ingest reads back from the
    store only the training dates finished after it)."""

    def __init__(self, client: Any, stats_dir: Path, covered: list[str], every: int) -> None:
        self.client, self.stats_dir, self.every = client, stats_dir, every
        self.covered = list(covered)  # dates in self.acc
        self.unsaved = 0  # dates in self.acc since the last checkpoint
        self.acc: Any = None  # a future of the merged partials (None: nothing merged yet)
        if covered:
            self.acc = client.submit(statistics.load_partials, str(stats_dir / MERGED), pure=False)

    def add(self, fut: Any, stamps: list[str]) -> None:
        if not stamps:
            return
        # merges and checkpoints run before waiting date tasks (priority): a finished date's partials are
        # folded in at once, not held until the queue drains
        self.acc = fut if self.acc is None else self.client.submit(statistics.combine_fields, self.acc, fut,
                                                                    pure=False, priority=MERGE_PRIORITY)
        self.covered += stamps
        self.unsaved += len(stamps)
        if self.unsaved >= self.every:
            self.acc = self.client.submit(checkpoint_partials, self.acc, str(self.stats_dir / MERGED),
                                          sorted(self.covered), pure=False, priority=MERGE_PRIORITY)
            self.unsaved = 0


def checkpoint_partials(parts: statistics.FieldPartials | None, path: str,
                        dates: list[str]) -> statistics.FieldPartials | None:
    """Save merged partials (and the dates they cover) atomically; returns ``parts`` (a pass-through link
    in the chain of merges)."""
    if parts is not None:
        with io.atomic_path(path) as tmp:
            statistics.save_partials(parts, tmp, dates=dates)
    return parts


def partial_bytes(plan: sources.Plan) -> int:
    """Memory of the merged partial statistics (the accumulator a worker holds): per grid point of every
    statistics field slice (members, ensemble mean and std per variable, level and step; truth per step),
    mean and M2 in float64, min and max in float32 (a count that is the same everywhere is one number)."""
    return _slices(plan) * plan.grid.shape[0] * plan.grid.shape[1] * (8 + 8 + 4 + 4)


def _slices(plan: sources.Plan) -> int:
    fields = sum((len(plan.levels) if schema.VARIABLES[v].level_type is schema.LevelType.PRESSURE else 1)
                 for v in plan.variables)
    return fields * 3 * len(plan.steps_h) + len(schema.TARGETS) * len(plan.steps_h)


def one_pass_bytes(plan: sources.Plan) -> int:
    """Peak memory of a worker on the one-pass path: the accumulator twice (while a merge makes the next
    one), and a date's decoded fields with their ensemble statistics and partials (twice the date)."""
    return 2 * partial_bytes(plan) + 2 * date_bytes(plan)


def worker_memory_gb(client: Any) -> float | None:
    """The smallest memory a worker of the cluster may use (GB): its dask memory limit or, for a worker
    without one (the LocalCluster ``ingest`` starts), its host's RAM shared by the workers on that host;
    None when there is no worker."""
    info = client.scheduler_info().get("workers", {})
    limits = {addr: float(w.get("memory_limit") or 0) for addr, w in info.items()}
    unlimited = [addr for addr, lim in limits.items() if lim <= 0]
    if unlimited:
        ram = client.run(_host_memory, workers=unlimited)
        per_host = collections.Counter(w.get("host") for w in info.values())
        limits |= {addr: ram[addr] / per_host[info[addr].get("host")] for addr in unlimited}
    return min(limits.values()) / 1e9 if limits else None


def _host_memory() -> float:
    import psutil  # a dependency of dask.distributed

    return float(psutil.virtual_memory().total)


def _one_pass(cfg: IngestConfig, plan: sources.Plan, worker_gb: float | None = None) -> bool:
    """Whether the training statistics come from the date tasks' partials (one pass) or from a dask
    reduction over the finished store (two passes, bounded memory): in auto mode, one pass while
    :func:`one_pass_bytes` fits ``one_pass_max_gb``, by default 60% of the smallest worker's memory
    limit ``worker_gb`` (dask's own target fraction; see :func:`worker_memory_gb`); two passes when
    neither is known."""
    if cfg.statistics != "auto":
        return cfg.statistics == "one-pass"
    need = one_pass_bytes(plan) / 1e9
    budget = cfg.one_pass_max_gb if cfg.one_pass_max_gb is not None else (
        0.6 * worker_gb if worker_gb is not None else None)
    if budget is None or need > budget:
        source = "one_pass_max_gb" if cfg.one_pass_max_gb is not None else "60% of a worker's memory"
        why = "no worker reports its memory" if budget is None else f"over {budget:.1f} GB ({source})"
        log.info("statistics in a second pass over the store: one-pass statistics would take %.1f GB per worker, "
                 "%s; workers with more memory (or a larger one_pass_max_gb) take the one-pass path", need, why)
        return False
    return True


def _stats_chunks(plan: sources.Plan, target_bytes: int = 64 * 2**20) -> dict[str, int]:
    """Read chunks for the two-pass statistics: many init dates per dask task (few, large tasks)."""
    per_date = 4 * plan.grid.shape[0] * plan.grid.shape[1] * len(plan.members) * len(plan.steps_h)
    return {schema.INIT_TIME: int(max(1, min(len(plan.init_times), target_bytes // per_date)))}


def _submit_dates(client: Any, cfg: IngestConfig, found: sources.Discovered, plan: sources.Plan, todo: list[int],
                  store: Path, done_dir: Path, train: frozenset[int]) -> tuple[list[Any], list[list[int]]]:
    """Submit the date tasks of ``todo`` (batches of consecutive dates); (futures, their batches)."""
    work = batches(todo, cfg.dates_per_task or batch_size(plan))
    futures = [client.submit(ingest_dates, found.forecast, found.truth, found.oracle, plan, b, str(store),
                             str(done_dir), train, pure=False) for b in work]
    return futures, work


def _run_tasks(client: Any, cfg: IngestConfig, plan: sources.Plan, todo: list[int], submitted: tuple[list[Any],
               list[list[int]]], store: Path, train: frozenset[int], prior: list[int], covered: list[str],
               meanwhile: Callable[[], None] | None = None) -> Any:
    """Wait for the date tasks ``submitted``, merging the training partials on the workers as tasks finish;
    returns the future of the merged partials (None: no training date), which stays on its worker.
    ``prior`` and ``covered`` are what an earlier, interrupted run left (training dates done after its
    last checkpoint, whose partials are read back from the store, and the dates merged.npz holds).
    ``meanwhile`` runs in a thread of this process while the tasks run."""
    futures, work = submitted
    merger = _Merger(client, store.parent / STATS_DIR, covered, cfg.checkpoint_dates)
    for i in prior:
        merger.add(client.submit(stored_partials, str(store), i, pure=False), [_stamp(plan.init_times[i])])
    stamps = {f.key: [_stamp(plan.init_times[i]) for i in b if i in train] for f, b in zip(futures, work, strict=True)}
    meter = Progress(len(plan.init_times), len(plan.init_times) - len(todo), date_bytes(plan))
    with ThreadPoolExecutor(1) as pool:  # ``meanwhile`` beside the loop that submits merges as dates finish
        side = pool.submit(meanwhile) if meanwhile is not None else None
        for fut, _n in _progress(futures, [len(b) for b in work], cfg.progress, "ingest", meter):
            if fut.status != "finished":
                fut.result()  # raises the task's error here
            merger.add(fut, stamps.pop(fut.key))
        if side is not None:
            side.result()
    return merger.acc


def _prepare(cfg: IngestConfig, plan: sources.Plan, partial: Path, truth_vars: list[str],
             oracle_vars: list[str]) -> tuple[Path, Path]:
    """Create (or reopen, to resume) the partial store and its done-markers directory."""
    store, done_dir, meta = partial / "store.zarr", partial / "done", partial / "plan.json"
    fingerprint = {"config": cfg.fingerprint(), "plan": plan.to_dict(), "truth": truth_vars, "oracle": oracle_vars}
    if meta.exists():
        if json.loads(meta.read_text()) == json.loads(json.dumps(fingerprint, default=str)) and store.exists():
            log.info("resuming the interrupted ingest in %s", partial)
            (partial / STATS_DIR).mkdir(exist_ok=True)  # an ingest from before one-pass statistics has none
            return store, done_dir
        if not cfg.restart:
            msg = (f"{partial} holds an interrupted ingest with other settings or sources; rerun with the same "
                   "arguments to resume, or pass --restart to discard it")
            raise ConfigError(msg)
        log.warning("discarding the interrupted ingest in %s (--restart)", partial)
    io.remove(partial)
    partial.mkdir(parents=True)
    (partial / STATS_DIR).mkdir()
    tmpl = template(plan, truth=truth_vars, oracle=oracle_vars, splits=cfg.splits)
    io.write_template(tmpl, store, chunks=_chunks(plan))
    io.update_zarr_attrs(store, {contract.COMPLETE_ATTR: False, contract.VERSION_ATTR: contract.FORMAT_VERSION})
    done_dir.mkdir()
    io.write_json(meta, fingerprint)
    return store, done_dir


def _statistics(client: Any, cfg: IngestConfig, plan: sources.Plan, store: Path, train: list[int], one_pass: bool,
                merged: Any) -> None:
    """Write the statistics group: from the merged partials (future ``merged``) on the worker that holds
    them (they never travel), or by one dask reduction over the written store in bounded memory."""
    if train and not one_pass:
        stats = statistics.compute_statistics(io.open_zarr(store, chunks=_stats_chunks(plan)), cfg.splits)
        io.write_zarr(stats, store, group=contract.STATISTICS_GROUP, mode="w")
    elif train:
        client.submit(write_statistics, merged, str(store), np.asarray(plan.init_times)[train], cfg.splits,
                      pure=False, priority=MERGE_PRIORITY).result()
    else:  # e.g. an operational store of new forecasts: models carry their own statistics
        log.warning("no init date in the training years %s: the store gets no statistics", cfg.splits.train)


def write_statistics(parts: statistics.FieldPartials | None, store: str, train_times: np.ndarray,
                     splits: schema.Splits) -> None:
    """Write the statistics group from the merged partials (a task: it runs where they are) into the arrays
    :func:`statistics_template` created."""
    keep_freed_memory()
    stats = statistics.from_partials(io.open_zarr(store), parts or {}, train_times, splits)
    io.write_into(stats, store, group=contract.STATISTICS_GROUP)


def statistics_template(store: Path) -> None:
    """Create the statistics group's arrays (metadata only: hundreds of arrays, ~1 s), here in the client
    while the workers ingest the dates."""
    tmpl, chunks = statistics.template(io.open_zarr(store))
    io.write_template(tmpl, store, chunks=chunks, group=contract.STATISTICS_GROUP)


def _source_checksums(client: Any, plan: sources.Plan, found: sources.Discovered) -> tuple[list[str], list[Any]]:
    """(source paths, futures of their checksums), computed on the workers after the date tasks."""
    files = list(plan.files)
    if found.truth is not None:
        files += list(found.truth.paths)
    if found.oracle is not None:
        files += list(found.oracle.paths)
    files = [str(f) for f in files]
    return files, client.map(_checksum, files, pure=False, priority=-MERGE_PRIORITY)


def _written_chunks(done_dir: Path) -> dict[str, dict[str, Any]]:
    """The chunk checksums the date tasks left in their done-markers (none in a marker of an older ingest)."""
    out: dict[str, dict[str, Any]] = {}
    for marker in done_dir.iterdir():
        if marker.name.startswith("."):
            continue
        try:
            out.update(json.loads(marker.read_text()).get("chunks", {}))
        except (ValueError, AttributeError):  # "done\n": the chunks are hashed at the end instead
            continue
    return out


def _finalise(cfg: IngestConfig, plan: sources.Plan, store: Path, found: sources.Discovered,
              truth_vars: list[str], sums: dict[str, str], written: dict[str, dict[str, Any]]) -> None:
    attrs = {
        contract.VERSION_ATTR: contract.FORMAT_VERSION,
        contract.COMPLETE_ATTR: True,
        "title": "postcast training store (ENS-10 schema)",
        "Conventions": "CF-1.10",
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "code_version": _code_version(),
        "source_kind": found.forecast.kind,
        "sources": sums,
        "plan": {k: v for k, v in plan.to_dict().items() if k not in ("init_times", "files")},
        **plan.regridding,
        "n_init_times": len(plan.init_times),
        "splits": cfg.splits.as_dict(),
        "targets": list(schema.TARGETS),
        "truth_missing_at_48h": found.truth.coverage(plan) if found.truth is not None else {},
        "ingest_config": {k: v for k, v in asdict(cfg).items() if k not in ("progress",)},
    }
    if found.oracle is not None:
        attrs["has_oracle"] = True
    io.update_zarr_attrs(store, json.loads(json.dumps(attrs, default=str)))
    io.consolidate(store)
    integrity.record(store, written)  # chunk checksums for `postcast inspect --verify`
