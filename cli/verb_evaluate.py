"""``postcast evaluate``: score checkpoints, the raw ensemble and the oracle
(:mod:`postcast.pipeline.verify.evaluate`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from postcast.common import Subparsers, progress, str_tuple
from postcast.datasets.core.errors import MissingInputError


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "evaluate",
        help="score checkpoints against the raw ensemble and the oracle; write metrics + report",
        description="Score trained post-processors, the raw ensemble (as a Gaussian and as members, fair and "
        "standard CRPS) and, on synthetic data, the oracle on one split at every lead with truth: "
        "CRPS and EECRPS (unweighted, ENS-10; area-weighted, WeatherBench 2), skill and gap closed, "
        "spread/skill, rank and PIT histograms, bias, per region, the CRPS decomposition and "
        "reliability diagrams, with Diebold-Mariano tests and stationary-bootstrap CIs against the raw "
        "ensemble (docs/verification.md). Writes OUT/results.nc (the results dataset), "
        "OUT/metrics.json, OUT/report.html and OUT/report.md with PNG figures.",
        epilog="examples:\n  postcast evaluate data/store.zarr --checkpoints runs/*/lightning_logs/version_0/"
        "checkpoints/best*.ckpt\n"
        "  postcast evaluate data/store.zarr --targets t2m --split val --out reports/val",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", help="training store written by `postcast ingest`")
    p.add_argument("--checkpoints", nargs="*", default=[], help="checkpoints from `postcast train fit`")
    p.add_argument("--targets", type=str_tuple, help="comma-separated (default: the checkpoints' targets)")
    p.add_argument("--split", default="test", choices=["train", "val", "test"], help="default test")
    p.add_argument("--out", default="reports/eval", help="output directory (default reports/eval)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (default 1000)")
    add_cluster_arguments(p, "score the dates", "a small store")


def add_cluster_arguments(p: argparse.ArgumentParser, work: str, small: str) -> None:
    """--scheduler, --workers and --threads: where ``work`` runs (a dask cluster given as for ingest, a
    LocalCluster, or this process for ``small`` inputs)."""
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS|FILE",
        help=f"{work} on an existing dask.distributed scheduler: its address (tcp://HOST:PORT) or the scheduler "
        "file that `dask scheduler --scheduler-file FILE`, dask-jobqueue or dask-mpi write (as for ingest; one "
        "that does not answer within 10 s exits 66)",
    )
    p.add_argument("--workers", type=int, help=f"local dask workers (0: in this process; default 2, or 0 for {small})")
    p.add_argument(
        "--threads",
        dest="processes",
        action="store_false",
        help="run the local dask workers as threads in this process",
    )


def run(a: argparse.Namespace) -> int:
    missing = [c for c in [a.store, *a.checkpoints] if not Path(c).exists()]
    if missing:  # before the heavy imports: a missing file is answered at once
        msg = f"not found: {', '.join(missing)}"
        raise MissingInputError(msg)

    from postcast.pipeline.verify.evaluate import EvalConfig, evaluate

    cfg = EvalConfig(
        store=a.store,
        checkpoints=tuple(a.checkpoints),
        targets=a.targets,
        split=a.split,
        out=a.out,
        bootstrap=a.bootstrap,
        scheduler=a.scheduler,
        workers=a.workers,
        processes=a.processes,
    )
    res = evaluate(cfg, progress=progress(a.progress, "checkpoints"))
    for target, r in res["targets"].items():
        for f, regions in r["forecasts"].items():
            g = regions["global"]
            print(
                f"{target:5} {f:14} CRPS {g['crps']:.4g}  skill {100 * g['skill_vs_raw']:+.1f}%  "
                f"gap closed {100 * g.get('gap_closed', float('nan')):.0f}%"
            )
    print(f"report: {Path(a.out) / 'report.html'}")
    return 0
