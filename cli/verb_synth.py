"""``postcast synth``: synthetic ENS-10 data with a known oracle (:mod:`postcast.datasets.synth`)."""

from __future__ import annotations

import argparse

from postcast.common import Subparsers, int_tuple, log, str_tuple, year_range


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "synth",
        help="generate synthetic ENS-10 data with a known oracle",
        description="Generate ENS-10-style forecasts (10 members, steps 0/24/48 h) and ERA5-like truth whose "
        "true predictive distribution is known (written as oracle_mean/oracle_std). Deterministic "
        "for a seed; reruns skip files that exist.",
        epilog="examples:\n  postcast synth --out data/synth\n"
        "  postcast synth --out data/grib --format grib --years 2015:2017 --dates-per-year 4\n"
        "  postcast synth -c configs/synth/ens10_full.yaml --out /scratch/ens10  # 0.5 deg, lazily",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("-c", "--config", help="YAML preset (kind: synth), e.g. configs/synth/quickstart.yaml")
    p.add_argument("--seed", type=int, help="random seed (default 0)")
    p.add_argument("--resolution", type=float, help="grid spacing in degrees (default 5; ENS-10 is 0.5)")
    p.add_argument("--years", type=year_range, help="reforecast years START:END (default 1998:2017)")
    p.add_argument("--dates-per-year", type=int, help="init month-days per year, 1..105 (default 8)")
    p.add_argument("--levels", type=int_tuple, help="pressure levels in hPa, e.g. 500,850 (default)")
    p.add_argument(
        "--variables", type=str_tuple, help="forecast variables to write, e.g. t,z (canonical names; default all 18)"
    )
    p.add_argument("--format", choices=["zarr", "grib", "netcdf"], help="on-disk form (default zarr)")


def run(a: argparse.Namespace) -> int:
    from postcast.datasets.core import config
    from postcast.datasets.synth import synthfiles
    from postcast.datasets.synth.synthetic import SynthConfig

    over = {
        "seed": a.seed,
        "resolution": a.resolution,
        "years": a.years,
        "dates_per_year": a.dates_per_year,
        "levels": a.levels,
        "format": a.format,
        "variables": a.variables,
    }
    cfg = (
        config.load(a.config, "synth", **over)
        if a.config
        else config.from_dict(SynthConfig, {k: v for k, v in over.items() if v is not None}, where="synth options")
    )
    log.info(
        "synthesising %d init dates on a %dx%d grid -> %s (%s)", len(cfg.init_times), *cfg.grid.shape, a.out, cfg.format
    )
    manifest = synthfiles.write_synthetic(cfg, a.out, progress=a.progress)
    log.info("done in %.1f s: %s", manifest["seconds"], ", ".join(manifest["files"][:6]))
    return 0
