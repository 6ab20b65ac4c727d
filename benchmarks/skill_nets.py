"""The skill benchmark's network rows (issue 55): how far the best U-Net-family model is from the best model of
each target, and the regime world's row, the U-Net + SMoE against the U-Net with a paired test over test dates.

The regime world (``configs/synth/regimes.yaml``: 10 deg, four error regimes, docs/models.md) gets its own store,
``runs/regimes/store.zarr``, built on demand by the pipeline's synth and ingest stages as benchmarks/common.py
builds the targets store, with 12 init dates a year (the preset's 6 would leave 12 test dates for the paired
test): 96 dates, 60 for training (2010-2014), 12 for validation (2015), 24 for testing (2016-2017).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from common import ROOT

from postcast.pipeline.verify import significance

UNET_FAMILY = ("unet", "unet_smoe")
BASELINES = ("raw", "oracle", "raw_ensemble")  # skill.py's: not models
REGIME_MODELS = ("unet", "unet_smoe")  # the row's pair: SMoE minus U-Net
REGIME_SYNTH = ROOT / "configs" / "synth" / "regimes.yaml"
REGIME_RUN = ROOT / "runs" / "regimes"
REGIME_STORE = REGIME_RUN / "store.zarr"
REGIME_DATES_PER_YEAR = 12
REGIME_SPLITS = {"train": (2010, 2014), "val": (2015, 2015), "test": (2016, 2017)}


def unet_minus_best(agg: dict[str, dict[str, dict[str, float]]]) -> float | None:
    """Min over the targets that have a U-Net-family forecast of (its best gap closed minus the best model's);
    None when no target has one."""
    gaps = []
    for fs in agg.values():
        learned = {f: c["gap_mean"] for f, c in fs.items() if np.isfinite(c["gap_mean"]) and f not in BASELINES}
        family = [g for f, g in learned.items() if f in UNET_FAMILY]
        if family:
            gaps.append(max(family) - max(learned.values()))
    return min(gaps) if gaps else None


def regime_store(store: str | None) -> str:
    """``store`` (a regime-world store) or the default one, built when absent (a few minutes on 2 cores)."""
    path = Path(store) if store else REGIME_STORE
    if path.exists():
        return str(path)
    if path.resolve() != REGIME_STORE.resolve():
        print(
            f"{store}: no such store; leave --regime-store out to build the default ({REGIME_STORE})", file=sys.stderr
        )
        raise SystemExit(66)
    from postcast.datasets import schema
    from postcast.datasets.core import config
    from postcast.pipeline.pipeline_config import PipelineConfig
    from postcast.pipeline.run import run

    synth = config.load(REGIME_SYNTH, expect_kind="synth")
    cfg = PipelineConfig(
        workdir=str(REGIME_RUN),
        synth=dataclasses.replace(synth, dates_per_year=REGIME_DATES_PER_YEAR),
        splits=schema.Splits(**REGIME_SPLITS),
        workers=1,
        processes=False,
        evaluate=False,
    )
    run(cfg, progress=False)
    return str(REGIME_STORE)


def per_date_crps(out: Path, seeds: list[int], target: str, forecasts: tuple[str, ...]) -> xr.DataArray:
    """Global, unweighted (as gap closed) CRPS per test date at the trained lead, averaged over the seeds:
    (forecast, init_time)."""
    per_seed = []
    for seed in seeds:
        with xr.open_dataset(out / f"eval_s{seed}" / "results.nc") as ds:
            per_seed.append(
                ds["score_per_date"]
                .sel(target=target, region="global", weighting="none", metric="crps", forecast=list(forecasts))
                .dropna("lead", how="all")  # the presets' lead (+48 h); the others are NaN
                .squeeze("lead", drop=True)
                .load()
            )
    return xr.concat(per_seed, dim="seed").mean("seed")


def regime_row(
    agg: dict[str, dict[str, dict[str, float]]], out: Path, seeds: list[int], target: str
) -> dict[str, float]:
    """U-Net + SMoE minus U-Net on the regime world: gap closed (mean over seeds; > 0: the SMoE better) and
    the paired Diebold-Mariano test of their per-date CRPS (HAC variance; pipeline/verify/significance.py)."""
    smoe, unet = REGIME_MODELS[1], REGIME_MODELS[0]
    dated = per_date_crps(out, seeds, target, (smoe, unet))
    pair = significance.paired(dated.sel(forecast=smoe).values, dated.sel(forecast=unet).values)
    return {
        "target": target,  # type: ignore[dict-item]
        "gap_closed_unet": agg[target][unet]["gap_mean"],
        "gap_closed_unet_smoe": agg[target][smoe]["gap_mean"],
        "smoe_minus_unet_gap": agg[target][smoe]["gap_mean"] - agg[target][unet]["gap_mean"],
        "smoe_minus_unet_crps": pair.mean,
        "ci95_low": pair.low,
        "ci95_high": pair.high,
        "dm_p_value": pair.p_value,
        "n_dates": int(np.isfinite(dated.values).all(axis=0).sum()),
    }


def run_regimes(
    train: Callable[[str, int, str, Path], dict[str, Any]],
    evaluate: Callable[[list[int], list[tuple[str, str]], Path, str], dict[str, dict[str, dict[str, float]]]],
    seeds: list[int],
    target: str,
    store: str,
    out: Path,
) -> dict[str, float]:
    """Train the row's pair for every seed on the regime store (``train(model, seed, store, out)``), evaluate
    them (``evaluate(seeds, pairs, out, store)`` -> the aggregate table) and compare them."""
    pairs = [(m, target) for m in REGIME_MODELS]
    for seed in seeds:
        for model in REGIME_MODELS:
            train(model, seed, store, out)
    agg = evaluate(seeds, pairs, out, store)
    row = regime_row(agg, out, seeds, target)
    print(
        f"\nregime world, {target}: U-Net {100 * row['gap_closed_unet']:.1f} %, U-Net + SMoE "
        f"{100 * row['gap_closed_unet_smoe']:.1f} % of the gap; CRPS difference {row['smoe_minus_unet_crps']:+.4g} "
        f"[{row['ci95_low']:+.3g}, {row['ci95_high']:+.3g}], DM p {row['dm_p_value']:.3g}, {row['n_dates']} dates"
    )
    return row
