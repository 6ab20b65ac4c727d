"""The local EMOS fit alone and beside CPU-burning processes (issue 54: its time beside other work within 2x of
its time alone): the tp24 preset's whole fit on the targets world, as its training stage runs it (every
candidate the preset names, fitted and scored on the validation dates, then the one it keeps:
:func:`postcast.models.emos_select.select`; today the sh form's local fit, then its two shrinkages side by
side), each fit in a fresh process (torch on every core), alone and beside ``--burners`` processes that spin a
core each, with torch's OpenMP threads sleeping at barriers (postcast's policy: OMP_WAIT_POLICY=PASSIVE, set
when postcast is imported before torch) and spinning first as libgomp does by default (GOMP_SPINCOUNT=300000).
Only the selection is timed (the store's samples are read into the scratch folder before); every fit must give
the same kept coefficients' training CRPS.

    python benchmarks/emos_busy.py                    # tp24, every point, 2 burners
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
from pathlib import Path
from typing import Any

from common import TARGETS_RUN, TARGETS_STORE, require_store

ROOT = Path(__file__).resolve().parents[1]
# postcast's policy (its entry points set it when postcast is imported before torch: tests/test_openmp_wait.py;
# this script's child imports torch first, so it is given here) and libgomp's default
POLICIES = {"sleep": {"OMP_WAIT_POLICY": "PASSIVE"}, "spin": {"GOMP_SPINCOUNT": "300000"}}
BURN = "while True: pass"


def child(store: str, target: str) -> dict[str, Any]:
    """The preset's whole fit in this process, as its training stage runs it: every candidate it names (forms, then
    poolings and shrinkages of the best form) fitted and scored on the validation dates, timed from the first fit
    to the choice (the store's samples are read into the scratch folder before, untimed)."""
    import torch

    from postcast.models import emos_training
    from postcast.pipeline.train import built

    cli = built(["-c", str(ROOT / "configs" / "train" / f"emos_{target}.yaml"), "--data.cfg.store", store])
    # the inputs' statistics, as the model's on_fit_start sets them (without them the fit saw other inputs than the
    # training stage's: validation 0.812622 against the stage's 0.814428 for tp24's sh form)
    mean, std = cli.datamodule.normalisation(cli.model.hparams["normalisation"])
    cli.model.set_normalisation(torch.from_numpy(mean), torch.from_numpy(std))
    report = emos_training.fit(cli.model, cli.datamodule.cfg)
    counts = ("converged", "stalled", "limit", "kept")
    return {
        "seconds": report["seconds"],
        "crps_fit": report["crps_fit"],  # the kept candidate's training CRPS: identical runs give identical values
        "points": report["points"],
        "settled": sum(report[f"{k}_points"] for k in counts),
        "candidates": report.get("selection", {}).get("candidates", []),  # each one's seconds and validation CRPS
        "threads": torch.get_num_threads(),
    }


def one_fit(a: argparse.Namespace, policy: str, burners: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")} | POLICIES[policy]
    burning = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(burners)]
    try:
        cmd = [sys.executable, __file__, "--child", "--store", a.store, "--target", a.target]
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
        print(json.dumps(child(a.store, a.target)))
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
