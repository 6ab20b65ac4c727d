"""Targets as data: the registry (schema.TARGETS), derived targets (ws10, tp24) built from the store's member
fields, and their opt-in synthetic truths drawn from a known oracle (truncated normal, censored shifted gamma)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr
from battery import assert_ok, in_process
from scipy import stats

from postcast.datasets import contract, schema
from postcast.datasets.core.errors import ConfigError
from postcast.datasets.ingest.run import IngestConfig, ingest
from postcast.datasets.sample import Sampler, SampleSpec
from postcast.datasets.synth import synthetic, synthfiles
from postcast.datasets.synth.synthetic import SynthConfig
from postcast.models import distributions
from postcast.pipeline import train
from postcast.pipeline.verify.scores import crps_ensemble

# 2 years x 8 dates on the 10 deg grid, with the derived targets' truths (built in the tests: opt in)
SMALL = {
    "seed": 7,
    "resolution": 10.0,
    "years": (2016, 2017),
    "dates_per_year": 8,
    "levels": (850,),
    "targets": ("t2m", "ws10", "tp24"),
}


def test_registry_describes_every_target():
    ws, tp = schema.target("ws10"), schema.target("tp24")
    assert ws.derived and ws.inputs == (("u10", 0), ("v10", 0)) and ws.units == "m s**-1"
    assert (ws.family, ws.thresholds, ws.lead_h) == ("truncnormal", (10.0, 20.0), 48)
    assert tp.derived and tp.inputs == (("tp", 0), ("tp", -24)) and tp.units == "mm"
    assert (tp.family, tp.thresholds) == ("csg", (1.0, 10.0))
    for name in schema.ENS10_TARGETS:  # the ENS-10 three: unchanged, Gaussian variables at +48 h
        tg = schema.target(name)
        assert not tg.derived and tg.family == "gaussian" and tg.input_variables == (tg.variable,)
    for tg in schema.TARGETS.values():  # the store's oracle names are the family's parameters
        params = tuple(f.name for f in dataclasses.fields(distributions.get(tg.family)))
        assert tuple(contract.oracle_parameters(tg)) == params


def test_an_unknown_target_is_a_config_error_naming_the_targets():
    with pytest.raises(ConfigError, match=r"target 'nope': use one of \['z500', 't850', 't2m', 'ws10', 'tp24'\]"):
        schema.target("nope")
    assert schema.target("tp24") is schema.TARGETS["tp24"]  # resolved once, the registry's own object


def test_each_derived_target_is_declared_as_data_and_reproduces_its_members_by_hand():
    """ws10: hypot of (u10, v10) at the lead; tp24: tp at the lead minus tp 24 h before, clipped at 0, m -> mm."""
    ws, tp = schema.target("ws10").derive, schema.target("tp24").derive
    assert ws == schema.Derivation(schema.DeriveKind.HYPOT, ("u10", "v10"))
    assert tp == schema.Derivation(schema.DeriveKind.ACCUMULATION, ("tp",), window_h=24, clip_min=0.0, scale=1000.0)
    assert [t.name for t in schema.derived_targets()] == ["ws10", "tp24"]
    u, v = np.array([[3.0, -6.0], [0.0, 1.0]]), np.array([[4.0, -8.0], [2.0, 0.0]])  # (member, point) m/s
    tp48, tp24 = np.array([[0.0025, 0.010], [0.0, 0.0]]), np.array([[0.002, 0.0101], [0.0, 0.0]])  # m
    fields = {("u10", 0): u, ("v10", 0): v, ("tp", 0): tp48, ("tp", -24): tp24}
    by_hand = {"ws10": np.array([[5.0, 10.0], [2.0, 1.0]]), "tp24": np.array([[0.5, 0.0], [0.0, 0.0]])}
    for tg in schema.derived_targets():
        got = tg.members(lambda v, off: fields[(v, off)])
        np.testing.assert_allclose(got, by_hand[tg.name], rtol=0, atol=1e-12)
    assert (tp(tp48, tp24) >= 0).all()  # the shrinking accumulation (packing noise) is 0 mm, not negative
    with pytest.raises(ConfigError, match="give two or more"):
        schema.Derivation(schema.DeriveKind.HYPOT, ("u10",))


def _day() -> xr.Dataset:
    """One init date, 2 members, a 1 x 2 grid: u10, v10 at +48 h; tp at +0, +24, +48 h (m)."""
    steps = pd.to_timedelta([0, 24, 48], unit="h")
    u = np.array([[[3.0, 0.0]], [[-6.0, 1.0]]])  # (member, lat, lon) m/s
    v = np.array([[[4.0, 2.0]], [[-8.0, 0.0]]])
    tp = np.zeros((2, 3, 1, 2))  # (member, step, lat, lon)
    tp[:, 1] = [[[0.002, 0.0]], [[0.010, 0.0]]]
    tp[:, 2] = [[[0.0025, 0.0]], [[0.0099, 0.0]]]  # member 2: the accumulation shrinks (packing noise)
    dims = (schema.MEMBER, schema.STEP, schema.LAT, schema.LON)
    ds = xr.Dataset(
        {"u10": (dims, np.stack([u] * 3, axis=1)), "v10": (dims, np.stack([v] * 3, axis=1)), "tp": (dims, tp)},
        coords={schema.STEP: steps, schema.LAT: [0.0], schema.LON: [0.0, 10.0]},
    )
    for name in ("u10", "v10", "tp"):  # the inputs' statistics, as a store holds them
        ds[contract.ens_mean(name)] = ds[name].mean(schema.MEMBER)
        ds[contract.ens_std(name)] = ds[name].std(schema.MEMBER)
    return ds.assign_coords({schema.INIT_TIME: np.datetime64("2017-01-05")})


def _sample(target: str, variables: tuple[str, ...]) -> dict[str, np.ndarray]:
    spec = SampleSpec(target=target, variables=variables, location_features=False, season_features=False)
    return Sampler(spec, np.array([0.0]), np.array([0.0, 10.0])).sample(_day())


def test_wind_speed_is_per_member():
    """Speeds 5 and 10 m/s (not the mean wind's 2.5): mean 7.5, std 2.5; at the second point 2 and 1."""
    s = _sample("ws10", ("u10", "v10"))
    np.testing.assert_allclose(s["m"], [[7.5, 1.5]], rtol=1e-6)
    np.testing.assert_allclose(s["s"], [[2.5, 0.5]], rtol=1e-6)
    assert np.isnan(s["y"]).all()  # no truth in the data
    assert s["fields"].shape == (6, 1, 2)  # the inputs' mean and std, then the target's (no dry fraction)
    np.testing.assert_array_equal(s["fields"][4:], np.stack([s["m"], s["s"]]))
    spec = SampleSpec(target="ws10", variables=("u10",))
    assert spec.store_variables() == ["ens_mean_u10", "ens_std_u10", "u10", "v10", "truth_ws10"]
    assert spec.store_variables(oracle=True)[-2:] == ["oracle_mu_ws10", "oracle_sigma_ws10"]


def test_24h_precipitation_is_a_clipped_difference_in_mm():
    """Member 1: (2.5 - 2) mm = 0.5 mm; member 2: 9.9 - 10 < 0 -> 0 mm (dry): mean 0.25, std 0.25, dry 1/2;
    the second point has no rain: all dry."""
    s = _sample("tp24", ("tp",))
    np.testing.assert_allclose(s["m"], [[0.25, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(s["s"], [[0.25, 0.0]], rtol=1e-6)
    np.testing.assert_array_equal(s["fields"][-1], [[0.5, 1.0]])  # tp's mean and std, tp24's mean, std, dry
    assert SampleSpec(target="tp24", variables=("tp",)).field_keys()[2:] == [
        "ens_mean_tp24",
        "ens_std_tp24",
        "dry_fraction_tp24",
    ]
    with pytest.raises(ConfigError, match="step_h"):  # +0 h has no 24 h before it in the data
        Sampler(SampleSpec(target="tp24", variables=("tp",), step_h=0), np.array([0.0]), np.array([0.0, 10.0])).sample(
            _day()
        )


def test_default_synthetic_targets_are_the_ens10_three():
    cfg = SynthConfig(resolution=10.0, years=(2017, 2017), dates_per_year=1)
    assert cfg.targets == schema.ENS10_TARGETS
    truth = synthetic.truth_dataset(cfg)
    kinds = ("truth", "oracle_mean", "oracle_std")
    assert set(truth.data_vars) == {f"{kind}_{t}" for t in cfg.targets for kind in kinds}
    with pytest.raises(ConfigError, match="ws11"):
        SynthConfig(targets=("ws11",))


@pytest.fixture(scope="module")
def small():
    cfg = SynthConfig(**SMALL)
    return synthetic.forecast_dataset(cfg, ["u10", "v10", "tp"]).load(), synthetic.truth_dataset(cfg).load()


def _at48(ds: xr.Dataset, name: str) -> np.ndarray:
    return ds[name].sel({schema.STEP: pd.Timedelta(hours=48)}).values


def test_ws10_truth_is_a_draw_from_the_oracle_truncated_normal(small):
    fc, truth = small
    y = _at48(truth, "truth_ws10")
    law = distributions.TruncNormal(
        *(
            torch.from_numpy(_at48(truth, n).astype(np.float64))
            for n in contract.oracle_parameters(schema.target("ws10")).values()
        )
    )
    assert (y >= 0).all()
    pit = law.law.pit(law.numpy_params(), y.astype(np.float64)).ravel()  # the law's (datasets/laws.py)
    assert stats.kstest(pit[::7], "uniform").pvalue > 1e-3
    members = np.hypot(_at48(fc, "u10"), _at48(fc, "v10"))  # (init, member, lat, lon): per member
    raw = crps_ensemble(np.moveaxis(members, 1, -1), y).mean()
    oracle = law.crps(torch.from_numpy(y.astype(np.float64))).mean().item()
    assert oracle < 0.9 * raw, (oracle, raw)


def test_tp24_truth_is_a_draw_from_the_oracle_csg(small):
    fc, truth = small
    y = _at48(truth, "truth_tp24")
    law = distributions.CensoredShiftedGamma(
        *(
            torch.from_numpy(_at48(truth, n).astype(np.float64))
            for n in contract.oracle_parameters(schema.target("tp24")).values()
        )
    )
    gen = torch.Generator().manual_seed(0)
    u = torch.rand(y.shape, generator=gen, dtype=torch.float64)
    pit = law.law.pit(law.numpy_params(), y.astype(np.float64), u.numpy()).ravel()  # randomised at the point mass
    assert stats.kstest(pit[::7], "uniform").pvalue > 1e-3
    p_dry = law.law.cdf(law.numpy_params(), np.zeros(y.shape))
    dry = y == 0
    assert 0.1 < dry.mean() < 0.6 and abs(dry.mean() - p_dry.mean()) < 3 * np.sqrt(p_dry.mean() / dry.size) + 0.02
    assert p_dry.max() > 0.6 and p_dry.min() < 0.1  # dry regions and wet ones
    assert np.quantile(y, 0.999) > 5 * np.quantile(y[~dry], 0.5)  # rare heavy amounts
    members = schema.target("tp24").members(  # (init, member, lat, lon) mm: tp(+48 h) - tp(+24 h), clipped at 0
        lambda v, off: fc[v].sel({schema.STEP: pd.Timedelta(hours=48 + off)}).values
    )
    raw = crps_ensemble(np.moveaxis(members, 1, -1), y).mean()
    oracle = law.crps(torch.from_numpy(y.astype(np.float64))).mean().item()
    assert oracle < 0.9 * raw, (oracle, raw)


def test_a_store_with_derived_targets_samples_them(tmp_path):
    """Synthetic files with ws10 and tp24 -> ingest -> the store's samples carry the world's members'
    statistics of the derived targets, the truth and the oracle's parameters."""
    cfg = SynthConfig(**{**SMALL, "years": (2016, 2016), "dates_per_year": 2})
    synthfiles.write_synthetic(cfg, tmp_path / "raw", progress=False)
    out = tmp_path / "store.zarr"
    ingest(IngestConfig(source=str(tmp_path / "raw"), out=str(out), processes=False, progress=False))
    ds = contract.open_store(out)
    spec = SampleSpec(target="tp24", variables=("tp", "u10"))
    sampler = Sampler(spec, ds[schema.LAT].values, ds[schema.LON].values, oracle=True)
    day = ds.isel({schema.INIT_TIME: 1})
    s = sampler.sample(day)
    o = synthetic.world(cfg.seed, cfg.resolution, cfg.members).oracle("tp24", pd.Timestamp(day.init_time.values), 48)
    np.testing.assert_allclose(s["m"], o["ens_mean"], rtol=1e-4, atol=1e-4)  # float32 members in the store
    np.testing.assert_array_equal(s["y"], o["truth"].astype(np.float32))
    np.testing.assert_array_equal(s["oracle_shape"], o["shape"].astype(np.float32))
    assert "truth_ws10" in ds and "oracle_mean_ws10" not in ds


def _raw_val_crps(store: Path, target: str) -> float:
    """The members' fair CRPS of ``target`` on the validation dates at +48 h (the raw baseline)."""
    ds, tg = contract.open_store(store), schema.target(target)
    rows = contract.split_rows(ds, "val", target=tg)
    at = {h: contract.step_position(ds.get_index(schema.STEP), h) for h in (24, 48)}
    x = tg.members(
        lambda v, off: ds[v].isel({schema.INIT_TIME: rows, schema.STEP: at[48 + off]}).values.astype(np.float64)
    )  # (N, M, H, W)
    y = ds[contract.truth_name(target)].isel({schema.INIT_TIME: rows, schema.STEP: at[48]}).values
    return float(crps_ensemble(np.moveaxis(x, 1, -1), y).mean())


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
@pytest.mark.parametrize("target", ["ws10", "tp24"])
def test_one_epoch_of_emos_beats_the_raw_members(derived_store, target, tmp_path):
    """The tiny preset (the target's family: truncnormal, csg) after one epoch scores below the members."""
    cli = train.run(
        [
            "fit",
            "-c",
            f"configs/train/tiny_emos_{target}.yaml",
            "--data.cfg.store",
            str(derived_store),
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.enable_model_summary",
            "false",
        ]
    )
    tg = schema.target(target)  # the preset names no distribution nor thresholds: the target's own
    assert cli.model.hparams["distribution"] == tg.family and cli.model.thresholds == list(tg.thresholds)
    val = float(cli.trainer.callback_metrics["val_crps"])
    raw = _raw_val_crps(derived_store, target)
    assert np.isfinite(val) and val < raw, (target, val, raw)


# --- bad input (the shared battery) ---------------------------------------------------------------
@pytest.mark.battery
def test_synth_with_an_unknown_target(tmp_path, capsys):
    preset = tmp_path / "bad.yaml"
    preset.write_text("kind: synth\ntargets: [ws11]\n")
    res = in_process(["synth", "-c", str(preset), "--out", str(tmp_path / "out")], capsys)
    assert_ok("synth: unknown target", res, not (tmp_path / "out" / "synth.json").exists())
    assert res.code == 2 and "ws11" in res.error_lines[0] and "tp24" in res.error_lines[0]


@pytest.mark.battery
def test_train_a_derived_target_on_a_store_without_its_truth(store, tmp_path, capsys):
    """The ENS-10 store (no synth targets) has no truth_ws10: one line naming it, exit 66, no checkpoint."""
    res = in_process(
        [
            "train",
            "fit",
            "-c",
            "configs/train/tiny_emos_ws10.yaml",
            "--data.cfg.store",
            str(store),
            "--trainer.default_root_dir",
            str(tmp_path / "runs"),
        ],
        capsys,
    )
    assert_ok("train fit: derived target without its truth", res, not list(tmp_path.rglob("*.ckpt")))
    assert res.code == 66 and "truth_ws10" in res.error_lines[0]


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
def test_an_ens10_store_is_evaluated_and_labelled_with_its_own_targets(store, cli, tmp_path):
    """A store with truth for the ENS-10 three names those three (not every registered target), and
    `evaluate` without checkpoints scores those (it asked for ws10's truth: exit 66)."""
    ds = xr.open_zarr(store)
    held = [t for t in schema.TARGETS if contract.truth_name(t) in ds]
    assert held == list(schema.ENS10_TARGETS)
    assert ds.attrs["targets"] == held
    proc = cli("evaluate", str(store), "--out", str(tmp_path / "ev"), "--bootstrap", "20")
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = xr.open_dataset(tmp_path / "ev" / "results.nc")
    assert sorted(map(str, res["target"].values)) == sorted(held)


@pytest.mark.battery
@pytest.mark.parametrize("n", ["0", "-5"])
def test_evaluate_with_too_few_bootstrap_resamples(store, tmp_path, capsys, n):
    """It ended in an internal error (an IndexError inside the bootstrap's percentiles) after scoring."""
    out = tmp_path / "ev"
    res = in_process(["evaluate", str(store), "--out", str(out), "--bootstrap", n], capsys)
    assert_ok(f"evaluate: --bootstrap {n}", res, not (out / "results.nc").exists())
    assert "--bootstrap" in res.error_lines[0]


@pytest.mark.parametrize(
    ("preset", "target", "family"), [("emos_global_t2m", "ws10", "truncnormal"), ("transformer_t2m", "tp24", "csg")]
)
@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
def test_models_reading_the_members_take_a_derived_target(derived_store, preset, target, family, tmp_path):
    """Global EMOS and the Transformer read the target's own members: a derived target's are one more member
    variable after the inputs' (it was an IndexError, exit 70), equal to the members derived from the store."""
    cli = train.run(
        [
            "fit",
            "-c",
            f"configs/train/{preset}.yaml",
            "--data.cfg.store",
            str(derived_store),
            "--data.cfg.sample.target",
            target,
            "--model.distribution",
            family,
            "--trainer.max_epochs",
            "1",
            "--trainer.limit_train_batches",
            "2",
            "--trainer.limit_val_batches",
            "2",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.enable_model_summary",
            "false",
        ]
    )
    assert np.isfinite(float(cli.trainer.callback_metrics["val_crps"]))
    spec = cli.datamodule.cfg.sample
    ds = contract.open_store(derived_store)
    sample = Sampler(spec, ds[schema.LAT].values, ds[schema.LON].values).sample(ds.isel({schema.INIT_TIME: 3}))
    tg, at = schema.target(target), {h: contract.step_position(ds.get_index(schema.STEP), h) for h in (24, 48)}
    own = tg.members(
        lambda v, off: ds[v].isel({schema.INIT_TIME: 3, schema.STEP: at[48 + off]}).values.astype(np.float64)
    )  # (M, H, W)
    assert sample["members"].shape[1] == spec.n_member_variables == len(spec.input_variables) + 1
    np.testing.assert_allclose(sample["members"][:, -1], own, rtol=1e-6, atol=1e-6)


def test_validation_logs_the_oracle_of_a_non_gaussian_target(derived_store, tmp_path):
    """tp24's validation CRPS of the world's own censored shifted gamma (it was logged for Gaussian targets only),
    equal to scoringrules' crps_csg0 on the validation dates read from the store."""
    import scoringrules as sr

    cli = train.run(
        [
            "fit",
            "-c",
            "configs/train/tiny_emos_tp24.yaml",
            "--data.cfg.store",
            str(derived_store),
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.enable_model_summary",
            "false",
        ]
    )
    logged = float(cli.trainer.callback_metrics["val_oracle_crps"])
    ds = contract.open_store(derived_store)
    rows = contract.split_rows(ds, "val", target=schema.target("tp24"))
    step = contract.step_position(ds.get_index(schema.STEP), 48)
    k, theta, delta, y = (
        ds[n].isel({schema.INIT_TIME: rows, schema.STEP: step}).values.astype(np.float64)
        for n in ("oracle_shape_tp24", "oracle_scale_tp24", "oracle_shift_tp24", "truth_tp24")
    )
    assert logged == pytest.approx(sr.crps_csg0(y, k, scale=theta, shift=delta).mean(), rel=1e-4)


@pytest.mark.parametrize("step_h", [0, 12])
def test_an_accumulated_target_before_its_window_is_refused_when_the_spec_is_made(step_h):
    """tp24 at +0 h (or +12 h) has no 24 h of accumulation before it: the spec says so, naming the least
    lead, before training looked for truth and answered "no init date with truth in split 'val'"."""
    with pytest.raises(ConfigError, match=rf"step_h {step_h}: tp24 .*24 h.*step_h 24 or more"):
        SampleSpec(target="tp24", variables=("tp",), step_h=step_h)
    assert SampleSpec(target="tp24", variables=("tp",), step_h=24).step_h == 24


def test_a_non_negative_targets_maps_start_at_zero_in_its_own_colour_map():
    from postcast.pipeline.products import maps

    values = np.array([[2.0, 5.0], [np.nan, 9.0]])
    assert maps.scale_for("tp24", "mean", values) == maps.Scale("YlGnBu", 0.0, 9.0, "sequential")
    assert maps.scale_for("ws10", "quantile", values) == maps.Scale("viridis", 0.0, 9.0, "sequential")
    for name in ("t850", "a_target_this_version_does_not_know"):  # over the field's range
        assert maps.scale_for(name, "mean", values) == maps.Scale("plasma", None, None, "sequential")
    assert maps.scale_for("tp24", "probability", values) == maps.PROBABILITY
