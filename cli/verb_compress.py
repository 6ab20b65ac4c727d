"""``postcast compress``, ``decompress`` and ``compress-report``: neural-field artefacts of fields
(:mod:`postcast.compression`). One module for the three: ``run`` answers the one that was given."""

from __future__ import annotations

import argparse

from postcast.common import Subparsers, float_list
from postcast.datasets.core.errors import ConfigError


def add_parser(sub: Subparsers) -> None:
    _add_compress(sub)
    _add_decompress(sub)
    _add_compress_report(sub)


def run(a: argparse.Namespace) -> int:
    verbs = {"compress": _compress, "decompress": _decompress, "compress-report": _compress_report}
    return verbs[a.command](a)


def _add_compress(sub: Subparsers) -> None:
    p = sub.add_parser(
        "compress",
        help="fit a neural field (coordinate network) to fields of a store or file",
        description="Fit a coordinate network (Fourier features + residual GELU MLP) to one or more variables "
        "and write one self-describing artefact (weights, Fourier matrices, normalisation, grid, "
        "format version, measured errors). With --error-bound an SZ3 residual layer guarantees "
        "the maximum absolute error.",
        epilog="examples:\n  postcast compress data/store.zarr --var truth_t850 --out t850.pcnf\n"
        "  postcast compress data/store.zarr --var ens_mean_t --level 850 --width 64 --out t850m.pcnf\n"
        "  postcast compress data/store.zarr --var truth_z500 --error-bound 5 --out z500.pcnf\n"
        "  postcast compress data/store.zarr --var truth_t850 --var ens_mean_t --level 850 "
        "--error-bound-var truth_t850=0.1 --out t850.pcnf",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", help="zarr store or netCDF file")
    p.add_argument("--var", dest="variables", action="append", required=True, help="variable (repeatable)")
    p.add_argument("--level", dest="levels", action="append", type=int, default=[], help="hPa (repeatable)")
    p.add_argument("--step-hours", type=int, default=48, help="lead time when the source has one (default 48)")
    p.add_argument("--member", default="mean", help="'mean' (ensemble mean) or a member index, for member fields")
    p.add_argument("--out", required=True, help="artefact path (.pcnf)")
    p.add_argument("--width", type=int, default=48, help="neurons per hidden layer")
    p.add_argument("--depth", type=int, default=3, help="residual blocks")
    p.add_argument("--steps", type=int, default=2000, help="optimiser steps")
    p.add_argument("--sigma", type=float, default=1.6, help="std of the Fourier matrices")
    p.add_argument(
        "--weights",
        default="fp16",
        choices=["fp16", "int8", "fp32", "q8", "q6", "q4"],
        help="weight storage: int8 one scale per matrix; qN N bits with one scale per row",
    )
    p.add_argument("--entropy", default="none", choices=["none", "lzma"], help="lossless coding of the artefact")
    p.add_argument("--error-bound", type=float, help="guaranteed max absolute error (data units), via SZ3")
    p.add_argument(
        "--error-bound-var",
        action="append",
        default=[],
        metavar="VAR=BOUND",
        help="a bound for one variable (repeatable; overrides --error-bound for it)",
    )
    p.add_argument(
        "--error-bound-std",
        type=float,
        metavar="FRACTION",
        help="guaranteed max absolute error as a fraction of each variable's weighted std, e.g. 0.1 "
        "(weighted RMSE / std then stays <= 0.1), for variables without an absolute bound",
    )
    p.set_defaults(input_path="source")


def _var_bound(item: str) -> tuple[str, float]:
    name, sep, value = item.partition("=")
    try:
        if not sep or not name:
            raise ValueError(item)
        return name, float(value)
    except ValueError as err:
        msg = f"--error-bound-var {item!r}: give VAR=BOUND in the variable's units, e.g. truth_t850=0.1"
        raise ConfigError(msg) from err


def _compress(a: argparse.Namespace) -> int:
    from postcast.compression.artefact import Artefact
    from postcast.compression.field import FieldConfig, to_fields
    from postcast.compression.report import Selection, select

    per_var = dict(_var_bound(item) for item in a.error_bound_var)
    cfg = FieldConfig(
        width=a.width,
        depth=a.depth,
        steps=a.steps,
        sigma=a.sigma,
        weights=a.weights,
        entropy=a.entropy,
        error_bound=a.error_bound,
        error_bounds=per_var,
        error_bound_std=a.error_bound_std,
    )  # checks its values (ConfigError)
    sel = Selection(a.source, tuple(a.variables), tuple(a.levels), a.step_hours, a.member)
    fields = to_fields(select(sel))
    try:
        cfg.bounds_for(fields.variables)  # before the fit: a misspelt variable costs nothing
    except ConfigError as err:
        msg = f"--error-bound-var: {err}"
        raise ConfigError(msg) from err
    art = Artefact.build(fields, cfg, progress=a.progress)
    art.header["selection"] = sel.to_dict()
    size = art.save(a.out)
    errs = art.header["errors"]
    print(
        f"{a.out}: {size} bytes, ratio {art.ratio:.1f}x; "
        + "; ".join(
            f"{v}: wRMSE {e['wrmse']:.4g}, max {e['max_abs']:.4g}"
            for v, e in zip(art.header["variables"], errs.values(), strict=True)
        )
    )
    return 0


def _add_decompress(sub: Subparsers) -> None:
    p = sub.add_parser(
        "decompress",
        help="decode an artefact to netCDF or zarr (optionally on another grid)",
        description="Decode every (time, level) slice of an artefact on its own grid, or with --resolution on "
        "a regular latitude/longitude grid of that spacing (the network is continuous: regridding "
        "is free; the error-bounded layer applies on the stored grid only).",
        epilog="example:\n  postcast decompress t850.pcnf --out t850.nc --resolution 1.0",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("artefact")
    p.add_argument("--out", required=True, help=".nc or .zarr")
    p.add_argument("--resolution", type=float, help="degrees of a regular output grid")


def _decompress(a: argparse.Namespace) -> int:
    from postcast.compression.artefact import Artefact, write_decoded

    art = Artefact.load(a.artefact)
    ds = art.decode() if a.resolution is None else art.regrid(a.resolution)
    write_decoded(ds, a.out)  # atomic: a failed write leaves nothing openable at --out
    print(f"{a.out}: {', '.join(map(str, ds.data_vars))} on {ds.sizes['latitude']} x {ds.sizes['longitude']}")
    return 0


def _add_compress_report(sub: Subparsers) -> None:
    p = sub.add_parser(
        "compress-report",
        help="compare artefacts with SZ3 and ZFP on the same fields",
        description="Decode each artefact, reopen its source fields (recorded in the artefact) and print ratio, "
        "cos-latitude weighted RMSE, MAE, max abs error, PSNR and throughput next to SZ3 (absolute "
        "bounds) and ZFP (tolerance and rate) on the same arrays.",
        epilog="example:\n  postcast compress-report t850_w32.pcnf t850_w64.pcnf --sz3 0.05,0.2,1 --zfp-rate 2,4 "
        "--plot ratio_vs_rmse.png",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("artefacts", nargs="+")
    p.add_argument("--sz3", type=float_list, default=[0.1, 0.5, 2.0], help="absolute bounds (comma-separated)")
    p.add_argument(
        "--zfp-tolerance", type=float_list, default=[0.5, 2.0], help="ZFP absolute tolerances (comma-separated)"
    )
    p.add_argument("--zfp-rate", type=float_list, default=[1.0, 4.0], help="bits per value")
    p.add_argument("--plot", help="write the ratio-vs-wRMSE plot here (PNG)")
    p.add_argument("--json", help="write the rows as JSON here")


def _compress_report(a: argparse.Namespace) -> int:
    from postcast.compression import report
    from postcast.datasets import io

    rows = report.compare(a.artefacts, a.sz3, a.zfp_tolerance, a.zfp_rate)
    print(report.format_table(rows))
    if a.plot:
        report.plot(rows, a.plot)
    if a.json:
        io.write_json(a.json, rows)
    return 0
