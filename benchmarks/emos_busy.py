"""The local EMOS fit alone and beside CPU-burning processes (issue 54: its time beside other work within 2x of
its time alone): the tp24 preset's censored-shifted-gamma fit on the targets world's training dates, in every
form the preset fits before it keeps one on validation (the spread and sh forms; points and settled points are
summed over the forms, the training CRPS too; the forms fitted side by side, as the preset's selection fits them:
:func:`postcast.models.emos_select.fits_at_once`), each fit in a fresh process (torch on every core), alone and
beside ``--burners`` processes that spin a core each, with torch's OpenMP threads sleeping at barriers
(postcast's policy: OMP_WAIT_POLICY=PASSIVE, set when postcast is imported before torch) and spinning first as
libgomp does by default (GOMP_SPINCOUNT=300000). Only the fit is timed (the store read is not); every fit must
give the same coefficients' training CRPS.

    python benchmarks/emos_busy.py                    # tp24, every point, 2 burners
    python benchmarks/emos_busy.py --every 4          # every 4th point (a quarter of the time)
    python benchmarks/emos_busy.py --policies sleep   # postcast's policy only (the spinning one is the slow half)

Last line: RESULT emos_fit_alone_s=<s> emos_fit_busy_s=<s> emos_busy_ratio=<x> spin_busy_ratio=<x>
identical=<yes|no> (postcast's policy alone and busy, their ratio; the spinning policy's ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import TARGETS_RUN, TARGETS_STORE, require_store

ROOT = Path(__file__).resolve().parents[1]
# postcast's policy (its entry points set it when postcast is imported before torch: tests/test_openmp_wait.py;
# this script's child imports torch first, so it is given here) and libgomp's default
POLICIES = {"sleep": {"OMP_WAIT_POLICY": "PASSIVE"}, "spin": {"GOMP_SPINCOUNT": "300000"}}
BURN = "while True: pass"


def child(store: str, target: str, every: int) -> dict[str, Any]:
    """One fit in this process: the preset's training points (every ``every``-th), timed around the fit."""
    import torch

    from postcast.datasets.loaders.datamodule import StoreDataset
    from postcast.models import emos_fit, emos_select, emos_training
    from postcast.pipeline.train import built

    cli = built(["-c", str(ROOT / "configs" / "train" / f"emos_{target}.yaml"), "--data.cfg.store", store])
    d = emos_training.points(cli.model, StoreDataset(cli.datamodule.cfg, "train"))
    d = d.take(torch.arange(0, d.y.shape[0], every))
    forms = emos_training.candidates(cli.model)[0]  # every form the preset fits (then keeps one on validation)

    def fit(form: str) -> tuple[str, Any, float]:
        at = d if form == "spread" else d.with_unit(d.training_unit(emos_fit.FitSettings.min_std))
        t0 = time.perf_counter()
        _, report = emos_fit.fit(at, cli.model.meta.family, form=form)
        return form, report, time.perf_counter() - t0

    row: dict[str, Any] = {"crps_fit": 0.0, "points": d.y.shape[0], "settled": 0, "forms": {}}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(emos_select.fits_at_once(len(forms))) as pool:  # side by side, as the preset's selection
        fits = list(pool.map(fit, forms))
    row["seconds"] = time.perf_counter() - t0
    for form, report, seconds in fits:
        counts = {k: getattr(report, f"{k}_points") for k in ("converged", "stalled", "limit")}
        row["forms"][form] = {"seconds": seconds, "crps_fit": report.crps_fit, **counts}
        row["crps_fit"] += report.crps_fit  # (the sum over forms: identical runs give identical sums)
        row["settled"] += sum(counts.values())
    row["points"] *= len(row["forms"])
    return row | {"threads": torch.get_num_threads()}


def one_fit(a: argparse.Namespace, policy: str, burners: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")} | POLICIES[policy]
    burning = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(burners)]
    try:
        cmd = [sys.executable, __file__, "--child", "--store", a.store, "--target", a.target, "--every", str(a.every)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    finally:
        for p in burning:
            p.kill()
            p.wait()
    row = json.loads(out.strip().splitlines()[-1])
    print(f"{policy} {'busy' if burners else 'alone'}: {row}", flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", default=str(TARGETS_STORE))
    p.add_argument("--target", default="tp24")
    p.add_argument("--every", type=int, default=1, help="fit every n-th point (1: all)")
    p.add_argument("--burners", type=int, default=2)
    p.add_argument(
        "--policies",
        nargs="+",
        choices=list(POLICIES),
        default=list(POLICIES),
        help="the policies timed (sleep required)",
    )
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "emos_busy.json"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if "sleep" not in a.policies:
        p.error("--policies must include sleep (postcast's policy, the RESULT's figures)")
    if a.child:
        print(json.dumps(child(a.store, a.target, a.every)))
        return
    a.store = require_store(a.store, TARGETS_STORE, TARGETS_RUN)
    loads = (("alone", 0), ("busy", a.burners))
    rows = {f"{pol} {load}": one_fit(a, pol, n) for pol in a.policies for load, n in loads}
    print(f"{'threads wait':<12} {'load':<6} {'points':>6} {'settled':>7} {'fit s':>8} {'training CRPS':>14}")
    for key, r in rows.items():
        pol, load = key.split()
        print(f"{pol:<12} {load:<6} {r['points']:>6} {r['settled']:>7} {r['seconds']:>8.1f} {r['crps_fit']:>14.9f}")
    ratio = {pol: rows[f"{pol} busy"]["seconds"] / rows[f"{pol} alone"]["seconds"] for pol in a.policies}
    identical = len({r["crps_fit"] for r in rows.values()}) == 1
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    summary = {"args": vars(a), "rows": rows, "ratio": ratio, "identical": identical}
    Path(a.out).write_text(json.dumps(summary, indent=1))
    alone, busy = rows["sleep alone"]["seconds"], rows["sleep busy"]["seconds"]
    spin = f"{ratio['spin']:.2f}" if "spin" in ratio else "n/a"
    same = "yes" if identical else "no"
    print(
        f"RESULT emos_fit_alone_s={alone:.1f} emos_fit_busy_s={busy:.1f} emos_busy_ratio={ratio['sleep']:.2f}"
        f" spin_busy_ratio={spin} identical={same}"
    )


if __name__ == "__main__":
    main()
