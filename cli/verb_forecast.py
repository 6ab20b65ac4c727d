"""``postcast forecast``: a checkpoint applied to new raw ensembles -> CF forecast files
(:mod:`postcast.pipeline.forecast`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from postcast.common import Subparsers, float_tuple, str_tuple
from postcast.datasets.core.errors import MissingInputError
from postcast.verb_evaluate import add_cluster_arguments


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "forecast",
        help="apply a checkpoint to new raw ensembles; write CF-compliant calibrated forecasts",
        description="Read the raw ensemble (GRIB, netCDF or zarr) for one init time or a range, apply a trained "
        "post-processor and write, per init time, OUT/<product>/<model>/<target>/<target>_<YYYYmmddTHH>.nc "
        "with mean, std, quantiles and exceedance probabilities (CF-1.8 metadata, provenance). "
        "product is 'postprocessed', or 'fallback_raw' (flagged) when the "
        "model's inputs are missing: the raw members' own law in the target's family (Gaussian for z500, "
        "t850 and t2m, truncated normal for ws10, censored shifted gamma for tp24). Existing outputs are kept: "
        "reruns are idempotent.",
        epilog="examples:\n  postcast forecast --checkpoint runs/unet_t850/.../best.ckpt --input /data/ens/20170102 "
        "--init-time 2017-01-02 --out /data/forecasts\n"
        "  postcast forecast --checkpoint C --input data/synth --init-time 2017-01-01 --end 2017-12-31 "
        "--thresholds 273.15 --format netcdf,zarr --out forecasts",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--checkpoint", required=True, help="checkpoint from `postcast train fit`")
    p.add_argument("--input", required=True, help="raw forecasts: ENS-10 GRIB directory, netCDF or zarr")
    p.add_argument("--init-time", required=True, help="first init time, e.g. 2017-01-02 or 2017-01-02T00")
    p.add_argument("--end", help="last init time (inclusive); default: only --init-time")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--quantiles", type=float_tuple, help="comma-separated probability levels (default 0.05..0.95)")
    p.add_argument("--thresholds", type=float_tuple, default=(), help="exceedance thresholds in the target's units")
    p.add_argument("--format", type=str_tuple, default=("netcdf",), help="netcdf and/or zarr (default netcdf)")
    p.add_argument("--overwrite", action="store_true", help="rewrite outputs that exist")
    p.add_argument(
        "--regrid-method",
        default="bilinear",
        choices=("bilinear", "nearest", "conservative"),
        help="inputs on another grid than the checkpoint's are regridded to it (default bilinear)",
    )
    p.add_argument(
        "--on-input-grid",
        action="store_true",
        help="write the products back on the input's grid (regular inputs, global or regional) "
        "instead of the checkpoint's",
    )
    p.add_argument(
        "--name",
        help="the model's name in the output paths (default: its model family, e.g. unet); "
        "give each model its own so their products never share a file",
    )
    add_cluster_arguments(p, "forecast the init times", "at most 8 init times")
    p.set_defaults(input_path="input")


def run(a: argparse.Namespace) -> int:
    if not Path(a.checkpoint).exists():  # before the heavy imports: a missing file is answered at once
        msg = f"checkpoint {a.checkpoint}: no such file"
        raise MissingInputError(msg)

    from postcast.pipeline.forecast import DEFAULT_QUANTILES, ForecastConfig, forecast

    cfg = ForecastConfig(
        checkpoint=a.checkpoint,
        input=a.input,
        out=a.out,
        init_time=a.init_time,
        end=a.end,
        quantiles=a.quantiles or DEFAULT_QUANTILES,
        thresholds=a.thresholds,
        formats=a.format,
        overwrite=a.overwrite,
        name=a.name,
        regrid_method=a.regrid_method,
        on_input_grid=a.on_input_grid,
        scheduler=a.scheduler,
        workers=a.workers,
        processes=a.processes,
    )
    res = forecast(cfg)
    print(f"written {len(res.written)} ({len(res.fallback)} fallback), kept {len(res.skipped)} existing")
    return 0
