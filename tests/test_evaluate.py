"""Training through the Lightning CLI (presets, resume, DDP) and `postcast evaluate` on the tiny store."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from postcast.datasets import contract, schema
from postcast.models.module import load_checkpoint
from postcast.pipeline.verify import evaluate, forecasts, scores

ROOT = Path(__file__).resolve().parents[1]


def fit(run, store, root: Path, preset: str, *extra: str):
    """Train ``preset`` with ``run`` (the ``cli`` fixture, in this process; ``process`` for DDP)."""
    args = [
        "train",
        "fit",
        "-c",
        str(ROOT / "configs/train" / f"{preset}.yaml"),
        "--data.cfg.store",
        str(store),
        "--trainer.default_root_dir",
        str(root),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.max_epochs",
        "1",
        "--data.cfg.batch_size",
        "2",
        *extra,
    ]
    run(*args, check=True, timeout=900)
    return sorted(root.rglob("best*.ckpt"))[-1]


@pytest.fixture(scope="module")
def trained(cli, store, tmp_path_factory):
    """Checkpoints of three model families on T850, one epoch each (the pipeline, not the skill)."""
    root = tmp_path_factory.mktemp("runs")
    return {p: fit(cli, store, root / p, p) for p in ("emos_t850", "unet_smoe_t850", "transformer_t850")}


def test_checkpoints_are_self_describing(trained, store):
    model, meta = load_checkpoint(str(trained["transformer_t850"]))
    assert meta["format_version"] == 5 and "checksum" in meta
    assert meta["family"] == "transformer" and meta["sample"]["members"]
    assert list(meta["sample"]["variables"][:2]) == ["t", "z"] and model.hparams["grid"] == (19, 36)
    assert float(model.norm_std.abs().sum()) > 0 and model.norm_mean.shape == (2 * 8, 19, 36)


def test_resume_continues_from_the_last_checkpoint(cli, store, tmp_path):
    fit(cli, store, tmp_path, "mlp_t850")
    last = next(tmp_path.rglob("last.ckpt"))
    steps = torch.load(last, weights_only=False)["global_step"]
    cli(
        "train",
        "fit",
        "-c",
        str(ROOT / "configs/train/mlp_t850.yaml"),
        "--data.cfg.store",
        str(store),
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.enable_progress_bar",
        "false",
        "--data.cfg.batch_size",
        "2",
        "--trainer.max_epochs",
        "2",
        "--ckpt_path",
        str(last),
        check=True,
    )
    newest = max(tmp_path.rglob("last*.ckpt"), key=lambda p: p.stat().st_mtime)
    ck = torch.load(newest, weights_only=False)
    assert ck["epoch"] == 1 and ck["global_step"] == 2 * steps  # one more epoch, not a restart


@pytest.mark.distributed
def test_ddp_on_two_cpu_processes(process, store, tmp_path):
    ckpt = fit(process, store, tmp_path, "mlp_t850", "--trainer.devices", "2", "--trainer.strategy", "ddp")
    model, _ = load_checkpoint(str(ckpt))
    assert model.hparams["family"] == "mlp"


def test_evaluate_cli_writes_metrics_and_report(cli, trained, store, tmp_path):
    out = tmp_path / "eval"
    proc = cli(
        "evaluate",
        str(store),
        "--checkpoints",
        *map(str, trained.values()),
        "--out",
        str(out),
        "--bootstrap",
        "50",
        check=True,
    )
    res = json.loads((out / "metrics.json").read_text())
    t850 = res["targets"]["t850"]
    names = set(t850["forecasts"])
    assert {"raw", "oracle", "emos_t850", "unet_smoe_t850", "transformer_t850"} <= names
    g = {f: t850["forecasts"][f]["global"] for f in names}
    assert g["oracle"]["crps"] < g["raw"]["crps"] and g["oracle"]["gap_closed"] == pytest.approx(1.0)
    assert g["raw"]["skill_vs_raw"] == 0.0 and g["raw"]["crps_minus_raw"]["mean"] == 0.0
    for f in names:
        assert 0 < g[f]["eecrps"] < g[f]["crps"] and g[f]["crps_weighted"] > 0
        assert sum(g[f]["pit_histogram"]) == t850["n_dates"] * 19 * 36
    raw_ens = t850["raw_ensemble"]["global"]
    assert raw_ens["crps_fair"] < raw_ens["crps_standard"]  # the fair estimator removes the finite-M penalty
    assert sum(raw_ens["rank_histogram"]) == t850["n_dates"] * 19 * 36
    html = (out / "report.html").read_text()
    for png in re.findall(r'src="([^"]+\.png)"', html):
        assert (out / png).stat().st_size > 1000
    assert "crps_map_t850.png" in html and "scorecard.png" in html and "unet_smoe_t850" in html
    assert "transformer_t850" in proc.stdout and "report:" in proc.stdout
    scoring = [ln for ln in proc.stderr.splitlines() if "scoring t850 +48 h:" in ln]  # names, not numpy reprs
    assert scoring and all("np.str_" not in ln and "oracle" in ln for ln in scoring), scoring


def test_evaluate_rejects_bad_checkpoints(cli, store, tmp_path):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint")
    proc = cli("evaluate", str(store), "--checkpoints", str(bad), "--out", str(tmp_path / "e"))
    assert proc.returncode == 65 and "not a readable checkpoint" in proc.stderr
    proc = cli("evaluate", str(store), "--checkpoints", str(tmp_path / "missing.ckpt"))
    assert proc.returncode == 66 and "not found" in proc.stderr


@pytest.mark.parametrize("backend", ["numpy", "dask"])
def test_score_matches_the_metric_definitions(store, backend):
    ds = contract.open_store(store)
    ds = ds.load() if backend == "numpy" else ds
    ver = forecasts.verification_dataset(ds, schema.target("t2m"), "test")
    y = ver["truth"].values
    shifted = ver["mu"].sel(forecast="raw").values + 0.5
    ver = forecasts.add_forecast(ver, "shifted", shifted, ver["sigma"].sel(forecast="raw").values)
    efi = evaluate.efi_fields(ds, ver)
    assert efi.shape == y.shape and np.abs(efi).max() <= 1
    res = evaluate.score(ver, efi, bootstrap=50)
    raw = scores.crps_gaussian(ver["mu"].sel(forecast="raw").values, ver["sigma"].sel(forecast="raw").values, y)
    assert res["forecasts"]["raw"]["global"]["crps"] == pytest.approx(raw.mean())
    assert res["forecasts"]["raw"]["global"]["eecrps"] == pytest.approx(
        np.mean([scores.eecrps(raw[i], efi[i]) for i in range(len(raw))])
    )
    members = np.moveaxis(ver["members"].values, 1, -1)
    want = scores.crps_ensemble_reference(members, y, estimator="fair").mean()
    assert res["raw_ensemble"]["global"]["crps_fair"] == pytest.approx(want)
    s = res["forecasts"]["shifted"]["global"]
    orc = res["forecasts"]["oracle"]["global"]["crps"]
    raw_g = res["forecasts"]["raw"]["global"]
    assert s["gap_closed"] == pytest.approx((raw_g["crps"] - s["crps"]) / (raw_g["crps"] - orc))
    assert s["bias"] == pytest.approx(raw_g["bias"] + 0.5)
    lo, hi = s["crps_minus_raw"]["ci95"]
    assert lo <= s["crps_minus_raw"]["mean"] <= hi


def test_a_bug_inside_evaluate_is_an_internal_error_with_a_log(
    cli, trained, store, tmp_path, monkeypatch, internal_error
):
    planted_bug, assert_internal_error = internal_error
    monkeypatch.setattr("postcast.pipeline.verify.evaluate.stream_leads", planted_bug)
    proc = cli(
        "evaluate",
        str(store),
        "--checkpoints",
        str(trained["emos_t850"]),
        "--out",
        str(tmp_path / "e"),
        "--bootstrap",
        "20",
    )
    assert_internal_error(proc)


def test_a_model_whose_sigma_underflows_to_zero_is_scored(cli, t2m_ckpt, store, tmp_path):
    """A local EMOS whose b0 is -200 at a quarter of the points predicts sigma = s exp(b) = 0 there (float32
    underflow; seen after a few epochs on 2 dates). evaluate floors it as it floors the raw ensemble's
    spread (the CRPS of N(mu, 1e-6^2) is |y - mu| to 1e-6) instead of ending with exit 70."""
    from postcast.models.module import content_checksum

    ckpt = torch.load(t2m_ckpt, map_location="cpu", weights_only=True)
    (key,) = (k for k in ckpt["state_dict"] if k.endswith("coef"))
    coef = ckpt["state_dict"][key].clone()  # (a0, a1, b0, b1) per point
    coef[2, ::2, ::2], coef[3, ::2, ::2] = -200.0, 0.0
    ckpt["state_dict"][key] = coef
    ckpt["postcast"]["checksum"] = content_checksum(ckpt, ckpt["postcast"])
    degenerate = tmp_path / "sigma0.ckpt"
    torch.save(ckpt, degenerate)
    assert float(torch.exp(torch.tensor(-200.0))) == 0.0  # the model does predict sigma = 0 there
    out = tmp_path / "eval"
    proc = cli("evaluate", str(store), "--checkpoints", str(degenerate), "--out", str(out), "--bootstrap", "10")
    assert proc.returncode == 0, proc.stderr[-2000:]
    t2m = json.loads((out / "metrics.json").read_text())["targets"]["t2m"]["forecasts"]
    (name,) = (f for f in t2m if f not in ("raw", "oracle"))
    assert np.isfinite(t2m[name]["global"]["crps"]) and t2m[name]["global"]["crps"] > 0


def test_a_checkpoint_whose_target_disagrees_with_its_weights_is_bad_data(cli, t2m_ckpt, store, synth_zarr, tmp_path):
    """Metadata re-signed to say t850 over a t2m model's weights: evaluate and forecast answer 65 naming both
    targets (they ended with exit 70 on a tensor size mismatch)."""
    from postcast.models.module import content_checksum

    ckpt = torch.load(t2m_ckpt, map_location="cpu", weights_only=True)
    ckpt["postcast"]["sample"]["target"] = "t850"
    ckpt["postcast"]["checksum"] = content_checksum(ckpt, ckpt["postcast"])
    mixed = tmp_path / "mixed.ckpt"
    torch.save(ckpt, mixed)
    runs = [
        cli("evaluate", str(store), "--checkpoints", str(mixed), "--out", str(tmp_path / "e")),
        cli(
            "forecast",
            "--checkpoint",
            str(mixed),
            "--input",
            str(synth_zarr),
            "--init-time",
            "2017-02-01",
            "--out",
            str(tmp_path / "f"),
        ),
    ]
    for proc in runs:
        assert proc.returncode == 65, proc.stderr[-2000:]
        (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("postcast:")]
        assert "t850" in line and "t2m" in line and str(mixed) in line
