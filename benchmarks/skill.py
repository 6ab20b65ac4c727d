"""Skill of every post-processor on the embedded default: train each preset (model x target) with
several seeds through ``postcast train fit``, evaluate on the test split with ``postcast evaluate``'s
code, and report CRPS and the fraction of the raw-to-oracle gap closed as mean +- std over seeds.

    python benchmarks/skill.py                       # all presets, seeds 0 1 2, runs/quickstart/store.zarr
    python benchmarks/skill.py --models unet smoe --targets t850 --seeds 0

Finished runs are recorded in OUT/runs.json and skipped on a rerun (a killed benchmark resumes).
Last line: RESULT gap_closed_z500=<x> gap_closed_t850=<x> gap_closed_t2m=<x> (the best model's fraction
of the raw-to-oracle CRPS gap closed, mean over seeds) all_beat_raw=<n>/<total> smoe_minus_unet_gap=<x>
(U-Net+SMoE minus U-Net gap closed, worst target) emos_gap_max=<x> (local EMOS, best target)
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from common import DEFAULT_STORE, require_store

from postcast.datasets import io
from postcast.models import registry
from postcast.pipeline.evaluate import EvalConfig, evaluate
from postcast.pipeline.train import run as train

TARGETS = ("z500", "t850", "t2m")


def train_one(model: str, target: str, seed: int, store: str, out: Path, epochs: int | None) -> dict[str, Any]:
    root = out / "runs" / f"{model}_{target}_s{seed}"
    args = ["fit", "-c", f"configs/train/{model}_{target}.yaml", "--seed_everything", str(seed),
            "--data.cfg.store", store, "--trainer.default_root_dir", str(root),
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
    if epochs:
        args += ["--trainer.max_epochs", str(epochs)]
    t0 = time.perf_counter()
    cli = train(args)
    cb = cli.trainer.checkpoint_callback
    return {"model": model, "target": target, "seed": seed, "checkpoint": cb.best_model_path,  # type: ignore[union-attr]
            "val_crps": float(cb.best_model_score), "train_s": time.perf_counter() - t0}  # type: ignore[union-attr, arg-type]


def aggregate(evals: dict[int, dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """{target: {forecast: {crps_mean, crps_std, gap_mean, gap_std, skill_mean}}} over seeds."""
    table: dict[str, dict[str, dict[str, list[float]]]] = {}
    for res in evals.values():
        for target, r in res["targets"].items():
            for f, regions in r["forecasts"].items():
                g = regions["global"]
                cell = table.setdefault(target, {}).setdefault(f, {"crps": [], "gap": [], "skill": []})
                cell["crps"].append(g["crps"])
                cell["gap"].append(g["gap_closed"])
                cell["skill"].append(g["skill_vs_raw"])
    return {t: {f: {"crps_mean": float(np.mean(c["crps"])), "crps_std": float(np.std(c["crps"])),
                    "gap_mean": float(np.mean(c["gap"])), "gap_std": float(np.std(c["gap"])),
                    "skill_mean": float(np.mean(c["skill"])), "n": len(c["crps"])}
                for f, c in fs.items()} for t, fs in table.items()}


def summary(agg: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
    learned = [(t, f) for t in agg for f in agg[t] if f not in ("raw", "oracle")]
    beat = sum(agg[t][f]["crps_mean"] < agg[t]["raw"]["crps_mean"] for t, f in learned)
    best = {t: max(c["gap_mean"] for f, c in fs.items() if f not in ("raw", "oracle")) for t, fs in agg.items()}
    out: dict[str, Any] = {f"gap_closed_{t}": g for t, g in best.items()}
    out["all_beat_raw"] = f"{beat}/{len(learned)}"
    diffs = [agg[t]["unet_smoe"]["gap_mean"] - agg[t]["unet"]["gap_mean"] for t in agg
             if "unet_smoe" in agg[t] and "unet" in agg[t]]
    out["smoe_minus_unet_gap"] = min(diffs) if diffs else float("nan")
    emos = [agg[t]["emos"]["gap_mean"] for t in agg if "emos" in agg[t]]
    out["emos_gap_max"] = max(emos) if emos else float("nan")
    return out


def print_table(agg: dict[str, dict[str, dict[str, float]]]) -> None:
    print(f"{'target':6} {'forecast':12} {'CRPS mean +- std':>24} {'skill vs raw':>13} {'gap closed':>16} {'seeds':>5}")
    for t, fs in agg.items():
        for f, c in sorted(fs.items(), key=lambda kv: -kv[1]["crps_mean"]):
            print(f"{t:6} {f:12} {c['crps_mean']:>14.5g} +- {c['crps_std']:<7.2g} {100 * c['skill_mean']:>12.1f}% "
                  f"{100 * c['gap_mean']:>8.1f} +- {100 * c['gap_std']:<4.1f}% {c['n']:>5}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", default=str(DEFAULT_STORE))
    families = list(registry.families())
    p.add_argument("--models", nargs="+", default=families, choices=families)
    p.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--epochs", type=int, help="override every preset's max_epochs")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/skill"))
    a = p.parse_args()
    a.store = require_store(a.store)
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore")
    a.out.mkdir(parents=True, exist_ok=True)
    done_path = a.out / "runs.json"
    done: dict[str, Any] = json.loads(done_path.read_text()) if done_path.exists() else {}
    for seed in a.seeds:
        for target in a.targets:
            for model in a.models:
                key = f"{model}_{target}_s{seed}_e{a.epochs or 'preset'}"
                if key in done and Path(done[key]["checkpoint"]).exists():
                    continue
                done[key] = train_one(model, target, seed, a.store, a.out, a.epochs)
                io.write_json(done_path, done)
                r = done[key]
                print(f"trained {key}: val_crps={r['val_crps']:.4g} in {r['train_s']:.0f} s", flush=True)
    evals = {}
    for seed in a.seeds:
        ckpts = [r["checkpoint"] for k, r in done.items() if r["seed"] == seed and r["model"] in a.models
                 and r["target"] in a.targets and k.endswith(f"_e{a.epochs or 'preset'}")]
        names = {r["checkpoint"]: r["model"] for r in done.values()}
        evals[seed] = evaluate(EvalConfig(store=a.store, checkpoints=tuple(ckpts), targets=tuple(a.targets),
                                          out=str(a.out / f"eval_s{seed}"), names=names, bootstrap=200))
    agg = aggregate(evals)
    print_table(agg)
    res = summary(agg)
    train_s = {k: r["train_s"] for k, r in done.items()}
    io.write_json(a.out / "skill.json", {"aggregate": agg, "summary": res, "train_seconds": train_s,
                                         "seeds": a.seeds, "epochs": a.epochs})
    print("RESULT " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()))


if __name__ == "__main__":
    main()
