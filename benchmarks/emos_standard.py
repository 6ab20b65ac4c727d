"""postcast's chosen local EMOS beside the standard EMOS form fitted point by point as an operational suite fits
it: N(a + b * ensemble mean, c^2 + d^2 * ensemble variance) (Gneiting et al. 2005; truncated at 0 for wind
speed, Thorarinsdottir and Gneiting 2010), one (a, b, c, d) per grid point, by scipy.optimize.minimize
(Nelder-Mead from a least-squares start, then BFGS) on the point's training dates, with the CRPS written out
here in numpy (independent of postcast's). The truncated-normal CRPS takes its ratios to Phi(mu / sigma) in log
space: the textbook form's Phi(mu / sigma)^2 underflows far in the lower tail, where the ws10 fits go at calm
points, and it was wrong there (positive or negative) from mu / sigma of about -7. Both are scored on the test
dates at the same sampled points: the area-weighted CRPS of each test date, their difference, the dates postcast
wins and a paired t-test over the dates. The oracle (the law that drew the synthetic truths, from the store) is
scored the same way, as the ceiling: the dates the true law itself wins against the standard form.

For tp24's censored shifted gamma the operational form is Scheuerer and Hamill's (2015): Y = max(0, X - delta),
X a gamma of mean mu and std sigma, delta the point's climatological shift (a censored shifted gamma fitted to its
training truths alone, then held), mu = softplus(a + b * ensemble mean) (linear above a few mm, positive) and
sigma = sqrt(c^2 + d^2 * ensemble variance). Their scale reads the members' mean absolute difference; the
store's samples hold the members' std per point, which is used here in its place. The censored-shifted-gamma
CRPS is their closed form in numpy (:func:`crps_csgd`); it cancels at shapes of order 1e6 and more, where a
non-finite or negative value again counts as no fit.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from scipy import optimize, special, stats

from postcast.datasets import contract, io, schema
from postcast.datasets.loaders.datamodule import DataConfig, StoreDataset
from postcast.datasets.sample import SampleSpec
from postcast.models import distributions, emos_forms, emos_training
from postcast.models.emos_objective import PointData
from postcast.models.module import load_checkpoint
from postcast.models.postprocessors import LocalEMOS


def crps_normal(mu: np.ndarray, sigma: np.ndarray, y: np.ndarray) -> np.ndarray:
    """sigma [z (2 Phi(z) - 1) + 2 phi(z) - 1 / sqrt(pi)], z = (y - mu) / sigma."""
    z = (y - mu) / sigma
    return sigma * (z * (2.0 * special.ndtr(z) - 1.0) + 2.0 * stats.norm.pdf(z) - 1.0 / np.sqrt(np.pi))


def crps_tnormal(mu: np.ndarray, sigma: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The normal truncated to [0, inf), y >= 0 (Thorarinsdottir and Gneiting 2010): with p = Phi(mu / sigma),
    z = (y - mu) / sigma, sigma / p^2 [z p (2 Phi(z) + p - 2) + 2 phi(z) p - Phi(sqrt(2) mu / sigma) / sqrt(pi)],
    each ratio to p taken in log space: far below mu / sigma = -7 p^2 underflows and the plain form is wrong
    (tests/test_emos_standard_reference.py)."""
    a, z = mu / sigma, (y - mu) / sigma
    log_p = special.log_ndtr(a)
    below = np.exp(special.log_ndtr(-z) - log_p)  # Phi(-z) / p <= 1, y >= 0
    density = np.exp(-0.5 * z**2 - log_p) / np.sqrt(2.0 * np.pi)  # phi(z) / p
    pairs = np.exp(special.log_ndtr(np.sqrt(2.0) * a) - 2.0 * log_p)  # Phi(sqrt(2) a) / p^2
    return sigma * (z * (1.0 - 2.0 * below) + 2.0 * density - pairs / np.sqrt(np.pi))


def crps_csgd(shape: np.ndarray, scale: np.ndarray, shift: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Y = max(0, X - shift), X ~ Gamma(shape k, scale theta), y >= 0 (Scheuerer and Hamill 2015): with
    u = (y + shift) / theta, c = shift / theta and P_k the regularised lower incomplete gamma,
    theta [u (2 P_k(u) - 1) - c P_k(c)^2 + k (1 + 2 P_k(c) P_k+1(c) - P_k(c)^2 - 2 P_k+1(u))
           - k / pi B(1/2, k + 1/2) (1 - P_2k(2 c))]."""
    k, u, c = shape, (y + shift) / scale, shift / scale
    pu, pc = special.gammainc(k, u), special.gammainc(k, c)
    inner = (
        u * (2.0 * pu - 1.0)
        - c * pc**2
        + k * (1.0 + 2.0 * pc * special.gammainc(k + 1.0, c) - pc**2 - 2.0 * special.gammainc(k + 1.0, u))
        - k / np.pi * special.beta(0.5, k + 0.5) * (1.0 - special.gammainc(2.0 * k, 2.0 * c))
    )
    return scale * inner


def csgd_of(mu: np.ndarray, sigma: np.ndarray, shift: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shape, scale, shift) of the gamma of mean mu and std sigma."""
    return (mu / sigma) ** 2, sigma**2 / mu, shift


CLOSED = {"gaussian": crps_normal, "truncnormal": crps_tnormal, "csg": crps_csgd}


def operational_law(x: np.ndarray, m: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mu, sigma) of coefficients x = (a, b, c, d) for ensemble means m and spreads s."""
    return x[0] + x[1] * m, np.sqrt(x[2] ** 2 + x[3] ** 2 * s**2)


def scheuerer_hamill(x: np.ndarray, m: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shape, scale, shift) of coefficients x = (a, b, c, d, delta): mu = softplus(a + b m),
    sigma = sqrt(c^2 + d^2 s^2), delta held from the climatological fit."""
    mu = np.logaddexp(0.0, x[0] + x[1] * m)
    return csgd_of(mu, np.sqrt(x[2] ** 2 + x[3] ** 2 * s**2), np.full_like(m, x[4]))


def _minimised(f: Any, x0: np.ndarray) -> np.ndarray:
    """Nelder-Mead from x0, then BFGS from there; the lower of the two."""
    nm = optimize.minimize(f, x0, method="Nelder-Mead", options={"xatol": 1e-8, "fatol": 1e-11, "maxiter": 20000})
    bfgs = optimize.minimize(f, nm.x, method="BFGS", options={"gtol": 1e-9})
    return np.asarray(bfgs.x if bfgs.fun <= nm.fun else nm.x)


def _objective(crps: Any, law: Any, m: np.ndarray, s: np.ndarray, y: np.ndarray, w: np.ndarray) -> Any:
    """The weighted training CRPS of coefficients x; 1e30 where the closed form fails (non-finite, negative)."""

    def f(x: np.ndarray) -> float:
        with np.errstate(all="ignore"):
            v = crps(*law(x, m, s), y)
        return float(np.sum(w * v)) if np.all(np.isfinite(v)) and np.all(v >= 0) else 1e30

    return f


def _climatological_shift(y: np.ndarray, w: np.ndarray) -> float:
    """The shift of the censored shifted gamma (mu, sigma, delta) fitted to the training truths alone."""
    wet = y[y > 0]
    mean, std = (float(wet.mean()), float(wet.std())) if wet.size > 1 else (1.0, 1.0)

    def law(z: np.ndarray, m: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return csgd_of(np.full_like(m, abs(z[0])), np.full_like(m, abs(z[1])), np.full_like(m, abs(z[2])))

    f = _objective(crps_csgd, law, y, y, y, w)
    z = _minimised(f, np.array([mean, max(std, 1e-3), 0.5 * mean]))
    return abs(float(z[2]))


def fit_point(m: np.ndarray, s: np.ndarray, y: np.ndarray, w: np.ndarray, family: str) -> np.ndarray:
    """One point's coefficients on its mean training CRPS: (a, b, c, d) of the standard form, or (a, b, c, d,
    delta) of Scheuerer and Hamill's for csg, Nelder-Mead from least squares, then BFGS."""
    keep = w > 0
    m, s, y, w = m[keep], s[keep], y[keep], w[keep]
    b, a = np.polyfit(m, y, 1)
    c = max(float(np.std(y - a - b * m)) / 2.0, 1e-3)
    if family != "csg":
        return _minimised(_objective(CLOSED[family], operational_law, m, s, y, w), np.array([a, b, c, 1.0]))
    delta = _climatological_shift(y, w)

    def f(x: np.ndarray) -> float:
        return _objective(crps_csgd, scheuerer_hamill, m, s, y, w)(np.append(x, delta))

    return np.append(_minimised(f, np.array([a + delta, b, c, 1.0])), delta)


def reference_crps(x: np.ndarray, m: np.ndarray, s: np.ndarray, y: np.ndarray, family: str) -> np.ndarray:
    """The per-date CRPS of a point's reference fit x at ensemble means m, spreads s and truths y."""
    law = scheuerer_hamill if family == "csg" else operational_law
    return CLOSED[family](*law(x, m, s), y)


def _ours(model: Any, d: PointData, family: str) -> np.ndarray:
    """postcast's per-date CRPS (P, N) on ``d`` through the checkpoint's own form and coefficients."""
    net = model.net
    form = "spread" if net.form == "auto" else net.form
    with torch.no_grad():
        raw = emos_forms.raw(net.theta().double(), d, form)  # (P, N, K)
        crps = distributions.get(family).from_raw(raw, d.m, d.s).crps(d.y)
    return crps.numpy()


def _oracle(store: str, test: StoreDataset, y: np.ndarray, family: str) -> np.ndarray | None:
    """The oracle's CRPS (P, N) at every point and test date, from the law's parameters in a synthetic store (None
    for a store without them); ``y`` (P, N): the test truths the samples hold, checked against the store's."""
    target = test.spec.resolved_target
    ds = io.open_zarr(store)
    names = contract.oracle_parameters(target)
    if not all(n in ds for n in names.values()):
        return None
    at = {schema.STEP: contract.step_position(ds.get_index(schema.STEP), test.spec.step_h)}
    rows = ds.isel(at).isel({schema.INIT_TIME: test.indices})

    def field(name: str) -> np.ndarray:  # (init, lat, lon) -> (P, N), the samples' row-major points
        values = rows[name].transpose(schema.INIT_TIME, schema.LAT, schema.LON).values.astype(np.float64)
        return values.reshape(len(test.indices), -1).T

    truth = field(contract.truth_name(target.name))
    if not np.allclose(truth, y, equal_nan=True):
        msg = f"{store}: the test truths the samples hold are not the store's; the oracle cannot be matched to them"
        raise SystemExit(msg)
    with np.errstate(all="ignore"):
        return np.asarray(CLOSED[family](*(field(n) for n in names.values()), y))


def compare_standard(checkpoint: str, store: str, points: int | None, seed: int = 0) -> dict[str, Any]:
    """Test CRPS per date (area-weighted over the sampled points) of postcast's EMOS and of the standard form
    fitted per point by scipy; postcast minus standard, dates won, the paired t-test's p."""
    model, meta = load_checkpoint(checkpoint)
    family = model.meta.family
    if not isinstance(model.net, LocalEMOS) or family not in CLOSED:
        msg = f"{checkpoint}: not a local EMOS of a family with a standard form ({list(CLOSED)})"
        raise SystemExit(msg)
    cfg = DataConfig(store=store, sample=SampleSpec.from_dict(meta["sample"]))
    data = {split: StoreDataset(cfg, split) for split in ("train", "test")}
    train, test = (emos_training.points(model, data[split]) for split in ("train", "test"))
    has_truth = (train.w.sum(1) > 0).nonzero().squeeze(1).numpy()
    rng = np.random.default_rng(seed)
    chosen = has_truth if points is None else rng.choice(has_truth, size=min(points, has_truth.size), replace=False)
    width = train.y.shape[0] // data["train"].sampler.lat.size
    area = np.cos(np.deg2rad(data["train"].sampler.lat))[chosen // width]  # (A,)
    t0 = time.perf_counter()
    ref = np.empty((chosen.size, test.y.shape[1]))
    for i, p in enumerate(chosen):
        x = fit_point(*(t[p].numpy() for t in (train.m, train.s, train.y, train.w)), family)
        ref[i] = reference_crps(x, test.m[p].numpy(), test.s[p].numpy(), test.y[p].numpy(), family)
    fit_s = time.perf_counter() - t0
    ours = _ours(model, test, family)[chosen]  # (A, N)
    oracle = _oracle(store, data["test"], test.y.numpy(), family)
    ok = test.w.numpy()[chosen] > 0
    per_date = {k: (np.where(ok, v, 0.0) * area[:, None]).sum(0) / (ok * area[:, None]).sum(0)
                for k, v in (("postcast", ours), ("standard", ref))}  # fmt: skip
    dates = np.isfinite(per_date["postcast"]) & np.isfinite(per_date["standard"])
    ours_t, ref_t = per_date["postcast"][dates], per_date["standard"][dates]
    oracle_won = None
    if oracle is not None:
        oracle_t = (np.where(ok, oracle[chosen], 0.0) * area[:, None]).sum(0) / (ok * area[:, None]).sum(0)
        oracle_won = int((oracle_t[dates] < ref_t).sum())
    return {
        "family": family,
        "form": model.net.form,
        "sampled_points": int(chosen.size),
        "test_dates": int(dates.sum()),
        "test_crps_postcast": float(ours_t.mean()),
        "test_crps_standard": float(ref_t.mean()),
        "postcast_minus_standard": float(ours_t.mean() - ref_t.mean()),
        "dates_won": int((ours_t < ref_t).sum()),
        "oracle_dates_won": oracle_won,
        "paired_t_p": float(stats.ttest_rel(ours_t, ref_t).pvalue),
        "standard_fit_s_per_point": fit_s / chosen.size,
    }


def print_standard(rows: dict[str, dict[str, Any]]) -> None:
    print("\nlocal EMOS (chosen on validation) vs the standard form per point, scipy (test dates, area-weighted):")
    head = f"{'target':6} {'form':9} {'points':>6} {'postcast':>10} {'standard':>10} {'difference':>11} {'won':>7}"
    print(f"{head} {'p':>8} {'oracle won':>10}")
    for t, r in rows.items():
        oracle = "n/a" if r["oracle_dates_won"] is None else f"{r['oracle_dates_won']}/{r['test_dates']}"
        print(
            f"{t:6} {r['form']:9} {r['sampled_points']:>6} {r['test_crps_postcast']:>10.5f} "
            f"{r['test_crps_standard']:>10.5f} {r['postcast_minus_standard']:>+11.2e} "
            f"{r['dates_won']:>3}/{r['test_dates']:<3} {r['paired_t_p']:>8.2g} {oracle:>10}"
        )
