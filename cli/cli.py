"""The ``postcast`` command line: one entry point, one small adapter per verb.

Each verb turns flags (and an optional YAML preset) into a typed config and calls one library
function. Exit codes: :data:`postcast.datasets.core.errors.EXIT_CODES`. :func:`main` is the one place
that turns exceptions into exit codes and the one-line ``postcast: error: ...`` (see
:func:`exit_code`): the library raises a ``PostcastError`` subclass where it finds an expected
problem (bad usage, bad or missing input, an unwritable output); anything else is a bug (exit 70).
``set_defaults(input_path=<argument naming the input>)`` names the input in the line of a plain
I/O error.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import postcast
from postcast.datasets.core.errors import (
    EXIT_CODES,
    BadInputError,
    ConfigError,
    MissingInputError,
    OutputError,
    PostcastError,
)

log = logging.getLogger("postcast")
INTERRUPTED = 130  # exit code after Ctrl-C (128 + SIGINT)
INTERNAL = 70  # EX_SOFTWARE: a bug in postcast, never the user's data

EPILOG = """\
quickstart (synthetic ENS-10, coarse grid), all stages at once:
  postcast run configs/quickstart.yaml
or step by step:
  postcast synth --out data/synth
  postcast ingest data/synth --out data/store.zarr
  postcast inspect data/store.zarr
  postcast train fit -c configs/train/unet_t850.yaml
  postcast evaluate data/store.zarr --checkpoints runs/unet_t850/lightning_logs/version_0/checkpoints/best*.ckpt

exit codes:
""" + "\n".join(f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES.items()) + "\n"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; every option's help ends with its default where it has one
    and does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.option_strings and not action.required and "default" not in text
        if shown and action.default not in (None, False, [], (), argparse.SUPPRESS):
            text += " (default: %(default)s)"
        return text


def _int_tuple(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as err:
        msg = f"expected comma-separated integers, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from err


def _str_tuple(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _year_range(text: str) -> tuple[int, int]:
    parts = _int_tuple(text.replace(":", ","))
    if len(parts) != 2:
        msg = f"expected START:END years, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return (parts[0], parts[1])


# --- synth ---------------------------------------------------------------------------------------
def _add_synth(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synth", help="generate synthetic ENS-10 data with a known oracle",
        description="Generate ENS-10-style forecasts (10 members, steps 0/24/48 h) and ERA5-like truth whose "
                    "true predictive distribution is known (written as oracle_mean/oracle_std). Deterministic "
                    "for a seed; reruns skip files that exist.",
        epilog="examples:\n  postcast synth --out data/synth\n"
               "  postcast synth --out data/grib --format grib --years 2015:2017 --dates-per-year 4\n"
               "  postcast synth -c configs/synth/ens10_full.yaml --out /scratch/ens10  # 0.5 deg, lazily",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("-c", "--config", help="YAML preset (kind: synth), e.g. configs/synth/quickstart.yaml")
    p.add_argument("--seed", type=int, help="random seed (default 0)")
    p.add_argument("--resolution", type=float, help="grid spacing in degrees (default 5; ENS-10 is 0.5)")
    p.add_argument("--years", type=_year_range, help="reforecast years START:END (default 1998:2017)")
    p.add_argument("--dates-per-year", type=int, help="init month-days per year, 1..105 (default 8)")
    p.add_argument("--levels", type=_int_tuple, help="pressure levels in hPa, e.g. 500,850 (default)")
    p.add_argument("--format", choices=["zarr", "grib", "netcdf"], help="on-disk form (default zarr)")
    p.set_defaults(func=_run_synth)


def _run_synth(a: argparse.Namespace) -> int:
    from postcast.datasets.core import config
    from postcast.datasets.synth import synthfiles
    from postcast.datasets.synth.synthetic import SynthConfig

    over = {"seed": a.seed, "resolution": a.resolution, "years": a.years, "dates_per_year": a.dates_per_year,
            "levels": a.levels, "format": a.format}
    cfg = config.load(a.config, "synth", **over) if a.config else config.from_dict(
        SynthConfig, {k: v for k, v in over.items() if v is not None}, where="synth options")
    log.info("synthesising %d init dates on a %dx%d grid -> %s (%s)", len(cfg.init_times), *cfg.grid.shape,
             a.out, cfg.format)
    manifest = synthfiles.write_synthetic(cfg, a.out, progress=a.progress)
    log.info("done in %.1f s: %s", manifest["seconds"], ", ".join(manifest["files"][:6]))
    return 0


# --- ingest --------------------------------------------------------------------------------------
def _add_ingest(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ingest", help="raw forecasts (+ truth) -> canonical training store (zarr 3)",
        description="Read ENS-10 GRIB, netCDF or zarr forecasts and ERA5-like truth, normalise conventions, "
                    "check completeness and values, and write the training store with per-sample ensemble "
                    "mean/std and training-year statistics. Runs on dask.distributed; interrupted runs resume.",
        epilog="examples:\n  postcast ingest data/synth --out data/store.zarr\n"
               "  postcast ingest /data/ens10 --truth /data/era5 --out ens10.zarr --levels 500,850\n"
               "  postcast ingest data/synth --out s.zarr --scheduler tcp://10.0.0.5:8786",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", nargs="?",
                   help="directory written by `postcast synth`, ENS-10 GRIB/netCDF files, or a zarr store "
                        "(optional with -c)")
    p.add_argument("--out", help="store path, e.g. data/store.zarr (optional with -c)")
    p.add_argument("-c", "--config", help="YAML preset (kind: ingest)")
    p.add_argument("--truth", help="ERA5-like truth (netCDF file/directory or zarr); default: found next to SOURCE")
    p.add_argument("--variables", type=_str_tuple, help="required variables (default: the ENS-10 variables the "
                                                         "source has)")
    p.add_argument("--levels", type=_int_tuple, help="required levels in hPa (default: those in the source)")
    p.add_argument("--members", help="members: a count (10), an inclusive range (0:9, 1:50) or all (default: all "
                                     "the source has; 0 is the control in ECMWF files)")
    p.add_argument("--steps", type=_int_tuple, help="lead times in hours, e.g. 0,24,48 (default: those in the source)")
    p.add_argument("--grid", type=float, help="store resolution in degrees, e.g. 1 or 0.5, over the source's area "
                                              "(default: the source's own regular grid, global or regional, or "
                                              "the closest resolution for other grids)")
    p.add_argument("--regrid-method", choices=("bilinear", "nearest", "conservative"),
                   help="regridding when the source is on another grid (default bilinear)")
    p.add_argument("--train-years", type=_year_range, help="statistics/training years (default 1998:2013)")
    p.add_argument("--val-years", type=_year_range, help="validation years (default 2014:2015)")
    p.add_argument("--test-years", type=_year_range, help="test years (default 2016:2017)")
    p.add_argument("--scheduler", metavar="ADDRESS|FILE",
                   help="an existing dask.distributed scheduler: its address (tcp://HOST:PORT) or the scheduler "
                        "file that `dask scheduler --scheduler-file FILE`, dask-jobqueue or dask-mpi write; a "
                        "missing or unreadable file, or a scheduler that does not answer within 10 s, exits 66 "
                        "(the input is not there yet: start the scheduler and rerun; not a usage error, 2)")
    p.add_argument("--workers", type=int, help="local dask workers (default 2)")
    p.add_argument("--threads", dest="processes", action="store_false", default=None,
                   help="run the local dask workers as threads in this process (fast start for small inputs)")
    p.add_argument("--overwrite", action="store_true", default=None, help="rebuild even if OUT is complete")
    p.add_argument("--restart", action="store_true", default=None,
                   help="discard an interrupted ingest made with other settings")
    p.set_defaults(func=_run_ingest)


def _run_ingest(a: argparse.Namespace) -> int:
    from postcast.datasets.core import config
    from postcast.datasets.ingest.run import IngestConfig, ingest

    splits = {k: list(v) for k, v in (("train", a.train_years), ("val", a.val_years), ("test", a.test_years)) if v}
    over: dict[str, Any] = {"source": a.source, "out": a.out, "truth": a.truth, "variables": a.variables,
                            "levels": a.levels, "members": a.members, "steps": a.steps, "grid": a.grid,
                            "regrid_method": a.regrid_method, "scheduler": a.scheduler,
                            "workers": a.workers, "processes": a.processes, "overwrite": a.overwrite,
                            "restart": a.restart, "splits": splits or None, "progress": a.progress}
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


# --- inspect -------------------------------------------------------------------------------------
def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="summarise a training store, or what a GRIB/netCDF file holds",
                       description="Dims, variables, dates, splits, completeness and statistics of a store; for a "
                                   "raw GRIB or netCDF file, its parameters (GRIB shortName, paramId, postcast name "
                                   "or 'not in schema'), levels, members, steps, step types and grid.")
    p.add_argument("store", help="a store written by `postcast ingest`, or a GRIB or netCDF file")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--verify", action="store_true",
                   help="read every chunk and check it against the checksums recorded at ingest "
                        "(exit 65 when a chunk is missing or damaged)")
    p.set_defaults(func=_run_inspect)


def _run_inspect(a: argparse.Namespace) -> int:
    from postcast.datasets import inspection

    info = inspection.summary(a.store, verify=a.verify)
    print(json.dumps(info, indent=2, default=str) if a.json else inspection.render(info))
    problem = (info.get("verify") or {}).get("problem")
    if problem:
        raise BadInputError(problem)
    return 0 if info.get("complete", "kind" in info) else 66  # a raw file ("kind") has no completeness


# --- config --------------------------------------------------------------------------------------
def _add_config(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="validate configuration presets",
                       description="Check YAML presets against their typed schema (kind: synth | ingest | ...).")
    csub = p.add_subparsers(dest="config_cmd", required=True)
    v = csub.add_parser("validate", help="validate one or more YAML files")
    v.add_argument("files", nargs="+")
    v.set_defaults(func=_run_config_validate)


def _run_config_validate(a: argparse.Namespace) -> int:
    # every module that owns a config kind registers it on import (kind: synth, ingest, pipeline)
    import postcast.datasets.ingest.run
    import postcast.datasets.synth.synthetic
    import postcast.pipeline.run  # noqa: F401
    from postcast.datasets.core import config

    worst = 0
    for f in a.files:
        if config.is_lightning_preset(f):
            from postcast.pipeline.train import validate_preset

            problem = validate_preset(f)
            if problem is None:
                print(f"{f}: ok (Lightning CLI training preset)")
            else:
                print(f"{f}: INVALID: {problem}", file=sys.stderr)
                worst = max(worst, 2)
            continue
        try:
            cfg = config.load(f)
            print(f"{f}: ok ({type(cfg).__name__})")
        except PostcastError as err:
            print(f"{f}: INVALID: {err}", file=sys.stderr)
            worst = max(worst, err.exit_code)
    return worst


# --- train ---------------------------------------------------------------------------------------
def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train a post-processor with the Lightning CLI (fit, validate, test, predict)",
        description="The Lightning CLI over a postcast store: `postcast train fit -c configs/train/mlp_t850.yaml`. "
                    "Everything after `train` goes to Lightning; `postcast train fit --help` lists all options.",
        add_help=False)
    p.add_argument("lightning_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_run_train)


def _run_train(a: argparse.Namespace) -> int:
    from postcast.pipeline.train import run

    try:
        run(a.lightning_args or ["--help"])
    except ValueError as err:  # raised while instantiating the data or model from the configuration
        cause = _postcast_cause(err)
        if cause is not None:
            raise cause from None
        raise ConfigError(str(err)) from err
    return 0


def _postcast_cause(err: BaseException) -> PostcastError | None:
    """The PostcastError behind ``err`` (the Lightning CLI wraps errors raised while linking arguments)."""
    return next((e for e in _chain(err) if isinstance(e, PostcastError)), None)


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the exceptions it was raised from or during, each once (chains can be cycles)."""
    out: list[BaseException] = []
    seen: BaseException | None = err
    while seen is not None and all(seen is not e for e in out):
        out.append(seen)
        seen = seen.__cause__ or seen.__context__
    return out


# --- evaluate ------------------------------------------------------------------------------------
def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate", help="score checkpoints against the raw ensemble and the oracle; write metrics + report",
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
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store", help="training store written by `postcast ingest`")
    p.add_argument("--checkpoints", nargs="*", default=[], help="checkpoints from `postcast train fit`")
    p.add_argument("--targets", type=_str_tuple, help="comma-separated (default: the checkpoints' targets)")
    p.add_argument("--split", default="test", choices=["train", "val", "test"], help="default test")
    p.add_argument("--out", default="reports/eval", help="output directory (default reports/eval)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.set_defaults(func=_run_evaluate)


def _run_evaluate(a: argparse.Namespace) -> int:
    missing = [c for c in [a.store, *a.checkpoints] if not Path(c).exists()]
    if missing:  # before the heavy imports: a missing file is answered at once
        msg = f"not found: {', '.join(missing)}"
        raise MissingInputError(msg)

    from postcast.pipeline.evaluate import EvalConfig, evaluate

    cfg = EvalConfig(store=a.store, checkpoints=tuple(a.checkpoints), targets=a.targets, split=a.split,
                     out=a.out, bootstrap=a.bootstrap)
    if a.targets:
        _check_checkpoint_targets(a.checkpoints, a.targets)
    res = evaluate(cfg, progress=_progress(a.progress, "checkpoints"))
    for target, r in res["targets"].items():
        for f, regions in r["forecasts"].items():
            g = regions["global"]
            print(f"{target:5} {f:14} CRPS {g['crps']:.4g}  skill {100 * g['skill_vs_raw']:+.1f}%  "
                  f"gap closed {100 * g.get('gap_closed', float('nan')):.0f}%")
    print(f"report: {Path(a.out) / 'report.html'}")
    return 0


def _check_checkpoint_targets(checkpoints: Sequence[str], targets: Sequence[str]) -> None:
    """Refuse a checkpoint trained for a target that is not being evaluated (it would be skipped silently)."""
    from postcast.models.module import load_checkpoint

    for path in checkpoints:
        target = load_checkpoint(path)[1]["sample"]["target"]
        if target not in targets:
            msg = f"{path}: a checkpoint for {target}, but --targets is {','.join(targets)}; add {target} or drop it"
            raise ConfigError(msg)


def _progress(enabled: bool, unit: str) -> Callable[[Any], Any]:
    from tqdm.auto import tqdm

    return lambda it: tqdm(it, unit=unit, disable=not enabled)


# --- run -----------------------------------------------------------------------------------------
def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="run the staged pipeline of a YAML config (synth/ingest -> train -> evaluate -> forecast -> "
                    "compress)",
        description="Run every stage of a pipeline config (kind: pipeline): download (optional), synthesise or "
                    "ingest, train each preset, evaluate (metrics and report), batch-forecast the trained models "
                    "(forecast_from..forecast_to, optional) and compress the fields a preset reads (optional). "
                    "WORKDIR/manifest.json records each stage's config hash, inputs and outputs: "
                    "a rerun skips finished stages, --force reruns one, a killed run resumes (training from its "
                    "last.ckpt). Logs: WORKDIR/logs/pipeline.log; summary: WORKDIR/summary.json (each stage's "
                    "time, kept across reruns; each compressed field's errors; the work directory's size).",
        epilog="examples:\n  postcast run configs/quickstart.yaml\n"
               "  postcast run configs/quickstart.yaml --force train:unet_t850\n"
               "  postcast run configs/quickstart.yaml --dry-run",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="pipeline YAML (kind: pipeline)")
    p.add_argument("--force", action="append", default=[], metavar="STAGE",
                   help="rerun this stage even if finished (repeatable; 'all' for every stage)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the stages, whether they would run, and the files a download stage would fetch")
    p.set_defaults(func=_run_run)


def _run_run(a: argparse.Namespace) -> int:
    from postcast.datasets.core import config
    from postcast.pipeline.run import run

    cfg = config.load(a.config, "pipeline")
    summary = run(cfg, force=tuple(a.force), progress=a.progress, dry_run=a.dry_run)
    for name, st in summary["stages"].items():
        print(f"{name:24} {st['status']:10} {st.get('seconds', '')}")
        for f in st.get("files", ()):  # a dry run's download listing
            size = f"~{f['expected_bytes'] / 1e9:.1f} GB" if f["expected_bytes"] else "size unknown"
            print(f"    {f['file']:42} {size:>12}  {'present' if f['present'] else f['url']}")
        if st.get("files"):
            known = sum(f["expected_bytes"] or 0 for f in st["files"])
            print(f"    {len(st['files'])} files, ~{known / 1e12:.2f} TB expected where the size is known")
    if "report" in summary:
        print(f"report: {summary['report']}")
    if not a.dry_run:
        print(f"work directory {summary['workdir']}: {summary['disk_bytes'] / 1e9:.2f} GB in {summary['disk_files']} "
              f"files; the outputs took {summary['seconds']:.0f} s")
    return 0


# --- forecast ------------------------------------------------------------------------------------
def _float_tuple(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as err:
        msg = f"expected comma-separated numbers, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from err


def _add_forecast(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "forecast", help="apply a checkpoint to new raw ensembles; write CF-compliant calibrated forecasts",
        description="Read the raw ensemble (GRIB, netCDF or zarr) for one init time or a range, apply a trained "
                    "post-processor and write, per init time, OUT/<product>/<model>/<target>/<target>_<YYYYmmddTHH>.nc "
                    "with mean, std, quantiles and exceedance probabilities (CF-1.8 metadata, provenance). "
                    "product is 'postprocessed', or 'fallback_raw' (the raw-ensemble Gaussian, flagged) when the "
                    "model's inputs are missing. Existing outputs are kept: reruns are idempotent.",
        epilog="examples:\n  postcast forecast --checkpoint runs/unet_t850/.../best.ckpt --input /data/ens/20170102 "
               "--init-time 2017-01-02 --out /data/forecasts\n"
               "  postcast forecast --checkpoint C --input data/synth --init-time 2017-01-01 --end 2017-12-31 "
               "--thresholds 273.15 --format netcdf,zarr --out forecasts",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint from `postcast train fit`")
    p.add_argument("--input", required=True, help="raw forecasts: ENS-10 GRIB directory, netCDF or zarr")
    p.add_argument("--init-time", required=True, help="first init time, e.g. 2017-01-02 or 2017-01-02T00")
    p.add_argument("--end", help="last init time (inclusive); default: only --init-time")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--quantiles", type=_float_tuple, help="comma-separated probability levels (default 0.05..0.95)")
    p.add_argument("--thresholds", type=_float_tuple, default=(), help="exceedance thresholds in the target's units")
    p.add_argument("--format", type=_str_tuple, default=("netcdf",), help="netcdf and/or zarr (default netcdf)")
    p.add_argument("--overwrite", action="store_true", help="rewrite outputs that exist")
    p.add_argument("--regrid-method", default="bilinear", choices=("bilinear", "nearest", "conservative"),
                   help="inputs on another grid than the checkpoint's are regridded to it (default bilinear)")
    p.add_argument("--on-input-grid", action="store_true",
                   help="write the products back on the input's grid (regular inputs, global or regional) "
                        "instead of the checkpoint's")
    p.add_argument("--name", help="the model's name in the output paths (default: its model family, e.g. unet); "
                                  "give each model its own so their products never share a file")
    p.set_defaults(func=_run_forecast, input_path="input")


def _run_forecast(a: argparse.Namespace) -> int:
    if not Path(a.checkpoint).exists():  # before the heavy imports: a missing file is answered at once
        msg = f"checkpoint {a.checkpoint}: no such file"
        raise MissingInputError(msg)

    from postcast.pipeline.forecast import DEFAULT_QUANTILES, ForecastConfig, forecast
    cfg = ForecastConfig(checkpoint=a.checkpoint, input=a.input, out=a.out, init_time=a.init_time, end=a.end,
                         quantiles=a.quantiles or DEFAULT_QUANTILES, thresholds=a.thresholds, formats=a.format,
                         overwrite=a.overwrite, name=a.name, regrid_method=a.regrid_method,
                         on_input_grid=a.on_input_grid)
    res = forecast(cfg)
    print(f"written {len(res.written)} ({len(res.fallback)} fallback), kept {len(res.skipped)} existing")
    return 0


# --- serve ---------------------------------------------------------------------------------------
def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="HTTP service (FastAPI + uvicorn) over the outputs of `postcast forecast`",
        description="Serve point and bounding-box queries (mean, std, quantiles, exceedance probabilities), a "
                    "listing, /health, /metrics (Prometheus), OpenAPI docs at /docs and a map page at /. "
                    "With --token (or POSTCAST_TOKEN) every path but /health (and /metrics with --public-metrics) "
                    "needs 'Authorization: Bearer TOKEN'. The archive is rescanned every --watch seconds; "
                    "unreadable or foreign files are skipped and listed by /health.",
        epilog="examples:\n  postcast serve forecasts/ --port 8000\n"
               "  curl 'http://127.0.0.1:8000/forecast/point?target=t850&lat=47.5&lon=8.5'",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("forecasts", help="directory written by `postcast forecast`")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="TCP port, 1..65535")
    p.add_argument("--token", help="bearer token (default: $POSTCAST_TOKEN; none: no auth)")
    p.add_argument("--public-metrics", action="store_true", help="leave /metrics open when a token is set")
    p.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    p.add_argument("--watch", type=float, default=2.0, help="rescan the archive at most every S seconds (default 2)")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a client has to send a request's headers (default 10)")
    p.add_argument("--keep-alive-timeout", type=int, default=5, help="seconds an idle connection is kept (default 5)")
    p.add_argument("--limit-concurrency", type=int, default=1000,
                   help="connections + requests before answering 503 (default 1000)")
    p.add_argument("--no-access-log", dest="access_log", action="store_false",
                   help="no line per request on stderr (the address, startup and shutdown are still logged)")
    p.set_defaults(func=_run_serve)


def _run_serve(a: argparse.Namespace) -> int:
    import os

    from postcast.serve.server import ServeOptions, run

    opts = ServeOptions(host=a.host, port=a.port, workers=a.workers, header_timeout=a.header_timeout,
                        keep_alive_timeout=a.keep_alive_timeout, limit_concurrency=a.limit_concurrency,
                        access_log=a.access_log)
    if not 0.0 <= a.watch <= 86400.0:
        msg = f"--watch {a.watch}: give seconds in [0, 86400] (0: rescan on every request)"
        raise ConfigError(msg)
    if not Path(a.forecasts).is_dir():
        msg = f"{a.forecasts}: not a directory of forecasts (write one with `postcast forecast`)"
        raise MissingInputError(msg)
    os.environ["POSTCAST_FORECASTS"] = str(a.forecasts)
    os.environ["POSTCAST_WATCH_S"] = str(a.watch)
    os.environ["POSTCAST_PUBLIC_METRICS"] = "1" if a.public_metrics else "0"
    token = a.token if a.token is not None else os.environ.get("POSTCAST_TOKEN")
    if token is not None and not token.strip():  # an empty secret would run the service open, silently
        msg = ("the bearer token is empty (--token '' or POSTCAST_TOKEN=''): give a secret, or leave both unset "
               "to serve without a token")
        raise ConfigError(msg)
    if token:
        os.environ["POSTCAST_TOKEN"] = token
    log.info("serving the forecasts in %s at http://%s:%d (%s); Ctrl-C stops", a.forecasts, a.host, a.port,
             "token required" if token else "no token: open to anyone who can connect")
    run("postcast.serve.app:app_from_env", opts)
    log.info("postcast serve stopped")
    return 0


# --- compress / decompress / compress-report -----------------------------------------------------
def _add_compress(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compress", help="fit a neural field (coordinate network) to fields of a store or file",
        description="Fit a coordinate network (Fourier features + residual GELU MLP) to one or more variables "
                    "and write one self-describing artefact (weights, Fourier matrices, normalisation, grid, "
                    "format version, measured errors). With --error-bound an SZ3 residual layer guarantees "
                    "the maximum absolute error.",
        epilog="examples:\n  postcast compress data/store.zarr --var truth_t850 --out t850.pcnf\n"
               "  postcast compress data/store.zarr --var ens_mean_t --level 850 --width 64 --out t850m.pcnf\n"
               "  postcast compress data/store.zarr --var truth_z500 --error-bound 5 --out z500.pcnf\n"
               "  postcast compress data/store.zarr --var truth_t850 --var ens_mean_t --level 850 "
               "--error-bound-var truth_t850=0.1 --out t850.pcnf",
        formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p.add_argument("--weights", default="fp16", choices=["fp16", "int8", "fp32", "q8", "q6", "q4"],
                   help="weight storage: int8 one scale per matrix; qN N bits with one scale per row")
    p.add_argument("--entropy", default="none", choices=["none", "lzma"], help="lossless coding of the artefact")
    p.add_argument("--error-bound", type=float, help="guaranteed max absolute error (data units), via SZ3")
    p.add_argument("--error-bound-var", action="append", default=[], metavar="VAR=BOUND",
                   help="a bound for one variable (repeatable; overrides --error-bound for it)")
    p.add_argument("--error-bound-std", type=float, metavar="FRACTION",
                   help="guaranteed max absolute error as a fraction of each variable's weighted std, e.g. 0.1 "
                        "(weighted RMSE / std then stays <= 0.1), for variables without an absolute bound")
    p.set_defaults(func=_run_compress, input_path="source")


def _var_bound(item: str) -> tuple[str, float]:
    name, sep, value = item.partition("=")
    try:
        if not sep or not name:
            raise ValueError(item)
        return name, float(value)
    except ValueError as err:
        msg = f"--error-bound-var {item!r}: give VAR=BOUND in the variable's units, e.g. truth_t850=0.1"
        raise ValueError(msg) from err


def _run_compress(a: argparse.Namespace) -> int:
    from postcast.compression.artefact import Artefact
    from postcast.compression.field import FieldConfig, to_fields
    from postcast.compression.report import Selection, select

    try:
        per_var = dict(_var_bound(item) for item in a.error_bound_var)
        cfg = FieldConfig(width=a.width, depth=a.depth, steps=a.steps, sigma=a.sigma, weights=a.weights,
                          entropy=a.entropy, error_bound=a.error_bound, error_bounds=per_var,
                          error_bound_std=a.error_bound_std)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    sel = Selection(a.source, tuple(a.variables), tuple(a.levels), a.step_hours, a.member)
    fields = to_fields(select(sel))
    try:
        cfg.bounds_for(fields.variables)  # before the fit: a misspelt variable costs nothing
    except ValueError as err:
        msg = f"--error-bound-var: {err}"
        raise ConfigError(msg) from err
    art = Artefact.build(fields, cfg, progress=a.progress)
    art.header["selection"] = sel.to_dict()
    size = art.save(a.out)
    errs = art.header["errors"]
    print(f"{a.out}: {size} bytes, ratio {art.ratio:.1f}x; " + "; ".join(
        f"{v}: wRMSE {e['wrmse']:.4g}, max {e['max_abs']:.4g}" for v, e in zip(art.header["variables"], errs.values(),
                                                                                 strict=True)))
    return 0


def _add_decompress(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "decompress", help="decode an artefact to netCDF or zarr (optionally on another grid)",
        description="Decode every (time, level) slice of an artefact on its own grid, or with --resolution on "
                    "a regular latitude/longitude grid of that spacing (the network is continuous: regridding "
                    "is free; the error-bounded layer applies on the stored grid only).",
        epilog="example:\n  postcast decompress t850.pcnf --out t850.nc --resolution 1.0",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artefact")
    p.add_argument("--out", required=True, help=".nc or .zarr")
    p.add_argument("--resolution", type=float, help="degrees of a regular output grid")
    p.set_defaults(func=_run_decompress)


def _run_decompress(a: argparse.Namespace) -> int:
    from postcast.compression.artefact import Artefact, write_decoded

    art = Artefact.load(a.artefact)
    ds = art.decode() if a.resolution is None else art.regrid(a.resolution)
    write_decoded(ds, a.out)  # atomic: a failed write leaves nothing openable at --out
    print(f"{a.out}: {', '.join(map(str, ds.data_vars))} on {ds.sizes['latitude']} x {ds.sizes['longitude']}")
    return 0


def _add_compress_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compress-report", help="compare artefacts with SZ3 and ZFP on the same fields",
        description="Decode each artefact, reopen its source fields (recorded in the artefact) and print ratio, "
                    "cos-latitude weighted RMSE, MAE, max abs error, PSNR and throughput next to SZ3 (absolute "
                    "bounds) and ZFP (tolerance and rate) on the same arrays.",
        epilog="example:\n  postcast compress-report t850_w32.pcnf t850_w64.pcnf --sz3 0.05,0.2,1 --zfp-rate 2,4 "
               "--plot ratio_vs_rmse.png",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artefacts", nargs="+")
    p.add_argument("--sz3", type=_float_list, default=[0.1, 0.5, 2.0], help="absolute bounds (comma-separated)")
    p.add_argument("--zfp-tolerance", type=_float_list, default=[0.5, 2.0],
                   help="ZFP absolute tolerances (comma-separated)")
    p.add_argument("--zfp-rate", type=_float_list, default=[1.0, 4.0], help="bits per value")
    p.add_argument("--plot", help="write the ratio-vs-wRMSE plot here (PNG)")
    p.add_argument("--json", help="write the rows as JSON here")
    p.set_defaults(func=_run_compress_report)


def _float_list(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        msg = f"expected comma-separated numbers, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from err


def _run_compress_report(a: argparse.Namespace) -> int:
    from postcast.compression import report
    from postcast.datasets import io

    rows = report.compare(a.artefacts, a.sz3, a.zfp_tolerance, a.zfp_rate)
    print(report.format_table(rows))
    if a.plot:
        report.plot(rows, a.plot)
    if a.json:
        io.write_json(a.json, rows)
    return 0


# --- download ------------------------------------------------------------------------------------
def _add_download(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "download", help="fetch the real ENS-10 files (and the ERA5 truth of its baselines)",
        description="Download ENS-10 GRIB files by date range and group (pl/sfc), several at once, resuming "
                    "interrupted transfers with HTTP range requests; sizes (and MD5 ETags) are checked and only "
                    "complete files get their final names, so reruns skip them.",
        epilog="examples:\n  postcast download ens10 --start 2018-01-01 --end 2018-01-08 --dry-run\n"
               "  postcast download ens10 --start 2018-01-01 --end 2018-12-31 --group pl --out /data/ens10\n"
               "  postcast download ens10 --start 2018-01-01 --end 2018-01-08 --era5-years 2016,2017 --out d",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", choices=["ens10"], help="what to download")
    p.add_argument("--start", required=True, help="first init date (its month-day selects the ENS-10 file)")
    p.add_argument("--end", help="last init date, inclusive (default: --start)")
    p.add_argument("--group", type=_str_tuple, default=("pl", "sfc"), help="pl and/or sfc (default both)")
    p.add_argument("--era5-years", type=_int_tuple, default=(), help="also the ERA5 analyses of these years")
    p.add_argument("--out", default="data/ens10", help="directory for the files (default data/ens10)")
    p.add_argument("--jobs", type=int, default=4, help="transfers at once (default 4)")
    p.add_argument("--base-url", help="ENS-10 address (default: ECMWF's object store)")
    p.add_argument("--era5-url", help="ERA5 address (default: the SPCL mirror)")
    p.add_argument("--dry-run", action="store_true", help="list files, addresses and (where a server answers) sizes")
    p.set_defaults(func=_run_download)


def _run_download(a: argparse.Namespace) -> int:
    from postcast.datasets import download

    if not 1 <= a.jobs <= 64:
        msg = f"--jobs {a.jobs}: use 1..64"
        raise ConfigError(msg)
    files = download.ens10_files(a.start, a.end or a.start, tuple(a.group), a.base_url or download.ENS10_URL)
    if a.era5_years:
        files += download.era5_files(tuple(a.era5_years), tuple(a.group), a.era5_url or download.ERA5_URL)
    if a.dry_run:
        for f in download.with_sizes(files, a.jobs, timeout=3.0):
            size = f"{f.size} B" if f.size is not None else "size unknown"
            print(f"{f.name}\t{f.url}\t{size}")
        print(f"{len(files)} files")
        return 0
    res = download.download(files, a.out, jobs=a.jobs, progress=a.progress)
    print(f"{a.out}: fetched {len(res['fetched'])}, kept {len(res['skipped'])} complete files")
    return 0


# --- main ----------------------------------------------------------------------------------------
COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_synth, _add_ingest, _add_inspect, _add_config, _add_train, _add_evaluate, _add_run, _add_forecast, _add_serve,
    _add_compress, _add_decompress, _add_compress_report, _add_download]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="postcast", description="Post-processing of ensemble weather forecasts (ENS-10).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"postcast {postcast.__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="lowest level of log lines on stderr")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bars (there are none when stderr is not a terminal: log lines report "
                             "progress)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    _use_formatter(parser)
    return parser


def _use_formatter(parser: argparse.ArgumentParser) -> None:
    """:class:`HelpFormatter` for the parser and every verb's (and sub-verb's) parser."""
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _use_formatter(sub)


def internal_error(err: BaseException) -> int:
    """A bug, not the user's fault: one line naming the log file that holds the traceback, exit 70."""
    import traceback

    path = _crash_log()
    text = "".join(traceback.format_exception(err))
    try:
        path.write_text(f"postcast {postcast.__version__}, argv {sys.argv!r}\n{text}")
        where = str(path)
    except OSError:  # nowhere to write: the trace goes to stderr after the line
        where = "stderr, below"
    print(f"postcast: internal error: {type(err).__name__}: {err} (details in {where}; please report)",
          file=sys.stderr)
    if where != str(path):
        print(text, file=sys.stderr)
    return INTERNAL


def _crash_log() -> Path:
    """A new file for one internal error's traceback: under $POSTCAST_LOG_DIR, else
    $XDG_STATE_HOME/postcast (~/.local/state/postcast); the system's temporary folder if neither can be made."""
    import os
    import tempfile
    import time

    base = os.environ.get("POSTCAST_LOG_DIR") or str(
        Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "postcast")
    name = f"internal-error-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
    for folder in (Path(base), Path(tempfile.gettempdir()) / "postcast"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            return folder / name
        except OSError:
            continue
    return Path(tempfile.gettempdir()) / name


def exit_code(err: BaseException) -> int | None:
    """The exit code of an exception that escaped a verb; None for an internal error (exit 70, the
    traceback in a log file: :func:`internal_error`). The CLI's one mapping, first match wins:

    * :class:`PostcastError` carries its own code: ``ConfigError`` 2, ``BadInputError`` 65 (the
      compression ``ArtefactError`` is one), ``MissingInputError`` 66;
    * an ``OSError`` of a full disk, a file size limit or a quota, wrapped or not: 74 (``OutputError``);
    * any other ``FileNotFoundError``: missing input, 66.

    Nothing else: a ``ValueError``, ``KeyError`` or ``OSError`` that the library did not turn into a
    ``PostcastError`` where it found the problem is a bug, not the user's data.
    """
    if isinstance(err, PostcastError):
        return err.exit_code
    if out_of_space(err) is not None:
        return OutputError.exit_code
    if isinstance(err, FileNotFoundError):
        return MissingInputError.exit_code
    return None


def out_of_space(err: BaseException) -> OSError | None:
    """The "disk full" / "file too large" / "quota" OSError behind ``err`` (zarr, dask and netCDF4 wrap
    it), else None."""
    import errno

    full = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
    return next((e for e in _chain(err) if isinstance(e, OSError) and e.errno in full), None)


def _message(err: BaseException, path: str | None) -> str:
    """The error line's text. A plain exception (not a PostcastError, whose message says what it means)
    is prefixed with the verb's input path, unless it names that path already."""
    full = out_of_space(err)
    if full is not None:
        return (f"cannot write {full.filename or 'the output'}: {full.strerror or full} (disk full or file size "
                "limit); free space and rerun (finished work is kept, nothing partial was marked complete)")
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    plain = not isinstance(err, PostcastError)
    return f"{path}: {text}" if plain and path and path not in text else text



def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line as a namespace. ``train`` hands every word after it to the Lightning CLI
    verbatim (``postcast train --help`` included); other verbs refuse unknown arguments."""
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(words)
    # bars only on a terminal: in a log file their carriage returns run into the log lines
    args.progress = args.progress and sys.stderr.isatty()
    if args.command == "train":
        args.lightning_args = words[words.index("train") + 1:]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _log_handler(level: str) -> logging.Handler:
    """One handler on the root logger, on this call's stderr: every library's records (Lightning's,
    uvicorn's, dask's) are printed once, in one format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_AsyncioLeftovers())
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    return handler


class _AsyncioLeftovers(logging.Filter):
    """asyncio's "Future exception was never retrieved" about a library's leftover future (dask's
    tornado timeouts at cluster shutdown), logged whenever it is garbage-collected: at DEBUG only, so
    that an error stays one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        first = str(record.msg).split("\n", 1)[0]
        leftover = record.name == "asyncio" and first.endswith("exception was never retrieved")
        return not leftover or logging.getLogger().level <= logging.DEBUG


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    handler = _log_handler(args.log_level)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("postcast: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # the reader stopped reading (`postcast inspect S | head`): not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python exits
        return 0
    except Exception as err:
        code = exit_code(err)
        if code is None:
            return internal_error(err)
        input_path = getattr(args, "input_path", None)  # the name of the argument holding the input
        print(f"postcast: error: {_message(err, getattr(args, input_path) if input_path else None)}",
              file=sys.stderr)
        log.debug("traceback of the error above", exc_info=err)
        return code
    finally:
        logging.getLogger().removeHandler(handler)


if __name__ == "__main__":
    sys.exit(main())
