"""Ingest throughput: ENS-10 GRIB -> store and zarr -> store, next to eccodes' bare decode time.

For each grid (the 5 deg quickstart default and the 0.5 deg ENS-10 grid) the script writes a few
synthetic init dates as ENS-10 GRIB1 files and as zarr (not timed), then times

* ``decode``: eccodes alone, one process, reading every message of the GRIB files and decoding its
  values (``codes_grib_new_from_file`` + ``codes_get_values``): the floor for any GRIB reader. The
  files are read once before (HOT: in the page cache), so is every ingest after it;
* ``grib_ingest``: ``postcast ingest`` of the GRIB files (index, checks, ensemble statistics,
  training statistics, zarr writes, checksums) on a fresh dask LocalCluster of ``--workers``
  single-threaded worker processes, the way ``postcast ingest`` starts one; the cluster start is
  inside the time (``cluster_s`` says how much of it);
* ``zarr_ingest``: the same from the zarr form.

``peak_rss_MB`` is each worker process's peak resident memory over the whole ingest (the kernel's
high-water mark, VmHWM, asked of every worker with ``client.run``
before the cluster closes); the largest over workers is reported. At 0.5 deg the script also
times the parts of one init date's task in this process (one core): decode, checks, ensemble
statistics, training partial statistics and the zarr writes (member fields; the rest).

``--scale N`` synthesises the full ENS-10 shape (0.5 deg, 11 levels, 18 variables, 10 members,
3 steps: 1.37 GB of GRIB per init date) for N init dates, ingests it with workers bounded in
memory (one single-threaded task, one init date, at a time per worker; ``--memory-limit`` per
worker) and projects the whole ENS-10 (2100 init dates, ~2.9 TB of GRIB) on 1, 8 and 64 workers
(``--fs-gbps``: the file-system bandwidth assumed). Its figures survive a run that fails late: seconds
per finished date (from the done-markers) and the sampled peak RSS of every worker process.

``--anemoi`` adds anemoi-datasets as a peer at 0.5 deg (:mod:`ingest_anemoi`: its own virtual
environment, a recipe for the same GRIB files, both ingests timed in ``--anemoi-rounds`` interleaved
rounds, min and median, the stores compared field by field and measured per init date). Not the
default: the first run installs anemoi-datasets and each round adds both ingests (~1.5 min).

Prints tables, writes JSON (``--out``), and ends with
``RESULT grib_ingest_over_decode=<x> zarr_ingest_MB_per_s=<x> peak_worker_rss_MB=<x> ...
ingest_over_anemoi=<x> ingest_over_decode=<x> store_per_date_over_anemoi=<x>`` (at 0.5 deg when it
runs, else at the default grid; the scale figures with ``--scale``; the anemoi keys ``n/a`` without
``--anemoi``: postcast's throughput over anemoi's, postcast's time over eccodes' bare decode, both at
the min over the rounds, and postcast's store bytes per init date over anemoi's). Goals: <= 2 x decode;
the anemoi keys >= 2, <= 3, <= 1.3.

    python benchmarks/ingest.py            # both grids (~13 min on the shared 2 cores under load)
    python benchmarks/ingest.py --quick    # default grid only
    python benchmarks/ingest.py --case ens10_0.5deg --anemoi --anemoi-rounds 2  # 0.5 deg and the anemoi peer
    python benchmarks/ingest.py --scale 3 --workers 1 --memory-limit 16GB  # full shape only (~13 min, 4 GB GRIB)
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# isort: off
import pyproj  # noqa: F401  (before eccodes: see datasets/sources/messages.py)
import eccodes
# isort: on

import ingest_anemoi

from postcast.datasets import contract, download, io, schema, sources, statistics
from postcast.datasets.core import moments
from postcast.datasets.core.cluster import local_cluster
from postcast.datasets.ingest import layout as ingest_layout
from postcast.datasets.ingest import run as ingest
from postcast.datasets.sources import messages as grib
from postcast.datasets.synth import synthetic, synthfiles
from postcast.datasets.synth.synthetic import SynthConfig

ROOT = Path(__file__).resolve().parents[1]
ENS10_DATES = len(schema.month_days_subset(105)) * 20  # 105 month-days x 20 reforecast years
ENS10_GRIB_BYTES = sum(download.NOMINAL_BYTES.values()) * len(schema.month_days_subset(105))


# --- the pieces ----------------------------------------------------------------------------------
def grib_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.name.startswith("output."))


def warm(files: list[Path]) -> None:
    """Read every file once so that later reads come from the page cache (HOT)."""
    for path in files:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


def decode_all(files: list[Path]) -> tuple[float, int, int]:
    """Seconds for eccodes to decode every message; (seconds, messages, decoded float32 bytes)."""
    start, n, nbytes = time.perf_counter(), 0, 0
    for path in files:
        with open(path, "rb") as f:
            while (h := eccodes.codes_grib_new_from_file(f)) is not None:
                values = eccodes.codes_get_values(h)
                nbytes += values.size * 4
                n += 1
                eccodes.codes_release(h)
    return time.perf_counter() - start, n, nbytes


def _peak_rss_mb() -> float:
    """This process's peak resident set size (MB): its VmHWM (KiB), which starts again at exec. Not ru_maxrss,
    which Linux carries over from the parent through fork and exec (a worker started after synthesis reported
    the benchmark's own 8 GB)."""
    with open("/proc/self/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("VmHWM:"))) / 1024


def _arena_max() -> str | None:
    """This process's MALLOC_ARENA_MAX (run on each worker: ``os.environ.get`` itself would be pickled with the
    driver's environment)."""
    return os.environ.get("MALLOC_ARENA_MAX")


class RssSampler(threading.Thread):
    """Samples, every ``every`` seconds, the resident memory of every process below this one (the
    cluster's nannies and worker processes, restarted ones included) and when each init date's
    done-marker appears in ``done_dir``: figures that survive a run that fails late."""

    def __init__(self, done_dir: Path | None = None, every: float = 0.5):
        super().__init__(daemon=True)
        self.done_dir, self.every = done_dir, every
        self.peak: dict[int, int] = {}  # pid -> peak RSS bytes
        self.marks: list[float] = []  # perf_counter() when each done-marker was first seen
        self._halt = threading.Event()

    def run(self) -> None:
        import psutil  # a dependency of dask.distributed

        me = psutil.Process()
        while not self._halt.wait(self.every):
            for p in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    self.peak[p.pid] = max(self.peak.get(p.pid, 0), p.memory_info().rss)
            if self.done_dir is not None and self.done_dir.is_dir():
                n = sum(1 for _ in self.done_dir.iterdir())
                self.marks += [time.perf_counter()] * (n - len(self.marks))

    def stop(self) -> float:
        """Stop; the largest RSS of any process sampled (MB)."""
        self._halt.set()
        self.join()
        return max(self.peak.values(), default=0) / 2**20


@dataclass
class Run:
    seconds: float
    cluster_s: float
    peak_rss_mb: float  # kernel high-water mark of the workers (0 when the run failed)
    sampled_rss_mb: float  # largest sampled RSS of any worker process
    n_workers: int
    date_s: list[float]  # seconds between successive finished init dates (the first from the cluster start)
    error: str = ""
    worker_arena_max: str = ""  # the workers' MALLOC_ARENA_MAX ("1": started as `postcast ingest` starts them)


def timed_ingest(src: Path, out: Path, workers: int, memory_limit: str | int = 0) -> Run:
    """``postcast ingest`` of ``src`` into a removed ``out`` (a store kept from an earlier run would be found
    complete) on a fresh LocalCluster started as ``postcast ingest`` starts one (:func:`cluster.local_cluster`:
    worker processes, one thread and one glibc arena each), timed from the cluster start to the finished store."""
    from dask.distributed import Client

    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(contract.partial_path(out), ignore_errors=True)
    sampler = RssSampler(contract.partial_path(out) / "done")
    sampler.start()
    start = time.perf_counter()
    error, rss = "", {}
    with local_cluster(workers, memory_limit=memory_limit) as cluster, Client(cluster) as client:
        client.wait_for_workers(workers)
        cluster_s = time.perf_counter() - start
        try:
            res = ingest.ingest(
                ingest.IngestConfig(source=str(src), out=str(out), scheduler=cluster.scheduler_address, progress=False)
            )
            if not res.n_written == res.n_dates > 0:
                error = f"wrote {res.n_written} of {res.n_dates} init dates"
        except Exception as err:  # a scale run that fails late still reports what it measured
            error = f"{type(err).__name__}: {err}"[:300]
        seconds = time.perf_counter() - start
        if not error:
            rss = client.run(_peak_rss_mb)
        arena_max = {str(v) for v in client.run(_arena_max).values()}
    sampled = sampler.stop()
    marks = [start + cluster_s, *sampler.marks]
    return Run(
        seconds,
        cluster_s,
        max(rss.values(), default=0.0),
        sampled,
        workers,
        [round(b - a, 1) for a, b in itertools.pairwise(marks)],
        error,
        ",".join(sorted(arena_max)),
    )


def breakdown(src: Path, work: Path) -> dict[str, float]:
    """Seconds of each part of one init date's ingest task, in this process (one core)."""
    found = sources.discover(str(src))
    fc = found.forecast
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    if isinstance(fc, sources.GribSource):
        fc.set_index([grib.index_file(f) for f in fc.files])
    out["index_all_files"] = time.perf_counter() - t0
    plan = fc.plan(ingest.IngestConfig(source=str(src), out=str(work)).expectation)
    truth_vars = found.truth.variables() if found.truth else []
    oracle_vars = found.oracle.variables() if found.oracle else []
    store = work / "breakdown.zarr"
    io.write_zarr(
        ingest_layout.template(plan, truth=truth_vars, oracle=oracle_vars, splits=schema.Splits()),
        store,
        chunks=ingest_layout.chunk_shapes(plan),
        compute=False,
    )
    t = plan.init_times[0]
    t0 = time.perf_counter()
    ds = fc.load(t, plan)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    sources.check_values(ds, "breakdown")
    out["checks"] = time.perf_counter() - t0
    out["decode_and_assemble"] = load_s - out["checks"]
    t0 = time.perf_counter()
    ens = statistics.ensemble_statistics(ds)
    out["ens_stats_alone"] = time.perf_counter() - t0
    extras = [e.load(t, plan) for e in (found.truth, found.oracle) if e is not None]
    t0 = time.perf_counter()
    for name in ds.data_vars:  # what the task does: ensemble statistics and partials in one sweep per slice
        mean, std, _ = moments.ensemble_moments(ds[name].values)
        moments.value_partial(mean), moments.value_partial(std)
    out["ens_stats_and_partials"] = time.perf_counter() - t0
    region = {schema.INIT_TIME: slice(0, 1)}
    t0 = time.perf_counter()
    io.write_region(ds, store, region)
    out["write_members"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    io.write_region(ens.merge(extras[0]) if extras else ens, store, region)
    out["write_ens_truth"] = time.perf_counter() - t0
    return {k: round(v, 3) for k, v in out.items()}


# --- cases ---------------------------------------------------------------------------------------
CASES = {
    # 5 deg, 2 years x 4 month-days = 8 init dates, levels 500/850, all 18 variables; 2013 is a
    # training year, so the ingest computes training statistics
    "default_5deg": SynthConfig(resolution=5.0, years=(2013, 2014), dates_per_year=4, levels=(500, 850)),
    # 0.5 deg (361 x 720), 2 years x 1 month-day = 2 init dates, levels 500/850: 1500 messages
    "ens10_0.5deg": SynthConfig(resolution=0.5, years=(2013, 2014), dates_per_year=1, levels=(500, 850)),
}


def synth(cfg: SynthConfig, grib_dir: Path, zarr_dir: Path | None) -> float:
    """Write the GRIB (and zarr) forms of ``cfg`` unless already there (``--keep``); seconds taken."""
    start = time.perf_counter()
    if not (grib_dir / "synth.json").exists():
        synthfiles.write_synthetic(
            SynthConfig(**{**cfg.to_dict(), "format": "grib", "years": cfg.years, "levels": cfg.levels}),
            grib_dir,
            progress=False,
        )
    if zarr_dir is not None and not (zarr_dir / "synth.json").exists():
        synthfiles.write_synthetic(cfg, zarr_dir, progress=False)
    return time.perf_counter() - start


def postcast_round(grib_dir: Path, workers: int) -> Callable[[Path], float]:
    """One peer round of ``postcast ingest``: seconds into a removed ``store`` (cluster start included)."""

    def run(store: Path) -> float:
        r = timed_ingest(grib_dir, store, workers)
        if r.error:
            msg = f"postcast ingest of {grib_dir} into {store} failed: {r.error}"
            raise RuntimeError(msg)
        return r.seconds

    return run


def run_case(
    name: str, cfg: SynthConfig, work: Path, workers: int, anemoi: ingest_anemoi.PeerConfig | None = None
) -> dict[str, Any]:
    grib_dir, zarr_dir = work / f"{name}_grib", work / f"{name}_zarr"
    synth(cfg, grib_dir, zarr_dir)
    files = grib_files(grib_dir)
    warm(files)
    t_decode, n_msg, n_bytes = decode_all(files)
    g = timed_ingest(grib_dir, work / f"{name}_from_grib.zarr", workers)
    z = timed_ingest(zarr_dir, work / f"{name}_from_zarr.zarr", workers)
    if g.error or z.error:
        raise SystemExit(f"{name}: ingest failed: {g.error or z.error}")
    mb = n_bytes / 2**20
    store_mb = io_size(work / f"{name}_from_grib.zarr") / 2**20
    row: dict[str, Any] = {
        "grid": f"{cfg.grid.n_lat}x{cfg.grid.n_lon}",
        "dates": len(cfg.init_times),
        "messages": n_msg,
        "decoded_MB": round(mb, 1),
        "grib_MB": round(sum(p.stat().st_size for p in files) / 2**20, 1),
        "store_MB": round(store_mb, 1),
        "decode_hot_s": round(t_decode, 2),
        "grib_ingest_s": round(g.seconds, 2),
        "zarr_ingest_s": round(z.seconds, 2),
        "cluster_s": round(g.cluster_s, 2),
        "decode_MB_per_s": round(mb / t_decode, 1),
        "grib_ingest_MB_per_s": round(mb / g.seconds, 1),
        "zarr_ingest_MB_per_s": round(mb / z.seconds, 1),
        "grib_ingest_over_decode": round(g.seconds / t_decode, 2),
        "grib_ingest_minus_cluster_over_decode": round((g.seconds - g.cluster_s) / t_decode, 2),
        "peak_rss_MB": round(max(g.peak_rss_mb, z.peak_rss_mb)),
        "sampled_rss_MB": round(max(g.sampled_rss_mb, z.sampled_rss_mb)),
        "workers": g.n_workers,
    }
    if cfg.resolution == 0.5:
        row["breakdown_one_date_s"] = breakdown(grib_dir, work / f"{name}_breakdown")
        if anemoi is not None:
            peer_dir = work / f"{name}_peer"
            peer_dir.mkdir(exist_ok=True)
            run = postcast_round(grib_dir, workers)

            def decode() -> float:  # seconds: eccodes' bare decode takes its turn in the peers' rounds
                return decode_all(files)[0]

            row["anemoi_peer"] = ingest_anemoi.peer(files, cfg.init_times, peer_dir, run, decode, anemoi)
    return row


def io_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --- scale run -----------------------------------------------------------------------------------
def _write_scale_file(cfg: SynthConfig, month: int, day: int, kind: str, path: Path) -> None:
    """One ENS-10 GRIB file (``kind`` pl or sfc) of one month-day: the date's fields are generated in
    this process (2.4 GB for pl) and written message by message."""
    import dask

    want = schema.LevelType.PRESSURE if kind == "pl" else schema.LevelType.SURFACE
    names = [v.name for v in schema.VARIABLES.values() if v.level_type is want]
    times = [t for t in cfg.init_times if (t.month, t.day) == (month, day)]
    with dask.config.set(scheduler="synchronous"):
        sub = synthetic.forecast_dataset(cfg, names).sel({schema.INIT_TIME: times}).load()
    grib.write_file(sub, path, kind)


def synth_scale(cfg: SynthConfig, out: Path, processes: int) -> float:
    """The GRIB files of ``cfg`` (forecasts only), ``processes`` files at a time (memory: one
    date's pl fields per process); files already there are kept (``--keep``). Seconds taken."""
    from concurrent.futures import ProcessPoolExecutor

    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(m, d, kind, out / grib.file_name(kind, m, d)) for kind in ("pl", "sfc") for m, d in cfg.month_days]
    with ProcessPoolExecutor(processes) as pool:
        for fut in [pool.submit(_write_scale_file, cfg, *job) for job in jobs if not job[-1].exists()]:
            fut.result()
    return time.perf_counter() - start


def scale_run(n: int, work: Path, workers: int, memory_limit: str) -> dict[str, Any]:
    """Synthesise N init dates of the full ENS-10 shape as GRIB and ingest them."""
    cfg = SynthConfig(resolution=0.5, years=(2013, 2013), dates_per_year=n, levels=schema.LEVELS)
    grib_dir = work / "scale_grib"
    synth_s = synth_scale(cfg, grib_dir, workers)
    files = grib_files(grib_dir)
    gb_in = sum(p.stat().st_size for p in files) / 1e9
    warm(files)
    t_decode, n_msg, n_bytes = decode_all(files)
    print(
        f"scale: {n} dates, {gb_in:.2f} GB of GRIB synthesised in {synth_s:.0f} s; eccodes decodes them hot in "
        f"{t_decode:.1f} s",
        flush=True,
    )
    import dask

    # a worker past its memory limit ends the run at once (its figures are kept) instead of three retries
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        run = timed_ingest(grib_dir, work / "scale.zarr", workers, memory_limit)
    store = work / "scale.zarr"
    store = store if store.exists() else contract.partial_path(store) / "store.zarr"
    # steady state: the init dates after the first (which also pays the workers' imports and indexing)
    steady = run.date_s[1:] or run.date_s
    per_date_s = sum(steady) / max(len(steady), 1)
    return {
        "dates": n,
        "messages": n_msg,
        "GB_in": round(gb_in, 2),
        "decoded_GB": round(n_bytes / 1e9, 2),
        "store_GB": round(io_size(store) / 1e9, 2),
        "synth_s": round(synth_s, 1),
        "decode_hot_s": round(t_decode, 1),
        "ingest_s": round(run.seconds, 1),
        "cluster_s": round(run.cluster_s, 1),
        "date_s": run.date_s,
        "dates_done": len(run.date_s),
        "steady_s_per_date": round(per_date_s, 1),
        "GRIB_MB_per_s": round(gb_in / n * 1e3 / per_date_s, 1),
        "decoded_MB_per_s": round(n_bytes / n / 1e6 / per_date_s, 1),
        "ingest_over_decode": round(per_date_s * n / t_decode, 2),
        "peak_rss_MB_per_worker": round(max(run.peak_rss_mb, run.sampled_rss_mb)),
        "workers": run.n_workers,
        "memory_limit_per_worker": memory_limit,
        "cores": os.cpu_count(),
        "completed": not run.error,
        "error": run.error,
    }


def projection(s: dict[str, Any], fs_gbps: float, workers: tuple[int, ...] = (1, 8, 64)) -> list[dict[str, Any]]:
    """Projected wall time of the whole ENS-10 from the scale run: each worker (one core) ingests
    GRIB at the measured rate per worker; the file system moves the GRIB read plus the store written
    at ``fs_gbps`` GB/s in all (an assumption, stated). The larger of the two bounds the time."""
    per_worker = s["GRIB_MB_per_s"] / 1e3 / s["workers"]  # GB of GRIB per s per worker, steady state
    io_gb = ENS10_GRIB_BYTES / 1e9 * (1 + s["store_GB"] / s["GB_in"])  # read GRIB + write the store
    rows = []
    for w in workers:
        cpu_h = ENS10_GRIB_BYTES / 1e9 / (per_worker * w) / 3600
        io_h = io_gb / fs_gbps / 3600
        rows.append(
            {
                "workers": w,
                "cpu_bound_h": round(cpu_h, 2),
                "fs_bound_h": round(io_h, 2),
                "projected_h": round(max(cpu_h, io_h), 2),
                "limit": "CPU" if cpu_h >= io_h else "file system",
                "peak_RAM_GB": round(w * s["peak_rss_MB_per_worker"] / 1e3, 1),
            }
        )
    return rows


def regrid_cost(fields: int = 20) -> dict[str, float]:
    """Regridding cost per 2-D field (ms) from 0.25 deg (721 x 1440) to 0.5 deg, per method, one core
    (a batch of ``fields`` fields of a smooth random field; the median of 3 runs)."""
    import numpy as np

    from postcast.datasets.sources import regrid

    src = schema.Grid(0.25)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((fields, *src.shape)).cumsum(axis=-1).astype(np.float32)
    grid = regrid.SourceGrid.regular(src.latitudes(), src.longitudes())
    out: dict[str, float] = {}
    for method in ("bilinear", "nearest", "conservative"):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            regrid.to_grid(x, grid, schema.Grid(0.5), method)
            times.append(time.perf_counter() - t0)
        out[f"regrid_{method}_ms_per_field"] = round(1e3 * sorted(times)[1] / fields, 2)
    return out


# --- output --------------------------------------------------------------------------------------
def print_rows(rows: dict[str, dict[str, Any]], cols: list[str], first: str = "case") -> None:
    print(f"{first:<14}" + "".join(f"{c:>{max(12, len(c) + 2)}}" for c in cols))
    for name, row in rows.items():
        print(f"{name:<14}" + "".join(f"{row[c]!s:>{max(12, len(c) + 2)}}" for c in cols))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="default grid only")
    ap.add_argument("--scale", type=int, default=0, metavar="N", help="only the full-shape run of N init dates")
    ap.add_argument("--workers", type=int, default=2, help="dask LocalCluster workers for ingest")
    ap.add_argument("--memory-limit", default="8GB", help="dask memory limit per worker in the scale run")
    ap.add_argument(
        "--fs-gbps", type=float, default=2.0, help="assumed aggregate file-system bandwidth (GB/s) for the projection"
    )
    ap.add_argument("--out", help="JSON results path (default benchmarks/results/ingest.json, ingest_scale.json)")
    ap.add_argument("--keep", help="keep the data under this directory instead of a temporary one")
    ap.add_argument("--case", choices=sorted(CASES), help="only this case")
    ap.add_argument("--anemoi", action="store_true", help="anemoi-datasets as a peer at 0.5 deg (ingest_anemoi.py)")
    ap.add_argument("--anemoi-rounds", type=int, default=3, help="interleaved rounds of postcast and anemoi")
    ap.add_argument(
        "--anemoi-venv",
        type=Path,
        default=ingest_anemoi.DEFAULT_VENV,
        help="anemoi's virtual environment (made if missing)",
    )
    args = ap.parse_args()
    args.load_start = os.getloadavg()
    if args.anemoi and (args.quick or args.scale or args.case == "default_5deg"):
        ap.error("--anemoi runs at 0.5 deg: drop --quick, --scale and --case default_5deg")
    peer = ingest_anemoi.PeerConfig(args.anemoi_rounds, args.anemoi_venv, args.workers) if args.anemoi else None
    args.out = args.out or str(ROOT / "benchmarks" / "results" / ("ingest_scale.json" if args.scale else "ingest.json"))
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("distributed").setLevel(logging.ERROR)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="postcast-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict[str, Any]] = {}
    scale: dict[str, Any] = {}
    try:
        if args.scale:
            scale = scale_run(args.scale, work, args.workers, args.memory_limit)
        else:
            for name, cfg in CASES.items():
                if not (args.quick and name != "default_5deg") and args.case in (None, name):
                    rows[name] = run_case(name, cfg, work, args.workers, peer)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report(rows, scale, args)


def report(rows: dict[str, dict[str, Any]], scale: dict[str, Any], args: argparse.Namespace) -> None:
    cores = os.cpu_count()
    load = os.getloadavg()[0]
    print(f"load average (1, 5, 15 min): {args.load_start} at the start, {os.getloadavg()} at the end")
    print(
        f"ingest on {args.workers} dask workers x 1 thread, {cores} cores (load average {load:.1f} at the end: "
        "the machine is shared); decode: eccodes, one process, HOT (files read once before timing; the ingests "
        "read them hot too); ingest times include the cluster start"
    )
    if rows:
        print_rows(
            rows,
            [
                "grid",
                "dates",
                "messages",
                "decoded_MB",
                "store_MB",
                "decode_hot_s",
                "grib_ingest_s",
                "cluster_s",
                "zarr_ingest_s",
                "grib_ingest_MB_per_s",
                "zarr_ingest_MB_per_s",
                "peak_rss_MB",
                "grib_ingest_over_decode",
            ],
        )
    headline = rows.get("ens10_0.5deg", rows.get("default_5deg", {}))
    if "breakdown_one_date_s" in headline:
        parts = headline["breakdown_one_date_s"]
        print("one 0.5 deg init date's task, in one process (s): " + "  ".join(f"{k}={v}" for k, v in parts.items()))
    summary: dict[str, Any] = (
        {
            "grib_ingest_over_decode": headline.get("grib_ingest_over_decode"),
            "zarr_ingest_MB_per_s": headline.get("zarr_ingest_MB_per_s"),
            "peak_worker_rss_MB": headline.get("peak_rss_MB"),
        }
        if headline
        else {}
    )
    anemoi = headline.get("anemoi_peer", {})
    if anemoi:
        ingest_anemoi.print_peer(anemoi)
    for key in ("ingest_over_anemoi", "ingest_over_decode", "store_per_date_over_anemoi"):
        summary[key] = anemoi.get(key, "n/a")
    cost = regrid_cost() if rows else {}
    if cost:
        summary["regrid_ms_per_field"] = cost["regrid_bilinear_ms_per_field"]
        print(f"{'regrid 0.25 -> 0.5 deg (ms per field, 1 core)':<48}" + "".join(f"{k}={v} " for k, v in cost.items()))
    proj: list[dict[str, Any]] = []
    if scale:
        print(
            f"\nscale run: full ENS-10 shape (0.5 deg, 11 levels, 18 variables, 10 members, 3 steps), "
            f"{scale['dates']} init dates, {scale['workers']} workers x 1 thread (memory limit "
            f"{scale['memory_limit_per_worker']} each, one init date per task), {cores} cores"
        )
        print_rows(
            {"scale": scale},
            [
                "dates",
                "dates_done",
                "GB_in",
                "decoded_GB",
                "store_GB",
                "decode_hot_s",
                "ingest_s",
                "cluster_s",
                "steady_s_per_date",
                "GRIB_MB_per_s",
                "decoded_MB_per_s",
                "peak_rss_MB_per_worker",
                "ingest_over_decode",
                "completed",
            ],
            first="run",
        )
        print(
            f"seconds per finished init date: {scale['date_s']}"
            + (f"; failed: {scale['error']}" if scale["error"] else "")
        )
        proj = projection(scale, args.fs_gbps)
        print(
            f"\nprojection, whole ENS-10 ({ENS10_DATES} init dates, {ENS10_GRIB_BYTES / 1e12:.2f} TB of GRIB), "
            f"one core per worker at the measured rate; file system assumed {args.fs_gbps} GB/s in all "
            "(GRIB read + store written)"
        )
        print_rows(
            {str(r["workers"]): r for r in proj},
            ["cpu_bound_h", "fs_bound_h", "projected_h", "limit", "peak_RAM_GB"],
            first="workers",
        )
        summary |= {
            "grib_ingest_over_decode": scale["ingest_over_decode"],
            "scale_dates": scale["dates"],
            "scale_GB_in": scale["GB_in"],
            "scale_ingest_s": scale["ingest_s"],
            "scale_MB_per_s": scale["GRIB_MB_per_s"],
            "scale_peak_worker_rss_MB": scale["peak_rss_MB_per_worker"],
            "ens10_h_64_workers": proj[-1]["projected_h"],
        }
    io.write_json(
        args.out,
        {
            "cases": rows,
            "workers": args.workers,
            "cores": cores,
            "load_average": load,
            "load_average_start_end": [args.load_start, os.getloadavg()],
            "zarrs": io.ZARRS_IN_USE,
            "scale": scale,
            "projection": proj,
            "regrid": cost,
            "fs_gbps_assumed": args.fs_gbps,
            "summary": summary,
        },
    )
    print("RESULT " + " ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
