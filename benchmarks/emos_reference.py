"""postcast's local EMOS beside a scipy per-point fit of the same model on the same data (the operational
method: IMPROVER's point-by-point EMOS minimises each point's mean CRPS with scipy.optimize.minimize,
Nelder-Mead, from a regression start). For a random sample of grid points (all of them with
``points=None``), each point is fitted by Nelder-Mead to tight tolerance from postcast's own moment start,
polished by BFGS, on postcast's closed-form CRPS of the checkpoint's family (float64); both fits are then
scored on the test split at those points. The scipy fit time is extrapolated to the whole grid (time per
point x points) and compared with the checkpoint's own fit time (``checkpoint["postcast"]["fit"]``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from scipy import optimize

from postcast.datasets import laws
from postcast.datasets.loaders.datamodule import DataConfig, StoreDataset
from postcast.datasets.sample import SampleSpec
from postcast.models import emos_fit, emos_forms, emos_training
from postcast.models.emos_objective import PointData, crps_per_point
from postcast.models.module import load_checkpoint
from postcast.models.postprocessors import LocalEMOS


def scipy_point(d: PointData, family: str, x0: np.ndarray, form: str = "spread") -> np.ndarray:
    """One point's coefficients in ``form``: Nelder-Mead (tight tolerance), then BFGS, on the point's mean CRPS."""

    def f(theta: np.ndarray) -> float:
        with torch.no_grad():
            v = float(crps_per_point(torch.as_tensor(theta, dtype=torch.float64)[None], d, family, form)[0])
        return v if np.isfinite(v) else 1e30

    nm = optimize.minimize(f, x0, method="Nelder-Mead", options={"xatol": 1e-8, "fatol": 1e-11, "maxiter": 20000})
    bfgs = optimize.minimize(f, nm.x, method="BFGS", options={"gtol": 1e-9})
    return np.asarray(bfgs.x if bfgs.fun <= nm.fun else nm.x)


def compare(checkpoint: str, store: str, points: int | None, seed: int = 0, train_s: float = 0.0) -> dict[str, Any]:
    """Training and test CRPS (mean over the sampled points) of postcast's fit and scipy's, and fit times:
    the full-batch solver's own time, or for a local EMOS trained by the epochs' optimiser (the default of the
    non-Gaussian families) its whole training time ``train_s``."""
    model, meta = load_checkpoint(checkpoint)
    if not isinstance(model.net, LocalEMOS):
        msg = f"{checkpoint}: not a local EMOS"
        raise SystemExit(msg)
    fit = meta.get("fit") or {"solver": "gradient (the epochs' optimiser)", "seconds": train_s}
    family = model.meta.family
    cfg = DataConfig(store=store, sample=SampleSpec.from_dict(meta["sample"]))
    train, test = (emos_training.points(model, StoreDataset(cfg, split)) for split in ("train", "test"))
    n_points = train.y.shape[0]
    has_truth = (train.w.sum(1) > 0).nonzero().squeeze(1).numpy()
    rng = np.random.default_rng(seed)
    chosen = has_truth if points is None else rng.choice(has_truth, size=min(points, has_truth.size), replace=False)
    ours = model.net.theta().double()  # (P, n)
    form = "spread" if model.net.form == "auto" else model.net.form
    start = (
        emos_fit.moment_start(train, ours.shape[1], form)
        if laws.get(family).location_scale
        else emos_forms.raw_start(n_points, ours.shape[1], form, ours)
    )
    t0 = time.perf_counter()
    ref = ours.clone()
    for p in chosen:
        ref[p] = torch.as_tensor(scipy_point(train.take(torch.tensor([int(p)])), family, start[p].numpy(), form))
    per_point_s = (time.perf_counter() - t0) / len(chosen)
    idx = torch.as_tensor(chosen)
    with torch.no_grad():
        scores = {
            f"{split}_crps_{who}": float(crps_per_point(theta[idx], data.take(idx), family, form).mean())
            for split, data in (("train", train), ("test", test))
            for who, theta in (("postcast", ours), ("scipy", ref))
        }
    reference_s = per_point_s * len(has_truth)
    return {
        "family": family,
        "points": n_points,
        "sampled_points": len(chosen),
        **scores,
        "test_crps_difference": scores["test_crps_postcast"] - scores["test_crps_scipy"],
        "train_crps_difference": scores["train_crps_postcast"] - scores["train_crps_scipy"],
        "postcast_fit_s": fit["seconds"],
        "scipy_fit_s": reference_s,
        "scipy_fit_s_measured": per_point_s * len(chosen),
        "speedup": reference_s / fit["seconds"],
        "fit": fit,
    }


def print_reference(rows: dict[str, dict[str, Any]]) -> None:
    print("\nlocal EMOS: postcast's full-batch fit vs scipy per point (same model, data and CRPS; sampled points):")
    print(
        f"{'target':6} {'family':11} {'points':>9} {'test CRPS postcast':>18} {'scipy':>10} {'difference':>11} "
        f"{'fit s postcast':>14} {'scipy (all pts)':>15} {'speedup':>8}"
    )
    for t, r in rows.items():
        print(
            f"{t:6} {r['family']:11} {r['sampled_points']:>4}/{r['points']:<4} {r['test_crps_postcast']:>18.6f} "
            f"{r['test_crps_scipy']:>10.6f} {r['test_crps_difference']:>+11.2e} {r['postcast_fit_s']:>14.2f} "
            f"{r['scipy_fit_s']:>15.1f} {r['speedup']:>8.1f}"
        )
