"""``postcast ingest``: raw forecasts (+ truth) -> the training store (:mod:`postcast.datasets.ingest`)."""

from __future__ import annotations

import argparse
from typing import Any

from postcast.common import Subparsers, int_tuple, str_tuple, year_range
from postcast.datasets.core.errors import ConfigError


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "ingest",
        help="raw forecasts (+ truth) -> canonical training store (zarr 3)",
        description="Read ENS-10 GRIB, netCDF or zarr forecasts and ERA5-like truth, normalise conventions, "
        "check completeness and values, and write the training store with per-sample ensemble "
        "mean/std and training-year statistics. Runs on dask.distributed; interrupted runs resume.",
        epilog="examples:\n  postcast ingest data/synth --out data/store.zarr\n"
        "  postcast ingest /data/ens10 --truth /data/era5 --out ens10.zarr --levels 500,850\n"
        "  postcast ingest data/synth --out s.zarr --scheduler tcp://10.0.0.5:8786",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "source",
        nargs="?",
        help="directory written by `postcast synth`, ENS-10 GRIB/netCDF files, or a zarr store (optional with -c)",
    )
    p.add_argument("--out", help="store path, e.g. data/store.zarr (optional with -c)")
    p.add_argument("-c", "--config", help="YAML preset (kind: ingest)")
    p.add_argument("--truth", help="ERA5-like truth (netCDF file/directory or zarr); default: found next to SOURCE")
    _selection_arguments(p)
    p.add_argument("--train-years", type=year_range, help="statistics/training years (default 1998:2013)")
    p.add_argument("--val-years", type=year_range, help="validation years (default 2014:2015)")
    p.add_argument("--test-years", type=year_range, help="test years (default 2016:2017)")
    _cluster_arguments(p)
    p.add_argument("--overwrite", action="store_true", default=None, help="rebuild even if OUT is complete")
    p.add_argument(
        "--restart", action="store_true", default=None, help="discard an interrupted ingest made with other settings"
    )


def _selection_arguments(p: argparse.ArgumentParser) -> None:
    """What the store holds of the source: variables, levels, members, steps, and its grid."""
    p.add_argument(
        "--variables", type=str_tuple, help="required variables (default: the ENS-10 variables the source has)"
    )
    p.add_argument("--levels", type=int_tuple, help="required levels in hPa (default: those in the source)")
    p.add_argument(
        "--members",
        help="members: a count (10), an inclusive range (0:9, 1:50) or all (default: all "
        "the source has; 0 is the control in ECMWF files)",
    )
    p.add_argument("--steps", type=int_tuple, help="lead times in hours, e.g. 0,24,48 (default: those in the source)")
    p.add_argument(
        "--grid",
        type=float,
        help="store resolution in degrees, e.g. 1 or 0.5, over the source's area "
        "(default: the source's own regular grid, global or regional, or "
        "the closest resolution for other grids)",
    )
    p.add_argument(
        "--regrid-method",
        choices=("bilinear", "nearest", "conservative"),
        help="regridding when the source is on another grid (default bilinear)",
    )


def _cluster_arguments(p: argparse.ArgumentParser) -> None:
    """Where the ingest runs: an existing dask scheduler, or local workers (processes or threads)."""
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS|FILE",
        help="an existing dask.distributed scheduler: its address (tcp://HOST:PORT) or the scheduler "
        "file that `dask scheduler --scheduler-file FILE`, dask-jobqueue or dask-mpi write; a "
        "missing or unreadable file, or a scheduler that does not answer within 10 s, exits 66 "
        "(the input is not there yet: start the scheduler and rerun; not a usage error, 2)",
    )
    p.add_argument("--workers", type=int, help="local dask workers (default 2)")
    p.add_argument(
        "--threads",
        dest="processes",
        action="store_false",
        default=None,
        help="run the local dask workers as threads in this process (fast start for small inputs)",
    )


def run(a: argparse.Namespace) -> int:
    from postcast.datasets.core import config
    from postcast.datasets.ingest.run import IngestConfig, ingest

    splits = {k: list(v) for k, v in (("train", a.train_years), ("val", a.val_years), ("test", a.test_years)) if v}
    over: dict[str, Any] = {
        "source": a.source,
        "out": a.out,
        "truth": a.truth,
        "variables": a.variables,
        "levels": a.levels,
        "members": a.members,
        "steps": a.steps,
        "grid": a.grid,
        "regrid_method": a.regrid_method,
        "scheduler": a.scheduler,
        "workers": a.workers,
        "processes": a.processes,
        "overwrite": a.overwrite,
        "restart": a.restart,
        "splits": splits or None,
        "progress": a.progress,
    }
    if a.config:
        cfg = config.load(a.config, "ingest", **over)
    elif not (a.source and a.out):
        msg = "ingest needs SOURCE and --out (or a preset with -c)"
        raise ConfigError(msg)
    else:
        cfg = config.from_dict(IngestConfig, {k: v for k, v in over.items() if v is not None}, where="ingest options")
    result = ingest(cfg)
    if result.skipped:
        print(f"{result.store}: already complete, nothing to do")
    else:
        print(f"{result.store}: {result.n_written} of {result.n_dates} init dates written in {result.seconds:.1f} s")
    return 0
