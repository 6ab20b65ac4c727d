"""`postcast evaluate` on checkpoints of any predictive family, and the tail scores (Brier, reliability and
threshold-weighted CRPS at the evaluation thresholds) of every forecast, each cross-checked against
scoringrules or a numerical integral of the family's CDF (scipy.stats), never against our own code."""

import json
from pathlib import Path

import numpy as np
import pytest
import scoringrules as sr
import torch
from scipy import special, stats

from postcast.datasets import contract, schema
from postcast.datasets.loaders.datamodule import DataConfig, StoreDataset
from postcast.datasets.sample import SampleSpec
from postcast.models import distributions as D
from postcast.models.module import load_checkpoint
from postcast.pipeline.verify import accumulate, chunk, evaluate, forecasts, metrics

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("truncnormal", "csg")
N_GRID = 4001  # points of each numerical integral


# --- references: scipy laws of the saved parameters, integrals of (F - 1{z >= y})^2 ---------------
def scipy_law(family: str, p: dict[str, np.ndarray]) -> tuple:
    """(cdf, ppf) of the family's law from its parameters, through scipy.stats."""
    if family == "truncnormal":
        law = stats.truncnorm(-p["mu"] / p["sigma"], np.inf, loc=p["mu"], scale=p["sigma"])
        return law.cdf, law.ppf
    gam = stats.gamma(p["shape"], scale=p["scale"])  # Y = max(0, X - shift)
    return (
        lambda z: np.where(z >= 0, gam.cdf(z + p["shift"]), 0.0),
        lambda q: np.maximum(gam.ppf(q) - p["shift"], 0.0),
    )


def _integral(f, lo: np.ndarray, hi: np.ndarray, n: int = N_GRID) -> np.ndarray:
    """int_lo^hi f(z) dz, elementwise over the arrays lo <= hi, by the trapezoid rule on n points."""
    s = np.linspace(0.0, 1.0, n).reshape(-1, *([1] * lo.ndim))
    z = lo + (hi - lo) * s  # (n, *S)
    return np.trapezoid(f(z), z, axis=0)


def tw_crps_integral(cdf, ppf, y: np.ndarray, t: np.ndarray | float, n: int = N_GRID) -> np.ndarray:
    """int_t^inf (F(z) - 1{z >= y})^2 dz: the twCRPS with weight 1{z >= t} (t = -inf: the CRPS), the
    limits where F < 1e-12 and 1 - F < 1e-12, split at y where the integrand jumps."""
    lo = np.maximum(np.minimum(ppf(1e-12), y), t)
    hi = np.maximum(np.maximum(ppf(1 - 1e-12), y), t)
    mid = np.clip(y, lo, hi)
    return _integral(lambda z: cdf(z) ** 2, lo, mid, n) + _integral(lambda z: (1 - cdf(z)) ** 2, mid, hi, n)


# --- the verification core on a known law (no training) -------------------------------------------
@pytest.fixture
def chunk_case():
    rng = np.random.default_rng(3)
    shape = (5, 3, 4)  # (T, lat, lon)
    mu, sigma = rng.normal(1.0, 1.0, shape), rng.uniform(0.5, 2.0, shape)
    y = np.abs(rng.normal(1.0, 1.5, shape))
    t = np.quantile(y, 0.7, axis=0)  # (lat, lon)
    return mu, sigma, y, t


def test_family_chunk_scores_match_scipy_and_scoringrules(chunk_case):
    mu, sigma, y, t = chunk_case
    dist = forecasts.FamilyForecast(D.TruncNormal(torch.from_numpy(mu), torch.from_numpy(sigma)))
    c = chunk.Chunk(y, np.zeros_like(y), dist=dist, thresholds={"above_q90": t, "below_q10": t})
    cdf, ppf = scipy_law("truncnormal", {"mu": mu, "sigma": sigma})
    assert c.kind == chunk.PREDICTIVE
    np.testing.assert_allclose(c.crps, sr.crps_tnormal(y, mu, sigma, lower=0.0), rtol=1e-9)
    np.testing.assert_allclose(metrics.exceedance(c, t, True), 1 - cdf(t), rtol=1e-9)
    np.testing.assert_allclose(metrics.pit(c), cdf(y), rtol=1e-9)
    tw = c.tail_scores["twcrps_above_q90"]
    np.testing.assert_allclose(tw, tw_crps_integral(cdf, ppf, y, t), rtol=2e-3, atol=1e-4)
    levels = ((np.arange(4000) + 0.5) / 4000).reshape(-1, 1, 1, 1)
    dense = np.moveaxis(ppf(levels), 0, -1)  # (T, lat, lon, 4000): a dense quantile ensemble
    np.testing.assert_allclose(tw, _tw_sr(y, dense, t), rtol=2e-3, atol=1e-4)
    low = c.tail_scores["twcrps_below_q10"]  # weight 1{z <= t}: the mirror image
    mirror = tw_crps_integral(lambda z: 1 - cdf(-z), lambda q: -ppf(1 - q), -y, -t)
    np.testing.assert_allclose(low, mirror, rtol=2e-3, atol=1e-4)
    var = stats.truncnorm(-mu / sigma, np.inf, loc=mu, scale=sigma).var()
    np.testing.assert_allclose(c.variance, var, rtol=1e-9)
    np.testing.assert_allclose(c.mean, stats.truncnorm(-mu / sigma, np.inf, loc=mu, scale=sigma).mean(), rtol=1e-9)


@pytest.mark.parametrize("family", D.names())
def test_every_family_goes_through_the_registry(family, chunk_case):
    """Each family (point masses at 0 included: outcomes at 0) scores finite values for every metric, a
    PIT per case, and a twCRPS that matches the integral of its own CDF (the quantile pass is sound)."""
    _, _, y, t = chunk_case
    y = np.where(y < 0.5, 0.0, y)  # rain-like: some outcomes exactly at the censoring point
    raw = torch.from_numpy(np.random.default_rng(5).normal(0.0, 0.5, (*y.shape, D.get(family).n_raw)))
    m, s = torch.full(y.shape, 1.0, dtype=torch.float64), torch.full(y.shape, 0.8, dtype=torch.float64)
    ff = forecasts.FamilyForecast(D.get(family).from_raw(raw, m, s))
    lat, lon = np.linspace(-60.0, 60.0, y.shape[1]), np.linspace(0.0, 270.0, y.shape[2])
    c = chunk.Chunk(y, np.zeros_like(y), dist=ff)
    events = {"above_q90": t, "below_q10": t}
    res = accumulate.as_dataset([family], [c], lat, lon, np.arange(y.shape[0]), events)
    applies = [m.name for m in metrics.METRICS if chunk.PREDICTIVE in m.kinds and m.event in ("", *events)]
    assert np.isfinite(res["score"].sel(metric=applies).values).all() and int(res["pit_histogram"].sum()) == y.size

    def cdf(z: np.ndarray) -> np.ndarray:  # Bernstein's cdf takes points of shape S only
        return np.stack([ff.cdf(zi) for zi in z])

    qs = np.stack([ff.quantile(tau) for tau in (np.arange(1000) + 0.5) / 1000])  # (1000, T, lat, lon)
    # closed-form moments (their parameter layout) against the quantile ensemble, short of its far tail
    np.testing.assert_allclose(c.mean, qs.mean(axis=0), rtol=1e-2, atol=1e-3)
    np.testing.assert_allclose(c.variance, qs.var(axis=0), rtol=5e-2, atol=1e-3)
    tw = chunk.Chunk(y, np.zeros_like(y), dist=ff, thresholds={"above_q90": t}).tail_scores
    np.testing.assert_allclose(
        tw["twcrps_above_q90"], tw_crps_integral(cdf, ff.quantile, y, t, n=801), rtol=5e-3, atol=1e-3
    )


def _tw_sr(y: np.ndarray, x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """scoringrules' twCRPS (weight 1{z >= t}, the standard estimator) point by point: its threshold is one
    float. x (T, lat, lon, M), t (lat, lon). 'qd' (quantile decomposition) is the standard 'nrg' estimator in
    O(M log M): equal to it (checked on the first point), and 4000 members took 'nrg' O(M^2) seconds."""
    out = np.empty(y.shape)
    for i, j in np.ndindex(t.shape):
        out[:, i, j] = sr.twcrps_ensemble(y[:, i, j], x[:, i, j], a=float(t[i, j]), estimator="qd")
    np.testing.assert_allclose(
        out[:, 0, 0], sr.twcrps_ensemble(y[:, 0, 0], x[:, 0, 0], a=float(t[0, 0]), estimator="nrg"), rtol=1e-9
    )
    return out


def test_gaussian_tail_scores_and_raw_members(chunk_case):
    mu, sigma, y, t = chunk_case
    events = {"above_q90": t, "below_q10": t}
    g = chunk.Chunk(y, np.zeros_like(y), dist=chunk.GaussianForecast(mu, sigma), thresholds=events)
    law = stats.norm(mu, sigma)
    np.testing.assert_allclose(
        g.tail_scores["twcrps_above_q90"], tw_crps_integral(law.cdf, law.ppf, y, t), rtol=2e-3, atol=1e-4
    )
    brier = metrics.METRICS[[m.name for m in metrics.METRICS].index("brier_above_q90")]
    np.testing.assert_allclose(
        brier.statistics(g)["value"], sr.brier_score((y > t).astype(float), law.sf(t)), rtol=1e-9, atol=1e-12
    )
    members = np.random.default_rng(4).normal(mu[:, None], sigma[:, None], (5, 10, 3, 4))  # (T, M, lat, lon)
    e = chunk.Chunk(y, np.zeros_like(y), members=members, thresholds=events)
    fair = np.empty(y.shape)
    for i, j in np.ndindex(t.shape):
        fair[:, i, j] = sr.twcrps_ensemble(
            y[:, i, j], members[:, :, i, j], a=float(t[i, j]), m_axis=1, estimator="fair"
        )
    np.testing.assert_allclose(e.tail_scores["twcrps_above_q90"], fair, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(
        brier.statistics(e)["value"], sr.brier_score((y > t).astype(float), (members > t).mean(axis=1)), rtol=1e-9
    )


def test_old_gaussian_numbers_are_unchanged(chunk_case):
    """The Gaussian path keeps its closed forms: CRPS, variance, PIT as before (scoringrules, scipy)."""
    mu, sigma, y, _ = chunk_case
    g = chunk.Chunk(y, np.zeros_like(y), dist=chunk.GaussianForecast(mu, sigma))
    assert g.kind == chunk.PREDICTIVE  # scored by the same code as every other family
    np.testing.assert_allclose(g.crps, sr.crps_normal(y, mu, sigma), rtol=1e-12)
    assert np.array_equal(g.variance, sigma**2) and np.array_equal(metrics.pit(g), special.ndtr((y - mu) / sigma))


# --- end to end: train a tiny checkpoint of each family, evaluate it through the CLI ---------------
def fit(cli, store, root: Path, family: str) -> Path:
    cli(
        "train",
        "fit",
        "-c",
        str(ROOT / "configs/train/tiny_emos_t2m.yaml"),
        "--data.cfg.store",
        str(store),
        "--trainer.default_root_dir",
        str(root),
        "--trainer.max_epochs",
        "1",
        "--data.cfg.batch_size",
        "2",
        "--model.distribution",
        family,
        check=True,
    )
    return sorted(root.rglob("best*.ckpt"))[-1]


@pytest.fixture(scope="module")
def family_checkpoints(cli, store, tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f"tiny_{f}": fit(cli, store, root / f"tiny_{f}", f) for f in FAMILIES}  # name -> checkpoint


def saved_parameters(path: Path, store: Path) -> dict[str, np.ndarray]:
    """The checkpoint's predictive parameters (T, lat, lon) on the test split, straight from the model."""
    model, meta = load_checkpoint(str(path))
    data = StoreDataset(DataConfig(store=str(store), sample=SampleSpec.from_dict(meta["sample"])), "test")
    with torch.no_grad():
        parts = [model.predict_step({k: v[None] for k, v in data[i].items()}, i) for i in range(len(data))]
    return {k: torch.cat([p[k] for p in parts]).double().numpy() for k in parts[0]}


@pytest.mark.slow  # 65 s (two trainings, integration references); the families' scoring is in the default tier below
def test_evaluate_cli_scores_non_gaussian_checkpoints(cli, family_checkpoints, store, tmp_path):
    out = tmp_path / "eval"
    proc = cli(
        "evaluate",
        str(store),
        "--checkpoints",
        *map(str, family_checkpoints.values()),
        "--out",
        str(out),
        "--bootstrap",
        "20",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((out / "metrics.json").read_text())["targets"]["t2m"]
    ds = contract.open_store(str(store))
    ver = forecasts.verification_dataset(ds, schema.target("t2m"), "test", step_h=res["lead_h"])
    y, t = ver["truth"].values, evaluate.climate_thresholds(ds, schema.target("t2m"), res["lead_h"])["above_q90"]
    report = (out / "report.md").read_text()
    for name, path in family_checkpoints.items():
        family = name.removeprefix("tiny_")
        g = res["forecasts"][name]["global"]
        assert f"{name} [{family}]" in report
        p = saved_parameters(path, store)
        cdf, ppf = scipy_law(family, p)
        ref = (
            sr.crps_tnormal(y, p["mu"], p["sigma"], lower=0.0)
            if family == "truncnormal"
            else tw_crps_integral(cdf, ppf, y, -np.inf)
        )
        assert g["distribution"] == family
        assert g["crps"] == pytest.approx(ref.mean(), rel=1e-6 if family == "truncnormal" else 1e-4)
        brier = sr.brier_score((y > t).astype(float), 1.0 - cdf(t))
        assert g["brier_above_q90"] == pytest.approx(brier.mean(), rel=1e-6)
        assert g["twcrps_above_q90"] == pytest.approx(tw_crps_integral(cdf, ppf, y, t).mean(), rel=5e-3)
        assert sum(g["pit_histogram"]) == y.size and 0 <= g["coverage_80"] <= 1
        if family == "truncnormal":  # spread: sqrt of the mean predictive variance
            var = stats.truncnorm(-p["mu"] / p["sigma"], np.inf, loc=p["mu"], scale=p["sigma"]).var()
            assert g["spread"] == pytest.approx(np.sqrt(var.mean()), rel=1e-6)
    raw = res["raw_ensemble"]["global"]
    members = ver["members"].values  # (T, M, lat, lon)
    assert raw["brier_above_q90"] == pytest.approx(
        sr.brier_score((y > t).astype(float), (members > t).mean(axis=1)).mean(), rel=1e-9
    )
    assert raw["crps_fair"] > 0 and raw["twcrps_above_q90"] > 0
