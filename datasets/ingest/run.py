"""Ingestion: raw ENS-10 forecasts (+ ERA5-like truth) -> the canonical training store (zarr 3).

This module holds the options (:class:`IngestConfig`), the result and the run: :func:`ingest` and its
stages, each reading one :class:`IngestRun`. The rest is by concern:

* ``ingest_layout``: the store's template and chunk shapes (the layout is described there and in docs/store.md);
* ``ingest_tasks``: the per-date task the workers run (load, check, ensemble statistics, write, mark done);
* ``ingest_merge``: the merge of the training partials, its checkpoints, resume state, the statistics group;
* ``ingest_budget``: memory sizes, dates per task and the one-pass statistics decision;
* ``ingest_progress``: the progress meter (log lines) and bar;
* ``ingest_lock``: one ingest per store at a time (``OUT.lock``);
* ``provenance``: what the finished store records about how it was made (checksums, code version, attributes);
* ``datasets/core/cluster.py``: the dask client (address, scheduler file or LocalCluster) and worker process set-up,
  shared with evaluate and forecast.

Execution: a dask.distributed cluster (a local one by default, an existing one with
``scheduler=ADDRESS`` or ``scheduler=SCHEDULER_FILE``) runs one task per init date (or a few dates on
coarse grids), each writing whole chunks and returning the partial statistics of its training dates;
the partials are merged on the workers as tasks finish and the statistics group is written from them,
without reading the store back. Progress (dates, MB/s, ETA) goes to the log and the bar.
Crash safety: the store is built at ``OUT.partial/store.zarr`` with one marker file per finished
date under ``OUT.partial/done/``; every ``checkpoint_dates`` training dates the merged partial statistics
are saved to ``OUT.partial/stats/merged.npz`` with the dates they cover. A rerun with the same settings
(the same :meth:`IngestConfig.fingerprint`) resumes: it reads back from the store only the training dates
finished after the last checkpoint; only a finished store is renamed to ``OUT``, so a store at ``OUT`` is
always complete.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd

from postcast.datasets import contract, integrity, io, schema, sources
from postcast.datasets.core import cluster, config
from postcast.datasets.core.errors import ConfigError
from postcast.datasets.ingest import budget as ingest_budget
from postcast.datasets.ingest import layout as ingest_layout
from postcast.datasets.ingest import lock as ingest_lock
from postcast.datasets.ingest import merge as ingest_merge
from postcast.datasets.ingest import planning, provenance
from postcast.datasets.ingest import progress as ingest_progress
from postcast.datasets.ingest import tasks as ingest_tasks

log = logging.getLogger(__name__)


STATISTICS_MODES = ("auto", "one-pass", "two-pass")
# field metadata of an option that decides how or where ingest runs, not what the store holds: a resume
# with other values of such options continues the interrupted ingest (see IngestConfig.fingerprint)
EXECUTION = MappingProxyType({"execution": True})


@config.register("ingest")
@dataclass(frozen=True)
class IngestConfig:
    """Options of ``postcast ingest`` (YAML preset: configs/ingest/default.yaml; a preset may leave
    ``source`` and ``out`` to the command line). Options marked ``metadata=EXECUTION`` do not change the
    store's content; every other option does, and is part of the resume fingerprint."""

    source: str = ""  # forecasts: a directory written by `postcast synth`, GRIB/netCDF files or a zarr store
    out: str = field(default="", metadata=EXECUTION)  # the store to write (its OUT.partial holds the resume state)
    truth: str | None = None  # ERA5-like truth; default: era5.zarr / era5/*.nc next to the forecasts
    variables: tuple[str, ...] | None = None  # required forecast variables; None: the ENS-10 ones the source has
    levels: tuple[int, ...] | None = None  # None: the levels the source holds
    members: str | int = "all"  # all | a count N | an inclusive range A:B (0:9)
    steps: tuple[int, ...] | None = None  # lead times in hours; None: the steps the source holds
    grid: float | None = None  # store resolution (deg); None: the source's regular global grid (or the closest)
    regrid_method: str = "bilinear"  # bilinear | nearest | conservative, when the source is on another grid
    splits: schema.Splits = field(default_factory=schema.Splits)
    # dask.distributed address or scheduler file (JSON); None: start a LocalCluster
    scheduler: str | None = field(default=None, metadata=EXECUTION)
    workers: int = field(default=2, metadata=EXECUTION)  # LocalCluster workers
    # LocalCluster of processes (False: threads in this process, for tests/debugging)
    processes: bool = field(default=True, metadata=EXECUTION)
    # init dates per dask task; None: about 64 MB of member data (1 at 0.5 deg)
    dates_per_task: int | None = field(default=None, metadata=EXECUTION)
    # save the merged partial statistics every this many training dates
    checkpoint_dates: int = field(default=16, metadata=EXECUTION)
    # one-pass | two-pass | auto (one-pass while it fits the budget below): the same figures either way
    statistics: str = field(default="auto", metadata=EXECUTION)
    # auto: GB one-pass may use per worker; None: 60% of a worker's memory
    one_pass_max_gb: float | None = field(default=None, metadata=EXECUTION)
    overwrite: bool = field(default=False, metadata=EXECUTION)  # rebuild a complete store
    restart: bool = field(default=False, metadata=EXECUTION)  # discard an interrupted ingest with other settings
    progress: bool = field(default=True, metadata=EXECUTION)

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
        return sources.Expectation(self.variables, self.levels, self.members, self.steps, self.grid, self.regrid_method)

    def fingerprint(self) -> str:
        """Hash of everything that determines the store's content (not how it is computed): every field
        not marked ``metadata=EXECUTION``, with the source as its resolved path."""
        content = {f.name for f in fields(self) if not f.metadata.get("execution")}
        keep = {k: v for k, v in asdict(self).items() if k in content}
        keep["source"] = str(Path(self.source).resolve())
        return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _same_inputs(cfg: IngestConfig, out: Path) -> None:
    """A complete store is kept only when it was made from the same inputs and options (the resume
    fingerprint); otherwise the rerun names what differs and refuses: "already complete" would report a
    store of another source or other variables as done."""
    made = contract.open_store(out).attrs
    if made.get("ingest_fingerprint") == cfg.fingerprint():
        return
    before = made.get("ingest_config", {})
    now = json.loads(json.dumps(asdict(cfg), default=str))
    content = [f.name for f in fields(cfg) if not f.metadata.get("execution")]
    differs = [k for k in content if before.get(k) != now.get(k)] or ["the source's resolved path"]
    msg = (
        f"{out} is a complete store made from other inputs or options ({', '.join(differs)} differ): pass "
        "--overwrite to rebuild it, or choose another --out"
    )
    raise ConfigError(msg)


@dataclass
class IngestResult:
    store: Path
    skipped: bool
    n_dates: int
    n_written: int
    seconds: float
    bytes_read: int = 0


@dataclass(frozen=True)
class IngestRun:
    """What every stage of one ingest run reads: the options, the discovered sources and their plan, the
    dask client (None for a stage that needs no cluster: :func:`_prepare`) and which way the training
    statistics go; the partial store's paths and the training dates follow from them."""

    cfg: IngestConfig
    found: sources.Discovered
    plan: sources.Plan
    client: Any  # dask.distributed.Client
    one_pass: bool  # training statistics from the date tasks' partials (else a second pass over the store)

    @property
    def partial(self) -> Path:
        """OUT.partial: the store under construction and the resume state."""
        return contract.partial_path(Path(self.cfg.out))

    @property
    def store(self) -> Path:
        return self.partial / "store.zarr"

    @property
    def done_dir(self) -> Path:
        """One marker per finished init date (:func:`ingest_tasks.marker_name`)."""
        return self.partial / "done"

    @property
    def stats_dir(self) -> Path:
        return self.partial / ingest_merge.STATS_DIR

    @functools.cached_property
    def truth_vars(self) -> list[str]:
        return self.found.truth.variables() if self.found.truth else []

    @functools.cached_property
    def oracle_vars(self) -> list[str]:
        return self.found.oracle.variables() if self.found.oracle else []

    @functools.cached_property
    def train(self) -> frozenset[int]:
        """Indices of the init dates in the training years."""
        times = pd.DatetimeIndex(self.plan.init_times)
        return frozenset(np.flatnonzero(self.cfg.splits.mask(times, "train")).tolist())

    @property
    def partial_dates(self) -> frozenset[int]:
        """The training dates whose tasks return partial statistics (none on the two-pass path)."""
        return self.train if self.one_pass else frozenset()


def ingest(cfg: IngestConfig) -> IngestResult:
    """Run the whole ingestion (see the module docstring); idempotent and resumable."""
    missing = [n for n in ("source", "out") if not getattr(cfg, n)]
    if missing:
        msg = f"ingest needs {' and '.join(missing)}: pass SOURCE and --out (or set them in the preset)"
        raise ConfigError(msg)
    if cfg.scheduler is None:
        cluster.check_local_workers(cfg.workers)
    with ingest_lock.hold(cfg.out):
        return _ingest(cfg)


def _ingest(cfg: IngestConfig) -> IngestResult:
    """:func:`ingest` holding the store's lock."""
    start = time.perf_counter()
    out = Path(cfg.out)
    if out.exists() and not cfg.overwrite:
        if contract.is_complete(out):
            _same_inputs(cfg, out)
            log.info("%s is already complete: nothing to do (use --overwrite to rebuild)", out)
            io.remove(contract.partial_path(out))
            return IngestResult(out, True, 0, 0, time.perf_counter() - start)
        msg = f"{out} exists but is not a complete postcast store; remove it or pass --overwrite"
        raise ConfigError(msg)
    found = sources.discover(cfg.source, truth=cfg.truth)
    with cluster.dask_client(cfg.scheduler, cfg.workers, cfg.processes) as client:
        plan = planning.plan(cfg.source, cfg.out, cfg.expectation, found, client)
        run = IngestRun(cfg, found, plan, client, ingest_budget.one_pass(cfg, plan, cluster.worker_memory_gb(client)))
        todo = _build(run)
    io.replace(run.store, out)
    io.remove(run.partial)
    log.info("wrote %s (%d init dates)", out, len(plan.init_times))
    return IngestResult(
        out,
        False,
        len(plan.init_times),
        len(todo),
        time.perf_counter() - start,
        len(todo) * ingest_budget.date_bytes(plan),
    )


def _build(run: IngestRun) -> list[int]:
    """Write the partial store: the dates not done yet, the statistics group and the final metadata;
    returns the indices of the dates written."""
    _prepare(run)
    resume = ingest_merge.resume_state(run.plan, run.done_dir, run.stats_dir, run.partial_dates)
    n = len(run.plan.init_times)
    log.info("%d of %d init dates to ingest (%d already done)", len(resume.todo), n, n - len(resume.todo))
    t_dates = time.perf_counter()
    merged, sums = _run_tasks(
        run,
        resume,
        ingest_tasks.batches(resume.todo, _dates_per_task(run)),
        lambda: provenance.source_checksums(run.client, run.plan, run.found),
    )
    t_written = time.perf_counter()
    _statistics(run, merged)
    del merged
    t_stats = time.perf_counter()
    _finalise(run, dict(zip(sums[0], run.client.gather(sums[1]), strict=True)), provenance.written_chunks(run.done_dir))
    log.info(
        "dates written in %.1f s; statistics group %.1f s; checksums and metadata %.1f s",
        t_written - t_dates,
        t_stats - t_written,
        time.perf_counter() - t_stats,
    )
    return resume.todo


def _prepare(run: IngestRun) -> None:
    """Create (or reopen, to resume) the partial store and its done-markers directory."""
    partial, meta = run.partial, run.partial / "plan.json"
    fingerprint = {
        "config": run.cfg.fingerprint(),
        "plan": run.plan.to_dict(),
        "truth": run.truth_vars,
        "oracle": run.oracle_vars,
    }
    if meta.exists():
        if json.loads(meta.read_text()) == json.loads(json.dumps(fingerprint, default=str)) and run.store.exists():
            log.info("resuming the interrupted ingest in %s", partial)
            run.stats_dir.mkdir(exist_ok=True)  # an ingest from before one-pass statistics has none
            return
        if not run.cfg.restart:
            msg = (
                f"{partial} holds an interrupted ingest with other settings or sources; rerun with the same "
                "arguments to resume, or pass --restart to discard it"
            )
            raise ConfigError(msg)
        log.warning("discarding the interrupted ingest in %s (--restart)", partial)
    io.remove(partial)
    partial.mkdir(parents=True)
    run.stats_dir.mkdir()
    tmpl = ingest_layout.template(run.plan, truth=run.truth_vars, oracle=run.oracle_vars, splits=run.cfg.splits)
    io.write_template(tmpl, run.store, chunks=ingest_layout.chunk_shapes(run.plan))
    io.update_zarr_attrs(run.store, {contract.COMPLETE_ATTR: False, contract.VERSION_ATTR: contract.FORMAT_VERSION})
    run.done_dir.mkdir()
    io.write_json(meta, fingerprint)


def _dates_per_task(run: IngestRun) -> int:
    return run.cfg.dates_per_task or ingest_budget.batch_size(run.plan)


def _submit_dates(run: IngestRun, batch: list[int], key: str) -> Any:
    """Submit the date task of ``batch`` (consecutive dates) under ``key``; its future."""
    found = run.found
    return run.client.submit(
        *(ingest_tasks.ingest_dates, found.forecast, found.truth, found.oracle, run.plan, batch),
        *(str(run.store), str(run.done_dir), run.partial_dates),
        key=key,
    )


def _run_tasks(
    run: IngestRun, resume: ingest_merge.Resume, work: list[list[int]], behind: Callable[[], Any]
) -> tuple[Any, Any]:
    """Run the date tasks of ``work`` (batches of consecutive dates), merging the training partials on the workers in
    date order as tasks finish; returns the future of the merged partials (None: no training date), which stays on
    its worker, and what ``behind`` returned: it submits work that waits behind the dates (the sources' checksums,
    at a lower priority), called once the first date tasks are queued, as tasks submitted to idle workers run at
    once whatever their priority. A date task is submitted when an earlier one is folded in, so that at most
    DATES_AHEAD_PER_THREAD per worker thread are in flight and the partials waiting to be folded do not grow with
    the dates. The partials of ``resume.prior`` (training dates an interrupted run finished after its last
    checkpoint) are read back from the store. Meanwhile, on the one-pass path, a thread of this process creates
    the statistics group's arrays."""
    from dask.distributed import wait

    plan, client = run.plan, run.client
    merger = ingest_merge.Merger(client, run.stats_dir, resume.covered, run.cfg.checkpoint_dates)
    for i in resume.prior:
        merger.add(
            client.submit(ingest_merge.stored_partials, str(run.store), i, pure=False),
            [ingest_tasks.marker_name(plan.init_times[i])],
        )
    stamps = [[ingest_tasks.marker_name(plan.init_times[i]) for i in b if i in run.partial_dates] for b in work]
    n = len(plan.init_times)
    finishing = ingest_progress.Finishing(
        ingest_progress.Progress(n, n - len(resume.todo), ingest_budget.date_bytes(plan)), bar=run.cfg.progress
    )
    keys = ingest_tasks.task_keys(len(work))  # known ahead: the order of the merge

    def submit_up_to(end: int) -> None:
        for k in range(finishing.added, min(end, len(work))):
            finishing.add(_submit_dates(run, work[k], keys[k]), len(work[k]))

    submit_up_to(_ahead(client))
    after = behind()
    with ThreadPoolExecutor(1) as pool:  # the template beside the loop that submits merges as dates finish
        side = pool.submit(ingest_merge.statistics_template, run.store) if run.train and run.one_pass else None
        for k, fut in enumerate(ingest_merge.in_order(finishing, keys)):
            merger.add(fut, stamps[k])
            del fut
            # the next date once this one is merged: a merge waits for the one before it, and a worker that has
            # date tasks runs one between each, so unwaited merges fell behind and their partials piled up
            if merger.acc is not None:
                wait(merger.acc)
            submit_up_to(k + 1 + _ahead(client))
        if side is not None:
            side.result()
    return merger.acc, after


def _ahead(client: Any) -> int:
    """Date tasks to keep in flight: DATES_AHEAD_PER_THREAD per thread of the workers the cluster has now."""
    return ingest_budget.DATES_AHEAD_PER_THREAD * max(1, sum(client.nthreads().values()))


def _statistics(run: IngestRun, merged: Any) -> None:
    """Write the statistics group: from the merged partials (future ``merged``) on the worker that holds
    them (they never travel), or by one dask reduction over the written store in bounded memory."""
    train = sorted(run.train)
    if train and not run.one_pass:
        ingest_merge.statistics_on_workers(run.store, ingest_budget.statistics_read_chunks(run.plan), run.cfg.splits)
    elif train:
        run.client.submit(
            ingest_merge.write_statistics,
            merged,
            str(run.store),
            np.asarray(run.plan.init_times)[train],
            run.cfg.splits,
            pure=False,
            priority=ingest_merge.MERGE_PRIORITY,
        ).result()
    else:  # e.g. an operational store of new forecasts: models carry their own statistics
        log.warning("no init date in the training years %s: the store gets no statistics", run.cfg.splits.train)


def _finalise(run: IngestRun, sums: dict[str, str], written: dict[str, dict[str, Any]]) -> None:
    """Mark the partial store complete: provenance (source checksums ``sums``), the plan and the options in
    its attributes, consolidated metadata, and the chunk manifest (``written``: the date tasks' checksums)."""
    cfg = run.cfg
    options = {k: v for k, v in asdict(cfg).items() if k not in ("progress",)}
    attrs = provenance.attributes(run.plan, run.found, run.truth_vars, cfg.splits, options, cfg.fingerprint(), sums)
    io.update_zarr_attrs(run.store, json.loads(json.dumps(attrs, default=str)))
    io.consolidate(run.store)
    integrity.record(run.store, written)  # chunk checksums for `postcast inspect --verify`
