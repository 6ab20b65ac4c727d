"""Every verification score against an independent computation: scoringrules, properscoring and
written-out weighted means on random data (item 2 of issue 16); weighting invariants (a field
constant in space, a field varying only with latitude, one date repeated T times)."""

from __future__ import annotations

import itertools

import numpy as np
import properscoring
import pytest
import scoringrules
import xarray as xr

from postcast.datasets import contract, schema
from postcast.datasets.core import geo
from postcast.pipeline.verify import evaluate, forecasts, metrics, significance
from postcast.pipeline.verify.chunk import Chunk, GaussianForecast

LAT = np.array([-75.0, -45.0, -15.0, 15.0, 45.0, 75.0])
LON = np.arange(0.0, 360.0, 45.0)


def make_ver(mu: np.ndarray, sigma: np.ndarray, y: np.ndarray, members: np.ndarray) -> xr.Dataset:
    """A verification dataset as :func:`forecasts.verification_dataset` returns it: one Gaussian
    forecast "raw" (T, lat, lon), members (T, M, lat, lon) and the truth."""
    t = np.arange(y.shape[0]).astype("datetime64[D]")
    dims = ("init_time", "latitude", "longitude")
    ds = xr.Dataset(
        {
            "truth": (dims, y),
            "members": (("init_time", "member", *dims[1:]), members),
            "mu": (("forecast", *dims), mu[None]),
            "sigma": (("forecast", *dims), sigma[None]),
        },
        coords={"forecast": ["raw"], "init_time": t, "latitude": LAT, "longitude": LON},
    )
    ds.attrs.update(target="t850", step_h=48, split="test", units="K")
    return ds


def random_ver(seed: int, t: int = 5, m: int = 10) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    shape = (t, LAT.size, LON.size)
    y = rng.normal(size=shape) * 3
    mu = y + rng.normal(size=shape)
    sigma = rng.uniform(0.5, 2.0, shape)
    members = mu[:, None] + sigma[:, None] * rng.normal(size=(t, m, *shape[1:]))
    return make_ver(mu, sigma, y, members)


def scores(ver: xr.Dataset, efi: np.ndarray | None = None) -> dict[str, float]:
    """Global scores of the Gaussian forecast "raw" and of the members, by name."""
    efi = np.full(ver["truth"].shape, 0.5) if efi is None else efi
    res = evaluate.score(ver, efi, bootstrap=20)
    g, ens = res["forecasts"]["raw"]["global"], res["raw_ensemble"]["global"]
    return {
        "crps": g["crps"],
        "crps_weighted": g["crps_weighted"],
        "eecrps": g["eecrps"],
        "eecrps_weighted": g["eecrps_weighted"],
        "crps_fair": ens["crps_fair"],
        "crps_fair_weighted": ens["crps_fair_weighted"],
        "crps_standard": ens["crps_standard"],
        "crps_standard_weighted": ens["crps_standard_weighted"],
    }


def weighted_mean(s: np.ndarray, lat: np.ndarray = LAT) -> float:
    """Written out: sum_t sum_p w_p s_tp / (T sum_p w_p), w the area weights of the rows."""
    w = np.broadcast_to(geo.latitude_weights(lat)[:, None], s.shape[1:])
    return float(sum((w * s[i]).sum() for i in range(s.shape[0])) / (s.shape[0] * w.sum()))


def test_gaussian_crps_matches_scoringrules_weighted_and_not():
    ver = random_ver(0)
    y, mu, sigma = ver["truth"].values, ver["mu"].values[0], ver["sigma"].values[0]
    ref = scoringrules.crps_normal(y, mu, sigma)
    np.testing.assert_allclose(ref, properscoring.crps_gaussian(y, mu, sigma), rtol=1e-10)
    got = scores(ver)
    assert got["crps"] == pytest.approx(ref.mean(), rel=1e-12)
    assert got["crps_weighted"] == pytest.approx(weighted_mean(ref), rel=1e-12)


def test_ensemble_crps_matches_scoringrules_and_properscoring_weighted_and_not():
    ver = random_ver(1)
    y, x = ver["truth"].values, np.moveaxis(ver["members"].values, 1, -1)
    fair = scoringrules.crps_ensemble(y, x, estimator="fair")
    std = properscoring.crps_ensemble(y, x)
    np.testing.assert_allclose(std, scoringrules.crps_ensemble(y, x, estimator="nrg"), rtol=1e-10)
    got = scores(ver)
    assert got["crps_fair"] == pytest.approx(fair.mean(), rel=1e-12)
    assert got["crps_standard"] == pytest.approx(std.mean(), rel=1e-12)
    assert got["crps_fair_weighted"] == pytest.approx(weighted_mean(fair), rel=1e-12)
    assert got["crps_standard_weighted"] == pytest.approx(weighted_mean(std), rel=1e-12)


def test_eecrps_weighted_is_the_area_weighted_mean_of_abs_efi_times_crps():
    ver = random_ver(2)
    efi = np.random.default_rng(5).uniform(-1, 1, ver["truth"].shape)
    crps = scoringrules.crps_normal(ver["truth"].values, ver["mu"].values[0], ver["sigma"].values[0])
    got = scores(ver, efi)
    assert got["eecrps"] == pytest.approx((np.abs(efi) * crps).mean(), rel=1e-12)
    assert got["eecrps_weighted"] == pytest.approx(weighted_mean(np.abs(efi) * crps), rel=1e-12)


def test_a_field_constant_in_space_gives_equal_weighted_and_unweighted_scores():
    rng = np.random.default_rng(3)
    t, m = 4, 8
    shape = (t, LAT.size, LON.size)
    y = np.broadcast_to(rng.normal(size=(t, 1, 1)), shape).copy()  # each date constant in space
    mu = np.broadcast_to(rng.normal(size=(t, 1, 1)), shape).copy()
    sigma = np.broadcast_to(rng.uniform(0.5, 2, (t, 1, 1)), shape).copy()
    members = np.broadcast_to(rng.normal(size=(t, m, 1, 1)), (t, m, *shape[1:])).copy()
    got = scores(make_ver(mu, sigma, y, members))
    for name in ("crps", "eecrps", "crps_fair", "crps_standard"):
        assert got[f"{name}_weighted"] == pytest.approx(got[name], rel=1e-12), name


def test_a_field_varying_only_with_latitude_gives_the_analytic_area_weighted_mean():
    """With mu = y the Gaussian CRPS is sigma (sqrt 2 - 1)/sqrt(pi); let sigma = 1 + |lat|/90, so the
    area-weighted mean is (sqrt 2 - 1)/sqrt(pi) * sum_rows a_r (1 + |lat_r|/90) / sum_rows a_r with
    a_r = sin(upper_r) - sin(lower_r), the cell bounds halfway between rows (the poles at +-90)."""
    t, m = 3, 4
    shape = (t, LAT.size, LON.size)
    y = np.zeros(shape)
    sigma = np.broadcast_to((1 + np.abs(LAT) / 90)[None, :, None], shape).copy()
    members = np.zeros((t, m, *shape[1:]))
    got = scores(make_ver(y.copy(), sigma, y, members))
    edges = np.deg2rad(np.array([-90.0, -60, -30, 0, 30, 60, 90]))
    area = np.diff(np.sin(edges))
    analytic = (np.sqrt(2) - 1) / np.sqrt(np.pi) * (area * (1 + np.abs(LAT) / 90)).sum() / area.sum()
    assert got["crps_weighted"] == pytest.approx(analytic, rel=1e-12)


def test_the_weighted_score_of_one_date_equals_that_date_repeated():
    one = random_ver(4, t=1)
    rep = make_ver(
        *(
            np.repeat(one[v].values[0 if v in ("mu", "sigma") else slice(None)], 6, axis=0)
            for v in ("mu", "sigma", "truth", "members")
        )
    )
    a, b = scores(one), scores(rep)
    for name, value in a.items():
        assert b[name] == pytest.approx(value, rel=1e-12), name


# --- CRPS decomposition (Hersbach 2000) --------------------------------------------------------
def test_hersbach_decomposition_sums_to_the_standard_crps_of_properscoring():
    rng = np.random.default_rng(6)
    x = np.sort(rng.normal(size=(400, 7)) + 0.3, axis=1)  # biased, under-dispersed cases
    y = rng.normal(size=400) * 1.5
    w = rng.uniform(0.2, 1.0, 400)
    d = metrics.hersbach(x, y, w)
    assert d["crps"] == pytest.approx(np.average(properscoring.crps_ensemble(y, x), weights=w), rel=1e-12)
    assert d["crps"] == pytest.approx(d["reliability"] - d["resolution"] + d["uncertainty"], rel=1e-12)
    assert d["crps_potential"] == pytest.approx(d["crps"] - d["reliability"], rel=1e-12)
    pairs = np.abs(y[:, None] - y[None, :])  # written out: 1/2 sum_kl w_k w_l |y_k - y_l|, w normalised
    assert d["uncertainty"] == pytest.approx(0.5 * (w @ pairs @ w) / w.sum() ** 2, rel=1e-12)


def test_hersbach_reliability_is_small_for_a_perfect_ensemble_and_large_for_a_biased_one():
    rng = np.random.default_rng(7)
    mu = rng.normal(size=20000) * 3
    x = np.sort(mu[:, None] + rng.normal(size=(20000, 9)), axis=1)
    y = mu + rng.normal(size=20000)  # drawn from the members' law
    w = np.ones(20000)
    perfect, biased = metrics.hersbach(x, y, w), metrics.hersbach(x + 1.0, y, w)
    assert perfect["reliability"] < 0.03 * perfect["crps"]  # finite M leaves a little (Hersbach 2000)
    assert biased["reliability"] > 0.2 * biased["crps"]
    assert biased["crps_potential"] == pytest.approx(perfect["crps_potential"], rel=0.05)  # a shift is reliability


def test_a_gaussian_is_decomposed_as_its_quantile_ensemble_close_to_the_closed_form():
    rng = np.random.default_rng(8)
    mu, sigma = rng.normal(size=(2, 3, 4)), rng.uniform(0.5, 2, (2, 3, 4))
    y = mu + sigma * rng.normal(size=mu.shape)
    ensemble = metrics.sorted_ensembles(Chunk(y, np.zeros_like(y), dist=GaussianForecast(mu, sigma)))
    q = np.stack([ensemble(t) for t in range(2)])  # (2, 50, 3, 4)
    std = properscoring.crps_ensemble(y, np.moveaxis(q, 1, -1))
    np.testing.assert_allclose(std, scoringrules.crps_normal(y, mu, sigma), rtol=0.02)


# --- significance ------------------------------------------------------------------------------
def test_diebold_mariano_without_lags_is_the_one_sample_t_test():
    """With no HAC lag, h = 1: the HLN factor sqrt((T - 1)/T) turns the biased-variance DM statistic
    into Student's one-sample t, so the p-values must agree with scipy's."""
    from scipy import stats

    d = np.random.default_rng(9).normal(0.3, 1.0, 25)
    assert significance.diebold_mariano(d, lag=0) == pytest.approx(stats.ttest_1samp(d, 0.0).pvalue, rel=1e-10)


def test_diebold_mariano_matches_the_written_out_newey_west_variance():
    rng = np.random.default_rng(10)
    e = rng.normal(size=41)
    d = 0.2 + e[1:] + 0.6 * e[:-1]  # MA(1): autocorrelated per-date differences
    t, lag = d.size, 3
    c = d - d.mean()
    gamma = [c[k:] @ c[: t - k] / t for k in range(lag + 1)]
    lrv = gamma[0] + 2 * sum((1 - k / (lag + 1)) * gamma[k] for k in range(1, lag + 1))
    h = lag + 1
    dm = d.mean() / np.sqrt(lrv / t) * np.sqrt((t + 1 - 2 * h + h * (h - 1) / t) / t)
    from scipy import stats

    assert significance.diebold_mariano(d, lag=lag) == pytest.approx(2 * stats.t.sf(abs(dm), t - 1), rel=1e-9)


def test_paired_comparison_flags_a_real_difference_and_not_noise():
    rng = np.random.default_rng(11)
    base = rng.gamma(2.0, 1.0, 60)
    better = significance.paired(base - 0.3 + 0.05 * rng.normal(size=60), base, n=200)
    noise = significance.paired(base + 0.05 * rng.normal(size=60), base, n=200)
    assert better.significant and better.high < 0 and better.low <= better.mean <= better.high
    assert not noise.significant and noise.low < 0 < noise.high


# --- spread/skill, reliability ------------------------------------------------------------------
def test_unbiased_spread_skill_is_one_for_a_perfect_small_ensemble():
    """Members and truth from one law, M = 4: E[(mean - y)^2] = (M + 1)/M E[s^2] (Fortin et al. 2014);
    the ratio without the (M + 1)/M factor would be sqrt(4/5) = 0.89."""
    rng = np.random.default_rng(12)
    t, m = 400, 4
    shape = (t, LAT.size, LON.size)
    mu = rng.normal(size=shape)
    members = mu[:, None] + rng.normal(size=(t, m, *shape[1:]))
    y = mu + rng.normal(size=shape)
    c = Chunk(y, np.zeros(shape), members=members)
    total, _ = metrics.score_chunk(c, LAT, LON)
    i = [mm.name for mm in metrics.METRICS].index("spread_skill")
    written = np.sqrt((m + 1) / m * members.var(axis=1, ddof=1).mean()) / np.sqrt(((members.mean(1) - y) ** 2).mean())
    assert total[i, 0, 0] == pytest.approx(written, rel=1e-12)
    assert total[i, 0, 0] == pytest.approx(1.0, abs=0.02)


def test_reliability_of_a_calibrated_gaussian_follows_the_diagonal():
    rng = np.random.default_rng(13)
    shape = (300, LAT.size, LON.size)
    mu, sigma = rng.normal(size=shape) * 2, rng.uniform(0.5, 1.5, shape)
    y = mu + sigma * rng.normal(size=shape)
    c = Chunk(y, np.zeros(shape), dist=GaussianForecast(mu, sigma))
    q = np.full(shape[1:], 1.0)
    p = metrics.exceedance(c, q, above=True)
    np.testing.assert_allclose(p, 1 - scipy_norm_cdf(q, mu, sigma), rtol=1e-12)
    rel = metrics.reliability(p, y > q, np.ones(shape[1:]))
    ok = rel[2] > 500
    np.testing.assert_allclose(rel[1][ok], rel[0][ok], atol=0.03)
    assert rel[2].sum() == y.size


def scipy_norm_cdf(q: np.ndarray, mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    from scipy import stats

    return np.asarray(stats.norm.cdf(q, mu, sigma))


# --- the results dataset of a store: every lead, significance, decomposition ---------------------
def test_evaluate_writes_every_lead_significance_and_decomposition(store, tmp_path):
    import json

    out = tmp_path / "eval"
    res = evaluate.evaluate(evaluate.EvalConfig(store=str(store), targets=("t850",), out=str(out), bootstrap=50))
    ds = xr.open_dataset(out / "results.nc")
    assert list(ds["lead"].values) == [0, 24, 48]  # the synthetic store has truth at every lead
    assert {"significant", "dm_p_value", "crps_minus_raw_low", "decomposition", "reliability"} <= set(ds)
    crps = ds["score"].sel(target="t850", metric="crps", weighting="area", region="global")
    assert np.isfinite(crps.sel(forecast=["raw", "oracle", "raw_ensemble"])).all()
    assert bool((crps.diff("lead") > 0).all())  # errors grow with lead
    dec = ds["decomposition"].sel(target="t850", region="global")
    np.testing.assert_allclose(
        dec.sel(component="crps"),
        dec.sel(component="reliability") - dec.sel(component="resolution") + dec.sel(component="uncertainty"),
        rtol=1e-10,
    )
    summary = json.loads((out / "metrics.json").read_text())["targets"]["t850"]
    assert summary == res["targets"]["t850"] | {"leads": summary["leads"]}
    assert summary["lead_h"] == 48 and set(summary["leads"]) == {"0", "24", "48"}
    g = summary["forecasts"]["oracle"]["global"]
    assert g["crps_weighted"] == pytest.approx(float(crps.sel(forecast="oracle", lead=48)))
    assert g["crps_minus_raw"]["significant"] == bool(
        ds["significant"].sel(target="t850", lead=48, forecast="oracle", region="global", weighting="none")
    )
    page = (out / "report.html").read_text()
    assert all(f"+{h} h" in page for h in (0, 24, 48)) and "reliability_t850.png" in page
    assert "decomposition_t850.png" in page and "skill_vs_lead_t850.png" in page


def md_column(text: str, header: str) -> dict[str, str]:
    """The cells under ``header`` of the first markdown table that has it, by the row's first cell."""
    lines = text.splitlines()
    at = next(
        i for i, (ln, rule) in enumerate(itertools.pairwise(lines)) if rule.startswith("|---") and f"| {header} |" in ln
    )
    j = [c.strip() for c in lines[at].split("|")].index(header)
    rows = [[c.strip() for c in ln.split("|")] for ln in itertools.takewhile(str.strip, lines[at + 2 :])]
    return {r[1]: r[j] for r in rows}


def test_a_registered_metric_reaches_metrics_json_results_nc_and_the_report(store, tmp_path, monkeypatch):
    """One new Metric in the registry and nothing else (the mean absolute error of the forecast mean,
    area-weighted too): evaluate writes it to metrics.json, results.nc (a value of the ``metric``
    dim, with its label, description and units) and the report's score table and legend, with the
    value of a hand computation."""
    import json

    mae = metrics.Metric(
        "mae",
        "MAE",
        "mean absolute error of the forecast mean",
        lambda c: {"value": np.abs(c.mean - c.truth)},
        weighted=True,
    )
    monkeypatch.setattr(metrics, "METRICS", (*metrics.METRICS, mae))
    out = tmp_path / "eval"
    evaluate.evaluate(evaluate.EvalConfig(store=str(store), targets=("t850",), out=str(out), bootstrap=20))
    summary = json.loads((out / "metrics.json").read_text())["targets"]["t850"]
    ver = forecasts.verification_dataset(
        contract.open_store(store), schema.target("t850"), "test", step_h=summary["lead_h"]
    )
    y, units = ver["truth"].values, ver.attrs["units"]
    errors = {
        "raw": np.abs(ver["mu"].sel(forecast="raw").values - y),
        forecasts.ENSEMBLE: np.abs(ver["members"].values.mean(axis=1) - y),
    }
    want = {f: e.mean() for f, e in errors.items()}
    want_w = {f: weighted_mean(e, ver["latitude"].values) for f, e in errors.items()}

    in_json = {"raw": summary["forecasts"]["raw"]["global"], forecasts.ENSEMBLE: summary[forecasts.ENSEMBLE]["global"]}
    ds = xr.open_dataset(out / "results.nc")
    in_nc = ds["score"].sel(target="t850", lead=summary["lead_h"], region="global", metric="mae")
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    for f in errors:
        assert (in_json[f]["mae"], in_json[f]["mae_weighted"]) == pytest.approx((want[f], want_w[f]), rel=1e-12), f
        assert (
            float(in_nc.sel(forecast=f, weighting="none")),
            float(in_nc.sel(forecast=f, weighting="area")),
        ) == pytest.approx((want[f], want_w[f]), rel=1e-12), f
        in_md = md_column(md, f)
        assert (in_md[mae.label], in_md[f"{mae.label}, area-w."]) == (f"{want[f]:{mae.fmt}}", f"{want_w[f]:{mae.fmt}}")
    about = ds.sel(target="t850", metric="mae")
    assert (
        str(about["metric_label"].values),
        str(about["metric_description"].values),
        str(about["metric_units"].values),
    ) == (mae.label, mae.description, units)
    assert md_column(md, "units")[mae.label] == units and f"<td>{mae.label}, area-w.</td>" in page
    assert f"- {mae.label}: {mae.description}" in md and f"<li>{mae.label}: {mae.description}</li>" in page


def test_one_member_is_refused_not_mistaken_for_a_missing_numba():
    """A ValueError of the numba kernel (one member: no fair CRPS) was caught as "numba missing" and the
    numpy kernel returned inf/NaN scores; it is now bad input, named."""
    from postcast.datasets.core.errors import BadInputError

    rng = np.random.default_rng(0)
    y = rng.normal(size=(3, 4, 5))
    chunk = Chunk(y, np.zeros_like(y), members=rng.normal(size=(3, 1, 4, 5)))  # (T, M=1, lat, lon)
    with pytest.raises(BadInputError, match="1 ensemble member"):
        chunk.ensemble_crps  # noqa: B018
