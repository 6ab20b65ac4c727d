"""Skill of the post-processors on every target: train each preset (model x target) with several seeds
through ``postcast train fit``, evaluate on the test split with ``postcast evaluate``'s code, and report CRPS
and the fraction of the raw-to-oracle gap closed as mean +- std over seeds. The raw baseline is the raw
ensemble's Gaussian for the Gaussian targets (z500, t850, t2m: ENS-10's convention) and the members' fair
CRPS for ws10 and tp24 (docs/verification.md). For tp24 the censored shifted gamma (emos_tp24) is compared
with a Gaussian EMOS on the same inputs (emos_gaussian_tp24) in CRPS and in the Brier score at 1 mm:
per-date scores averaged over the seeds, paired Diebold-Mariano test (HAC variance) at the 5 % level.

    python benchmarks/skill.py                       # emos mlp unet on 5 targets, seeds 0 1 2, runs/targets/store.zarr
    python benchmarks/skill.py --models unet smoe --targets t850 --seeds 0

Finished runs are recorded in OUT/runs.json and skipped on a rerun (a killed benchmark resumes) while their
preset and the store are unchanged (a changed preset retrains).
Last line: RESULT gap_closed_z500=<x> gap_closed_t850=<x> gap_closed_t2m=<x> gap_closed_ws10=<x>
gap_closed_tp24=<x> (the best model's fraction of the raw-to-oracle CRPS gap closed, mean over seeds)
censored_beats_gaussian_tp24=<yes|no> emos_minus_reference_crps=<x> emos_fit_speedup=<x>: the local EMOS of
the first seed beside a scipy per-point fit of the same model on the same data (benchmarks/emos_reference.py,
on --reference-points sampled points): the largest test-CRPS difference postcast minus scipy over the targets,
and the smallest ratio of scipy's fit time (extrapolated to every point) to postcast's;
emos_minus_standard_<t>=<x> emos_wins_<t>=<k>/<n> for each target with an EMOS run: postcast's local EMOS
(its form and pooling chosen on validation) minus the operational form fitted per point by scipy (the standard
form, a + b mean and c^2 + d^2 variance, for t2m, ws10, z500, t850; Scheuerer and Hamill's censored shifted
gamma for tp24), area-weighted test CRPS at the same sampled points, and the test dates it wins
(benchmarks/emos_standard.py); oracle_wins_<t>=<k>/<n>: the dates the oracle (the law that drew the truths) wins
against the same fit, the ceiling of emos_wins_<t>.
Then the network keys (benchmarks/skill_nets.py, issue 55; ``n/a`` where the row was not run):
unet_minus_best_min=<x>: min over the targets of the best U-Net-family (unet, unet_smoe) gap closed minus the best
model's; smoe_minus_unet_regimes=<x> smoe_regimes_p=<x>: on the regime world (its own store, built on demand;
--no-regimes skips it) the U-Net + SMoE minus the U-Net in gap closed (mean over seeds) and the Diebold-Mariano
p-value of their per-date CRPS; fused_seeds_speedup=<x>: the U-Net preset's --fused-seeds trained as one fused
array against one after another on the same batches (benchmarks/fused_seeds.py; --no-fused skips it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
import warnings
from pathlib import Path
from typing import Any

import fused_seeds
import numpy as np
import skill_nets
import xarray as xr
from common import ROOT, TARGETS_RUN, TARGETS_STORE, require_store
from emos_reference import compare, print_reference
from emos_standard import CLOSED, compare_standard, print_standard

from postcast.datasets import io
from postcast.models import registry
from postcast.models.module import load_checkpoint
from postcast.pipeline.train import run as train
from postcast.pipeline.verify import significance
from postcast.pipeline.verify.evaluate import EvalConfig, evaluate

TARGETS = ("z500", "t850", "t2m", "ws10", "tp24")
MODELS = ("emos", "mlp", "unet")  # a preset each per target (configs/train/<model>_<target>.yaml)
GAUSSIAN_TP24 = "emos_gaussian"  # tp24's Gaussian comparison (configs/train/emos_gaussian_tp24.yaml)
CENSORED_TP24 = "emos"


def inputs_of(model: str, target: str, store: str) -> str:
    """SHA-256 of what a finished run depends on besides its key: the preset's text and the store's root
    metadata (its chunk checksums): a run recorded under other inputs is retrained, not reused."""
    h = hashlib.sha256((ROOT / f"configs/train/{model}_{target}.yaml").read_bytes())
    h.update((Path(store) / "zarr.json").read_bytes())
    return h.hexdigest()


def train_one(model: str, target: str, seed: int, store: str, out: Path, epochs: int | None) -> dict[str, Any]:
    root = out / "runs" / f"{model}_{target}_s{seed}"
    inputs = inputs_of(model, target, store)
    args = [
        "fit",
        "-c",
        str(ROOT / f"configs/train/{model}_{target}.yaml"),
        "--seed_everything",
        str(seed),
        "--data.cfg.store",
        store,
        "--trainer.default_root_dir",
        str(root),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
    ]
    if epochs:
        args += ["--trainer.max_epochs", str(epochs)]
    t0 = time.perf_counter()
    cli = train(args)
    cb = cli.trainer.checkpoint_callback
    return {
        "model": model,
        "target": target,
        "family": cli.model.meta.family,
        "seed": seed,
        "checkpoint": cb.best_model_path,  # type: ignore[union-attr]
        "val_crps": float(cb.best_model_score),
        "train_s": time.perf_counter() - t0,
        "inputs": inputs,
    }  # type: ignore[union-attr, arg-type]


def train_missing(
    model: str, target: str, seed: int, store: str, out: Path, epochs: int | None, done: dict[str, Any]
) -> None:
    """Train one run unless ``done`` (OUT/runs.json) holds it with its checkpoint and the same inputs."""
    key = f"{model}_{target}_s{seed}_e{epochs or 'preset'}"
    row = done.get(key)
    if row and Path(row["checkpoint"]).exists() and row.get("inputs") == inputs_of(model, target, store):
        return
    done[key] = train_one(model, target, seed, store, out, epochs)
    io.write_json(out / "runs.json", done)
    r = done[key]
    print(f"trained {key}: val_crps={r['val_crps']:.4g} in {r['train_s']:.0f} s", flush=True)


def evaluate_seeds(
    seeds: list[int],
    pairs: list[tuple[str, str]],
    targets: list[str],
    out: Path,
    store: str,
    done: dict[str, Any],
    suffix: str,
) -> dict[str, dict[str, dict[str, float]]]:
    """Each seed's runs evaluated together on the test split (OUT/eval_s<seed>), aggregated over the seeds."""
    evals = {}
    for seed in seeds:
        keys = [f"{m}_{t}_s{seed}{suffix}" for m, t in pairs]
        ckpts = [done[k]["checkpoint"] for k in keys]
        names = {done[k]["checkpoint"]: done[k]["model"] for k in keys}
        evals[seed] = evaluate(
            EvalConfig(
                store=store,
                checkpoints=tuple(ckpts),
                targets=tuple(targets),
                out=str(out / f"eval_s{seed}"),
                names=names,
                bootstrap=200,
            )
        )
    return aggregate(evals)


def aggregate(evals: dict[int, dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """{target: {forecast: {crps_mean, crps_std, gap_mean, gap_std, skill_mean}}} over seeds; the raw members
    (``raw_ensemble``, fair CRPS) beside the forecasts, the baseline of ws10 and tp24."""
    table: dict[str, dict[str, dict[str, list[float]]]] = {}
    for res in evals.values():
        for target, r in res["targets"].items():
            base = r["raw_ensemble"]["global"]["crps_fair"]
            rows = {f: regions["global"] for f, regions in r["forecasts"].items()}
            rows["raw_ensemble"] = {
                "crps": base,
                **({"gap_closed": 0.0, "skill_vs_raw": 0.0} if r["baseline"] == "raw_ensemble" else {}),
            }
            for f, g in rows.items():
                cell = table.setdefault(target, {}).setdefault(f, {"crps": [], "gap": [], "skill": []})
                cell["crps"].append(g["crps"])
                cell["gap"].append(g.get("gap_closed", float("nan")))
                cell["skill"].append(g.get("skill_vs_raw", float("nan")))
    return {
        t: {
            f: {
                "crps_mean": float(np.mean(c["crps"])),
                "crps_std": float(np.std(c["crps"])),
                "gap_mean": float(np.mean(c["gap"])),
                "gap_std": float(np.std(c["gap"])),
                "skill_mean": float(np.mean(c["skill"])),
                "n": len(c["crps"]),
            }
            for f, c in fs.items()
        }
        for t, fs in table.items()
    }


BASELINES = ("raw", "oracle", "raw_ensemble")


def censored_vs_gaussian(out: Path, seeds: list[int]) -> dict[str, dict[str, float]]:
    """tp24: the censored EMOS minus the Gaussian EMOS in CRPS and in the Brier score at 1 mm (``brier_above_t1``),
    per test date averaged over the seeds (global, unweighted): mean difference and Diebold-Mariano p-value."""
    per_seed = []
    for seed in seeds:
        with xr.open_dataset(out / f"eval_s{seed}" / "results.nc") as ds:
            per_seed.append(
                ds["score_per_date"]
                .sel(
                    target="tp24",
                    lead=48,
                    region="global",
                    weighting="none",
                    metric=["crps", "brier_above_t1"],
                    forecast=[CENSORED_TP24, GAUSSIAN_TP24],
                )
                .load()
            )
    dated = xr.concat(per_seed, dim="seed").mean("seed")  # (forecast, metric, init_time)
    out_: dict[str, dict[str, float]] = {}
    for metric in ("crps", "brier_above_t1"):
        d = dated.sel(metric=metric)
        pair = significance.paired(d.sel(forecast=CENSORED_TP24).values, d.sel(forecast=GAUSSIAN_TP24).values)
        out_[metric] = {
            "censored": float(d.sel(forecast=CENSORED_TP24).mean()),
            "gaussian": float(d.sel(forecast=GAUSSIAN_TP24).mean()),
            "mean_difference": pair.mean,
            "ci95_low": pair.low,
            "ci95_high": pair.high,
            "dm_p_value": pair.p_value,
            "n_dates": int(np.isfinite(d.values).all(axis=0).sum()),
        }
    return out_


def summary(
    agg: dict[str, dict[str, dict[str, float]]], tp24: dict[str, dict[str, float]] | None
) -> tuple[dict[str, Any], str]:
    """The RESULT keys (the best model's gap closed per target; whether the censored tp24 EMOS beats the
    Gaussian one) and how many learned forecasts beat their target's baseline ("n/total")."""
    learned = [(t, f) for t in agg for f in agg[t] if f not in BASELINES]
    base = {
        t: agg[t]["raw_ensemble" if np.isfinite(agg[t]["raw_ensemble"]["gap_mean"]) else "raw"]["crps_mean"]
        for t in agg
    }
    beat = sum(agg[t][f]["crps_mean"] < base[t] for t, f in learned)
    best = {
        t: max(
            (c["gap_mean"] for f, c in fs.items() if f not in BASELINES and np.isfinite(c["gap_mean"])),
            default=float("nan"),
        )
        for t, fs in agg.items()
    }
    out: dict[str, Any] = {f"gap_closed_{t}": g for t, g in best.items()}
    if tp24 is not None:
        better = all(v["mean_difference"] < 0 and v["dm_p_value"] < 1 - significance.LEVEL for v in tp24.values())
        out["censored_beats_gaussian_tp24"] = "yes" if better else "no"
    return out, f"{beat}/{len(learned)}"


def print_table(agg: dict[str, dict[str, dict[str, float]]]) -> None:
    """CRPS, skill and gap closed against each target's baseline (``-``: the raw members of a Gaussian target,
    which are not its baseline)."""
    print(
        f"{'target':6} {'forecast':13} {'CRPS mean +- std':>24} {'skill vs baseline':>17} {'gap closed':>16} "
        f"{'seeds':>5}"
    )
    for t, fs in agg.items():
        for f, c in sorted(fs.items(), key=lambda kv: -kv[1]["crps_mean"]):
            skill = f"{100 * c['skill_mean']:.1f}%" if np.isfinite(c["skill_mean"]) else "-"
            gap = f"{100 * c['gap_mean']:.1f} +- {100 * c['gap_std']:.1f}%" if np.isfinite(c["gap_mean"]) else "-"
            print(f"{t:6} {f:13} {c['crps_mean']:>14.5g} +- {c['crps_std']:<7.2g} {skill:>17} {gap:>16} {c['n']:>5}")


def presets(models: list[str], targets: list[str]) -> list[tuple[str, str]]:
    """(model, target) pairs with a preset; tp24 with EMOS also gets the Gaussian EMOS it is compared with."""
    pairs = [(m, t) for t in targets for m in models if (ROOT / f"configs/train/{m}_{t}.yaml").exists()]
    if (CENSORED_TP24, "tp24") in pairs:
        pairs.append((GAUSSIAN_TP24, "tp24"))
    return pairs


def print_comparison(tp24: dict[str, dict[str, float]]) -> None:
    print("\ntp24, censored shifted gamma (emos) vs Gaussian (emos_gaussian), test dates, mean of the seeds:")
    print(f"{'score':16} {'censored':>10} {'gaussian':>10} {'difference':>11} {'95% CI':>22} {'DM p':>9}")
    for m, v in tp24.items():
        ci = f"[{v['ci95_low']:+.3g}, {v['ci95_high']:+.3g}]"
        print(
            f"{m:16} {v['censored']:>10.5g} {v['gaussian']:>10.5g} {v['mean_difference']:>+11.4g} {ci:>22} "
            f"{v['dm_p_value']:>9.3g}"
        )


def emos_references(
    done: dict[str, Any], pairs: list[tuple[str, str]], a: argparse.Namespace, suffix: str
) -> dict[str, dict[str, Any]]:
    """Each target's local EMOS (first seed) beside scipy's per-point fit (benchmarks/emos_reference.py)."""
    out = {}
    for model, target in pairs:
        if model == "emos":
            row = done[f"{model}_{target}_s{a.seeds[0]}{suffix}"]
            out[target] = compare(
                row["checkpoint"], a.store, a.reference_points or None, seed=a.seeds[0], train_s=row["train_s"]
            )
            out[target]["train_s"] = row["train_s"]
            print(f"scipy reference for emos_{target}: {out[target]['scipy_fit_s_measured']:.0f} s", flush=True)
    return out


def family_of(row: dict[str, Any]) -> str:
    """The predictive family of a finished run (read from its checkpoint for runs recorded without it)."""
    return str(row.get("family") or load_checkpoint(row["checkpoint"])[0].meta.family)


def emos_standards(
    done: dict[str, Any], pairs: list[tuple[str, str]], a: argparse.Namespace, suffix: str
) -> dict[str, dict[str, Any]]:
    """Each target's local EMOS (first seed) beside the operational form fitted per point by scipy
    (benchmarks/emos_standard.py)."""
    out = {}
    for model, target in pairs:
        row = done.get(f"{model}_{target}_s{a.seeds[0]}{suffix}")
        if model == "emos" and row is not None and family_of(row) in CLOSED:
            out[target] = compare_standard(row["checkpoint"], a.store, a.reference_points or None, seed=a.seeds[0])
    return out


def network_rows(agg: dict[str, dict[str, dict[str, float]]], a: argparse.Namespace) -> dict[str, Any]:
    """The network keys of the RESULT line (``n/a`` for a row not requested or without its models): the
    U-Net family against the best model, the regime world's SMoE minus U-Net, the fused seeds' speed-up."""
    gap = skill_nets.unet_minus_best(agg)
    result: dict[str, Any] = {"unet_minus_best_min": "n/a" if gap is None else gap}
    regimes = fused = None
    if a.regimes:
        store = skill_nets.regime_store(a.regime_store)
        out = a.out / "regimes"
        path = out / "runs.json"
        done: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        epochs = a.regime_epochs or a.epochs
        regimes = skill_nets.run_regimes(
            lambda m, seed, st, o: train_missing(m, a.regime_target, seed, st, o, epochs, done),
            lambda seeds, pairs, o, st: evaluate_seeds(
                seeds, pairs, [a.regime_target], o, st, done, f"_e{epochs or 'preset'}"
            ),
            a.seeds,
            a.regime_target,
            store,
            out,
        )
    result["smoe_minus_unet_regimes"] = regimes["smoe_minus_unet_gap"] if regimes else "n/a"
    result["smoe_regimes_p"] = regimes["dm_p_value"] if regimes else "n/a"
    target = next((t for t in a.targets if (ROOT / f"configs/train/unet_{t}.yaml").exists()), None)
    if a.fused and target is not None:
        fused = fused_seeds.measure("unet", target, a.store, a.fused_seeds, a.fused_steps)
        print(
            f"\nfused seeds {a.fused_seeds}, unet_{target}, {fused['steps']} steps: sequential "
            f"{fused['sequential_s']:.1f} s, fused {fused['fused_s']:.1f} s, largest difference "
            f"{fused['max_abs_difference']:.2g}"
        )
    result["fused_seeds_speedup"] = fused["speedup"] if fused else "n/a"
    return {"result": result, "regimes": regimes, "fused": fused}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", default=str(TARGETS_STORE))
    architectures = list(registry.architectures())
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=architectures)
    p.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--epochs", type=int, help="override every preset's max_epochs")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/skill"))
    p.add_argument("--reference-points", type=int, default=200, help="points of the scipy EMOS reference (0: all)")
    p.add_argument("--regimes", action=argparse.BooleanOptionalAction, default=True, help="the regime world's row")
    p.add_argument("--regime-target", default="t2m", choices=("z500", "t850", "t2m"))
    p.add_argument("--regime-epochs", type=int, help="max_epochs of the regime world's runs (default: --epochs)")
    p.add_argument(
        "--regime-store", help=f"a regime-world store (default {skill_nets.REGIME_STORE}, built when absent)"
    )
    p.add_argument("--fused", action=argparse.BooleanOptionalAction, default=True, help="fused seeds' speed-up")
    p.add_argument("--fused-seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--fused-steps", type=int, default=16, help="training batches of the fused comparison")
    a = p.parse_args()
    a.store = require_store(a.store, TARGETS_STORE, TARGETS_RUN)
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore")
    a.out.mkdir(parents=True, exist_ok=True)
    done_path = a.out / "runs.json"
    done: dict[str, Any] = json.loads(done_path.read_text()) if done_path.exists() else {}
    pairs = presets(a.models, a.targets)
    suffix = f"_e{a.epochs or 'preset'}"
    for seed in a.seeds:
        for model, target in pairs:
            train_missing(model, target, seed, a.store, a.out, a.epochs, done)
    agg = evaluate_seeds(a.seeds, pairs, a.targets, a.out, a.store, done, suffix)
    print_table(agg)
    tp24 = censored_vs_gaussian(a.out, a.seeds) if (GAUSSIAN_TP24, "tp24") in pairs else None
    if tp24 is not None:
        print_comparison(tp24)
    res, beat = summary(agg, tp24)
    nets = network_rows(agg, a)
    res.update(nets["result"])
    reference = emos_references(done, pairs, a, suffix)
    if reference:
        print_reference(reference)
        res["emos_minus_reference_crps"] = max(r["test_crps_difference"] for r in reference.values())
        res["emos_fit_speedup"] = min(r["speedup"] for r in reference.values())
    standard = emos_standards(done, pairs, a, suffix)
    if standard:
        print_standard(standard)
        for target, r in standard.items():
            res[f"emos_minus_standard_{target}"] = r["postcast_minus_standard"]
            res[f"emos_wins_{target}"] = f"{r['dates_won']}/{r['test_dates']}"
            if r["oracle_dates_won"] is not None:
                res[f"oracle_wins_{target}"] = f"{r['oracle_dates_won']}/{r['test_dates']}"
    print(f"learned forecasts beating their target's baseline: {beat}")
    train_s = {k: r["train_s"] for k, r in done.items()}
    io.write_json(
        a.out / "skill.json",
        {
            "aggregate": agg,
            "summary": res,
            "all_beat_baseline": beat,
            "tp24_censored_vs_gaussian": tp24,
            "train_seconds": train_s,
            "emos_reference": reference,
            "emos_standard": standard,
            "regimes": nets["regimes"],
            "fused_seeds": nets["fused"],
            "seeds": a.seeds,
            "epochs": a.epochs,
        },
    )
    print("RESULT " + " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()))


if __name__ == "__main__":
    main()
