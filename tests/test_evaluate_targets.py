"""Evaluation of the derived, non-Gaussian targets (ws10, tp24): the members are derived per member, the raw
baseline is their fair CRPS, the oracle is the synthetic world's own law (truncated normal, censored shifted
gamma), and Brier scores and twCRPS are taken at the targets' own thresholds; each number is checked against
scoringrules or computed here by hand from the store."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scoringrules as sr
import xarray as xr
from scipy import special

from postcast.datasets import contract, schema
from postcast.pipeline.verify.chunk import Chunk
from postcast.pipeline.verify.evaluate import EvalConfig, evaluate


def _at(ds: xr.Dataset, name: str, rows: np.ndarray, h: int) -> np.ndarray:
    step = contract.step_position(ds.get_index(schema.STEP), h)
    return ds[name].isel({schema.INIT_TIME: rows, schema.STEP: step}).values.astype(np.float64)


@pytest.fixture(scope="module")
def evaluated(derived_store, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval_targets")
    evaluate(
        EvalConfig(store=str(derived_store), targets=("t2m", "ws10", "tp24"), split="val", out=str(out), bootstrap=20)
    )
    return json.loads((out / "metrics.json").read_text()), xr.open_dataset(out / "results.nc"), out


def test_tp24_scores_against_scoringrules(derived_store, evaluated):
    """Raw members' fair CRPS, the CSG oracle's closed-form CRPS and Brier scores at 1 and 10 mm, against
    scoringrules on the members derived here from tp at +48 h and +24 h."""
    summary, _, _ = evaluated
    ds = contract.open_store(derived_store)
    rows = contract.split_rows(ds, "val", target=schema.target("tp24"))
    x = np.maximum(_at(ds, "tp", rows, 48) - _at(ds, "tp", rows, 24), 0.0) * 1000.0  # (T, M, lat, lon) mm
    y = _at(ds, "truth_tp24", rows, 48)
    k, theta, delta = (_at(ds, f"oracle_{p}_tp24", rows, 48) for p in ("shape", "scale", "shift"))
    res = summary["targets"]["tp24"]
    assert res["baseline"] == "raw_ensemble" and res["thresholds"] == {"above_t1": 1.0, "above_t2": 10.0}
    raw, oracle = res["raw_ensemble"]["global"], res["forecasts"]["oracle"]["global"]
    np.testing.assert_allclose(raw["crps_fair"], sr.crps_ensemble(y, x, m_axis=1, estimator="fair").mean(), rtol=1e-9)
    np.testing.assert_allclose(oracle["crps"], sr.crps_csg0(y, k, scale=theta, shift=delta).mean(), rtol=1e-6)
    for event, t in res["thresholds"].items():
        p_oracle = special.gammaincc(k, (t + delta) / theta)  # P(X - delta > t)
        np.testing.assert_allclose(oracle[f"brier_{event}"], sr.brier_score((y > t) * 1.0, p_oracle).mean(), rtol=1e-9)
        np.testing.assert_allclose(
            raw[f"brier_{event}"], sr.brier_score((y > t) * 1.0, (x > t).mean(axis=1)).mean(), rtol=1e-9
        )
        np.testing.assert_allclose(
            raw[f"twcrps_{event}"], sr.twcrps_ensemble(y, x, a=t, m_axis=1, estimator="fair").mean(), rtol=1e-9
        )
    assert oracle["gap_closed"] == pytest.approx(1.0) and oracle["crps"] < raw["crps_fair"]
    assert oracle["crps_minus_raw"]["mean"] < 0  # against the members, not their Gaussian


def test_the_scorecard_measures_each_target_against_its_baseline(evaluated):
    """results.nc names each target's baseline, and the report's scorecard shows skill against it (it took the
    raw Gaussian for every target, beside significance marks tested against the members)."""
    from postcast.pipeline.verify import report

    summary, results, _ = evaluated
    assert dict(zip(results["target"].values, results["baseline"].values, strict=True)) == {
        "t2m": "raw",
        "ws10": "raw_ensemble",
        "tp24": "raw_ensemble",
    }
    names, cols, grid, _ = report._skill_grid(results)
    for target in ("t2m", "tp24"):
        res = summary["targets"][target]
        want = 100 * res["forecasts"]["oracle"]["global"]["skill_vs_raw"]
        assert grid[names.index("oracle"), cols.index(f"{target} +48h")] == pytest.approx(want, rel=1e-9)


def test_ws10_members_are_derived_per_member(derived_store, evaluated):
    summary, _, _ = evaluated
    ds = contract.open_store(derived_store)
    rows = contract.split_rows(ds, "val", target=schema.target("ws10"))
    x = np.hypot(_at(ds, "u10", rows, 48), _at(ds, "v10", rows, 48))  # (T, M, lat, lon) m/s
    y = _at(ds, "truth_ws10", rows, 48)
    res = summary["targets"]["ws10"]
    raw, gauss = res["raw_ensemble"]["global"], res["forecasts"]["raw"]["global"]
    np.testing.assert_allclose(raw["crps_fair"], sr.crps_ensemble(y, x, m_axis=1, estimator="fair").mean(), rtol=1e-9)
    np.testing.assert_allclose(gauss["crps"], sr.crps_normal(y, x.mean(axis=1), x.std(axis=1)).mean(), rtol=1e-9)
    assert res["thresholds"] == {"above_t1": 10.0, "above_t2": 20.0}
    assert res["forecasts"]["oracle"]["global"]["gap_closed"] == pytest.approx(1.0)


def test_gaussian_targets_keep_their_baseline_and_events(evaluated):
    """t2m: the raw Gaussian stays the baseline; no fixed-threshold scores (it has no thresholds)."""
    summary, results, out = evaluated
    res = summary["targets"]["t2m"]
    assert res["baseline"] == "raw" and res["thresholds"] == {}
    assert not [k for k in res["forecasts"]["raw"]["global"] if "_t1" in k or "_t2" in k]
    html = (out / "report.html").read_text()
    assert "Brier y &gt; t1" in html or "Brier y > t1" in html
    assert set(map(str, results["target"].values)) == {"t2m", "ws10", "tp24"}


class _QuantilesOnly:
    """A FamilyForecast scored through its quantiles alone (no closed-form twCRPS): the tail pass."""

    def __init__(self, ff):
        self.ff = ff

    def __getattr__(self, name):
        return getattr(self.ff, name)

    def twcrps_above(self, t, y):
        return None


class _EveryQuantile(_QuantilesOnly):
    """... whose quantile_where computes every quantile first: the reference of the tail pass."""

    def quantile_where(self, tau, mask):
        return self.ff.quantile(tau)[mask]


def test_tail_pass_computes_only_the_quantiles_an_event_can_see():
    """The twCRPS of a rain forecast (a point mass at 0) at quantile and fixed thresholds in both tails is the
    same whether every level's quantiles are computed or only those in a tail (to rounding), and agrees with
    the integral of its CDF."""
    import torch
    from test_evaluate_families import tw_crps_integral

    from postcast.models import distributions as D
    from postcast.pipeline.verify import evaluate as ev

    rng = np.random.default_rng(11)
    shape = (6, 3, 4)  # (T, lat, lon)
    k, theta, delta = rng.uniform(0.4, 2.0, shape), rng.uniform(0.5, 4.0, shape), rng.uniform(0.1, 2.0, shape)
    y = np.maximum(rng.gamma(k, theta) - delta, 0.0)
    k[0, 0, 0] = np.nan  # a broken parameter stays NaN in every score (the shortcut made it finite)
    ff = ev.FamilyForecast(D.CensoredShiftedGamma(*(torch.from_numpy(a) for a in (k, theta, delta))))
    events = {
        "below_q10": np.quantile(y, 0.1, axis=0),
        "above_q90": np.quantile(y, 0.9, axis=0),
        "above_t1": np.full(shape[1:], 1.0),
        "above_t2": np.full(shape[1:], 10.0),
    }
    fast = Chunk(y, np.zeros_like(y), dist=_QuantilesOnly(ff), thresholds=events).tail_scores
    full = Chunk(y, np.zeros_like(y), dist=_EveryQuantile(ff), thresholds=events).tail_scores
    for e in events:
        np.testing.assert_allclose(fast[f"twcrps_{e}"], full[f"twcrps_{e}"], rtol=1e-12, atol=1e-14)
        assert np.isnan(fast[f"twcrps_{e}"][0, 0, 0]) and np.isfinite(fast[f"twcrps_{e}"][1:]).all()
    law = lambda z: special.gammainc(k, (np.maximum(z, 0.0) + delta) / theta) * (z >= 0)  # noqa: E731
    integral = tw_crps_integral(law, ff.quantile, y, events["above_t1"])
    np.testing.assert_allclose(fast["twcrps_above_t1"][1:], integral[1:], rtol=5e-3, atol=1e-3)


def _upper_twcrps_by_quad(cdf, y: float, t: float) -> float:
    """int_t^inf (F(z) - 1{z >= y})^2 dz by scipy's adaptive quadrature, split where the integrand jumps."""
    from scipy import integrate

    mid = max(y, t)
    below = integrate.quad(lambda z: cdf(z) ** 2, t, mid, epsabs=1e-13, epsrel=1e-11)[0] if mid > t else 0.0
    above = integrate.quad(lambda z: (1.0 - cdf(z)) ** 2, mid, np.inf, epsabs=1e-13, epsrel=1e-11, limit=200)[0]
    return below + above


@pytest.mark.parametrize("family", ["csg", "clogistic"])
def test_the_censored_families_score_their_upper_tails_in_closed_form(family):
    """A censored family's twCRPS of weight 1{z >= t} (the tail events of tp24) is the CRPS of its law raised
    to the threshold: equal to scipy's quadrature of its CDF to 1e-9, at dry and wet outcomes below and above t
    and at t = 0, where the quantile ensemble of TAIL_LEVELS levels (the route before) is off by up to 1e-3."""
    import torch

    from postcast.models import distributions as D
    from postcast.pipeline.verify import evaluate as ev

    rng = np.random.default_rng(5)
    shape = (4, 2, 3)
    if family == "csg":
        k, theta, delta = rng.uniform(0.3, 3.0, shape), rng.uniform(0.5, 4.0, shape), rng.uniform(0.0, 2.0, shape)
        dist = D.CensoredShiftedGamma(*(torch.from_numpy(a) for a in (k, theta, delta)))
        cdfs = [lambda z, i=i: special.gammainc(k.flat[i], (z + delta.flat[i]) / theta.flat[i]) for i in range(k.size)]
        y = np.maximum(rng.gamma(k, theta) - delta, 0.0)
    else:
        loc, scale = rng.normal(0.5, 2.0, shape), rng.uniform(0.3, 2.0, shape)
        dist = D.CensoredLogistic(torch.from_numpy(loc), torch.from_numpy(scale))
        cdfs = [lambda z, i=i: special.expit((z - loc.flat[i]) / scale.flat[i]) for i in range(loc.size)]
        y = np.maximum(rng.logistic(loc, scale), 0.0)
    y[0, 0, :2] = 0.0  # dry outcomes
    t = np.array([[0.0, 0.5, 1.0], [2.0, 4.0, 8.0]])  # (lat, lon): thresholds at, near and far above 0
    ff = ev.FamilyForecast(dist)
    closed = ff.twcrps_above(t, y)
    tt = np.broadcast_to(t, shape)
    quad = np.array([_upper_twcrps_by_quad(cdfs[i], y.flat[i], tt.flat[i]) for i in range(y.size)]).reshape(shape)
    np.testing.assert_allclose(closed, quad, rtol=1e-9, atol=1e-12)
    chunk = Chunk(y, np.zeros_like(y), dist=ff, thresholds={"above_t1": t})
    np.testing.assert_array_equal(chunk.tail_scores["twcrps_above_t1"], closed)  # the chunk takes the closed form
    by_quantiles = Chunk(y, np.zeros_like(y), dist=_QuantilesOnly(ff), thresholds={"above_t1": t}).tail_scores
    assert np.abs(by_quantiles["twcrps_above_t1"] - quad).max() > 1e-6  # the quantile ensemble's error


@pytest.mark.slow
def test_the_targets_run_end_to_end(tmp_path):
    """`postcast run configs/targets.yaml` (6 min on 2 cores): t2m, ws10 and tp24 trained, evaluated against their
    baselines with the new scores in the report, and forecast files for each model."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cfg = tmp_path / "targets.yaml"
    cfg.write_text(
        (root / "configs/targets.yaml").read_text().replace("workdir: runs/targets", f"workdir: {tmp_path / 'run'}")
    )
    proc = subprocess.run(
        [sys.executable, "-m", "postcast", "--no-progress", "run", str(cfg)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run/report/metrics.json").read_text())
    assert set(summary["targets"]) == {"t2m", "ws10", "tp24"}
    tp24 = summary["targets"]["tp24"]["forecasts"]
    assert tp24["emos_tp24"]["global"]["distribution"] == "csg"
    assert tp24["emos_tp24"]["global"]["crps"] < summary["targets"]["tp24"]["raw_ensemble"]["global"]["crps_fair"]
    assert "Brier y &gt; t1" in (tmp_path / "run/report/report.html").read_text()
    files = {p.parent.name for p in (tmp_path / "run/forecasts").rglob("*.nc")}
    assert {"t2m", "ws10", "tp24"} <= files
