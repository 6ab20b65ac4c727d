"""Samples from the store, and pointwise post-processors that learn from them."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from postcast.datasets import contract, schema
from postcast.datasets.core.errors import BadInputError, ConfigError
from postcast.datasets.loaders.datamodule import DataConfig, StoreDataModule, StoreDataset
from postcast.datasets.sample import SampleSpec
from postcast.datasets.synth.weather import Weather
from postcast.models.kernels import crps_gaussian as metrics_torch_crps
from postcast.models.module import PostProcessor
from postcast.pipeline.verify import scores

GRID = (19, 36)


@pytest.fixture(scope="module")
def cfg(store):
    return DataConfig(store=str(store), sample=SampleSpec(target="t850"))


def _model(cfg: DataConfig, family: str, net: dict | None = None, **kw) -> PostProcessor:
    """A post-processor for ``cfg``'s samples with the store's statistics, as training sets it up."""
    model = PostProcessor(family, net=net, sample=cfg.sample.to_dict(), grid=GRID, **kw)
    model.set_normalisation(*(torch.from_numpy(a) for a in StoreDataModule(cfg).normalisation()))
    return model


def test_sample_fields_and_shapes(cfg, store):
    data = StoreDataset(cfg, "train")
    spec = cfg.sample
    assert len(data) == 6 and spec.n_fields == 2 * 7 and spec.n_channels == 2 * 7 + 3 + 2
    s = data[0]
    assert s["fields"].shape == (spec.n_fields, *GRID) and s["fields"].dtype == torch.float32
    assert s["features"].shape == (spec.n_features, *GRID)
    assert s["y"].shape == s["m"].shape == s["s"].shape == s["oracle_mean"].shape == GRID
    assert torch.isfinite(s["fields"]).all() and torch.isfinite(s["y"]).all()
    # physical units, read independently with xarray: channel 2k/2k+1 = ens mean/std of input k at 850 hPa
    ds = contract.open_store(store)
    t0 = ds.init_time.values[data.indices[0]]
    at = {"init_time": t0, "level": 850, "step": pd.Timedelta(hours=48)}
    for k, v in enumerate(spec.input_variables):
        np.testing.assert_array_equal(s["fields"][2 * k].numpy(), ds[f"ens_mean_{v}"].sel(at).values)
        np.testing.assert_array_equal(s["fields"][2 * k + 1].numpy(), ds[f"ens_std_{v}"].sel(at).values)
    np.testing.assert_array_equal(s["s"].numpy(), ds["ens_std_t"].sel(at).values)
    assert set(StoreDataset(cfg, "test").indices.tolist()).isdisjoint(data.indices.tolist())


def test_the_land_channel_is_the_synthetic_worlds_land_sea_mask(store, tiny_cfg):
    """``land_feature`` adds one channel after the location features, read from SST's gaps in the store: it is
    the generator's own land mask (1 land, 0 sea), and the other features are unchanged, the season's last."""
    spec = SampleSpec(target="t850", land_feature=True)
    s = StoreDataset(DataConfig(store=str(store), sample=spec), "train")[0]
    plain = StoreDataset(DataConfig(store=str(store), sample=SampleSpec(target="t850")), "train")[0]
    assert spec.n_features == 6 and s["features"].shape == (6, *GRID)
    land = Weather(tiny_cfg.seed, tiny_cfg.grid).land
    assert 0.1 < land.mean() < 0.9
    np.testing.assert_array_equal(s["features"][3].numpy(), land)
    np.testing.assert_array_equal(s["features"][[0, 1, 2, 4, 5]].numpy(), plain["features"].numpy())
    assert "sst" in spec.raw_needs()[0] and "sst" not in SampleSpec(target="t850").raw_needs()[0]


def test_the_model_normalises_with_the_training_statistics(cfg):
    """Normalisation lives in the model: its view of the training dates has ~zero mean, unit std."""
    data = StoreDataset(cfg, "train")
    batch = {k: torch.stack([data[i][k] for i in range(len(data))]) for k in data[0]}
    x = _model(cfg, "mlp").normalise(batch)["x"][:, : cfg.sample.n_fields]
    assert abs(float(x.mean())) < 0.05 and 0.8 < float(x.std()) < 1.1
    # and it is the written-out formula (x - mean) / std with the store's per-point statistics
    mean, std = StoreDataModule(cfg).normalisation()
    want = (batch["fields"].numpy() - mean) / std
    np.testing.assert_allclose(x.numpy(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("target", ["t850", "t2m"])
def test_channel_normalisation_is_the_statistics_of_every_training_value(store, target):
    """``per="channel"``: one mean and std per channel, the mean and population std of every training date's
    value at every point where it exists (numpy over the raw fields; SST is NaN over land), not each point's own."""
    cfg = DataConfig(store=str(store), sample=SampleSpec(target=target))
    data = StoreDataset(cfg, "train")
    fields = torch.stack([data[i]["fields"] for i in range(len(data))]).double().numpy()  # (N, C, H, W)
    mean, std = StoreDataModule(cfg).normalisation("channel")
    point_mean, _ = StoreDataModule(cfg).normalisation()
    assert mean.shape == std.shape == point_mean.shape == fields.shape[1:]
    want_mean, want_std = np.nanmean(fields, axis=(0, 2, 3)), np.nanstd(fields, axis=(0, 2, 3))  # (C,)
    np.testing.assert_allclose(mean, np.broadcast_to(want_mean[:, None, None], mean.shape), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(std, np.broadcast_to(want_std[:, None, None], std.shape), rtol=1e-4, atol=1e-6)
    assert not np.allclose(point_mean, mean)  # each point's own statistics differ from the channel's
    if target == "t2m":
        assert np.isnan(fields[:, 2 * list(cfg.sample.input_variables).index("sst")]).any()  # the NaN case ran
    with pytest.raises(ConfigError, match="normalisation"):
        PostProcessor("mlp", sample=cfg.sample.to_dict(), grid=GRID, normalisation="grid")


def test_surface_target_uses_surface_variables(store):
    spec = SampleSpec(target="t2m", location_features=False, season_features=False)
    data = StoreDataset(DataConfig(store=str(store), sample=spec), "val")
    assert data[0]["fields"].shape[0] == 2 * len(schema.SFC_VARIABLES) and data[0]["features"].shape[0] == 0


def test_loader_with_workers_matches_single_process(cfg):
    dm0 = StoreDataModule(cfg)
    dm2 = StoreDataModule(dataclasses.replace(cfg, num_workers=2))
    a = next(iter(dm0.val_dataloader()))
    b = next(iter(dm2.val_dataloader()))
    for k in a:
        torch.testing.assert_close(a[k], b[k])


def test_bad_config():
    with pytest.raises(ValueError, match="target"):
        SampleSpec(target="q700")
    with pytest.raises(ValueError, match="unknown input variables"):
        SampleSpec(variables=("t", "nope"))
    with pytest.raises(ValueError, match="loader"):
        DataConfig(store="x", loader="fast")


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
@pytest.mark.parametrize("kind", ["mlp", "emos"])
def test_pointwise_models_learn_to_beat_the_raw_ensemble(cfg, kind):
    torch.manual_seed(0)
    data = StoreDataset(cfg, "train")
    batch = {k: torch.stack([data[i][k] for i in range(len(data))]) for k in data[0]}
    model = _model(cfg, kind, {"hidden": 32} if kind == "mlp" else None)

    def crps() -> torch.Tensor:
        mu, sigma = model(batch)
        return metrics_torch_crps(mu, sigma, batch["y"]).mean()

    with torch.no_grad():
        raw = float(crps())  # zero-initialised head = raw ensemble
    ref = scores.crps_gaussian(batch["m"].numpy(), np.maximum(batch["s"].numpy(), 1e-6), batch["y"].numpy()).mean()
    assert raw == pytest.approx(ref, rel=1e-4)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(150):
        opt.zero_grad()
        loss = crps()
        loss.backward()
        opt.step()
    assert float(loss) < 0.85 * raw  # overfits the training dates: the head corrects bias and spread


def test_lightning_fit_and_self_describing_checkpoint(cfg, tmp_path):
    """Trainer.fit on the store, then the checkpoint alone rebuilds the model with identical output."""
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from postcast.models.module import CHECKPOINT_FORMAT_VERSION

    L.seed_everything(0, verbose=False)
    dm = StoreDataModule(cfg)
    mean, _ = (torch.from_numpy(a) for a in dm.normalisation())
    module = PostProcessor("mlp", net={"hidden": 16}, sample=cfg.sample.to_dict(), grid=GRID, lr=0.02)
    trainer = L.Trainer(
        max_epochs=8,
        accelerator="cpu",
        logger=CSVLogger(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        log_every_n_steps=1,
    )
    trainer.fit(module, dm)
    res = trainer.test(module, dm, verbose=False)[0]
    assert res["test_crps"] < res["test_raw_crps"]  # learned something that generalises to 2016-2017
    assert res["test_oracle_crps"] < res["test_raw_crps"]
    ckpt = tmp_path / "m.ckpt"
    trainer.save_checkpoint(ckpt)
    raw = torch.load(ckpt, weights_only=False)
    assert raw["postcast"]["format_version"] == CHECKPOINT_FORMAT_VERSION
    assert raw["postcast"]["sample"]["target"] == "t850"
    back = PostProcessor.load_from_checkpoint(ckpt)
    torch.testing.assert_close(back.norm_mean, mean)  # copied from the store at fit start, saved with the model
    batch = next(iter(dm.test_dataloader()))
    module.eval()
    back.eval()
    with torch.no_grad():
        a, b = module(batch), back(batch)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("version", [0, 1, 2, 3, 6, None])
def test_other_checkpoint_formats_are_refused_with_the_fix(cfg, tmp_path, version):
    """Formats 1 and 2 loaded through a migration without their checksum checked: rewriting
    format_version to 2 and deleting the checksum skipped tamper detection. Only the current format loads."""
    from postcast.models.module import load_checkpoint

    module = _model(cfg, "mlp", {"hidden": 16}, lr=0.02)
    path = tmp_path / "old.ckpt"
    torch.save(
        {
            "state_dict": module.state_dict(),
            "hyper_parameters": dict(module.hparams),
            "postcast": {"format_version": version, "family": "mlp", "sample": cfg.sample.to_dict()},
        },
        path,
    )
    fix = "upgrade postcast" if version == 6 else "retrain it"
    with pytest.raises(BadInputError, match=rf"checkpoint format {version}, this postcast reads format 5: {fix}"):
        load_checkpoint(str(path))


@pytest.mark.parametrize(("family", "net"), [("mlp", {"hidden": 16}), ("emos", {"form": "sh", "solver": "newton"})])
def test_format_4_loads_but_for_the_sh_form_whose_predictor_changed(cfg, tmp_path, family, net):
    """Format 5's sh form reads the raw ensemble mean where format 4's read the normalised mean channel: a format-4
    sh EMOS would load and predict another law, unsaid, so it is refused with the fix; any other format-4 model
    (checksummed as saved) means what it meant and loads."""
    from postcast.models.module import content_checksum, load_checkpoint

    module = _model(cfg, family, net, **({"distribution": "csg"} if family == "emos" else {}))
    ckpt = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    meta = {"format_version": 4, "family": family, "sample": cfg.sample.to_dict()}
    ckpt["postcast"] = {**meta, "checksum": content_checksum(ckpt, meta)}
    path = tmp_path / "format4.ckpt"
    torch.save(ckpt, path)
    if family == "emos":
        with pytest.raises(BadInputError, match=r"format 4 holds an sh-form local EMOS.*retrain it"):
            load_checkpoint(str(path))
    else:
        assert load_checkpoint(str(path))[1]["format_version"] == 4


@pytest.mark.parametrize("options", [{"batch_size": 0}, {"num_workers": -1}])
def test_loader_sizes_are_checked_as_options(options):
    """``--data.cfg.batch_size 0`` reached torch's DataLoader, whose plain ValueError is an internal error
    (exit 70) now that only the project's errors are the user's: the option is refused as one (exit 2)."""
    with pytest.raises(ConfigError, match="batch_size"):
        DataConfig(store="unused.zarr", **options)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({"postcast": {"format_version": "3"}}, r"checkpoint format '3' \(a str, not a format number\)"),
        (None, r"an empty file, not a checkpoint"),
    ],
)
def test_a_string_format_or_an_empty_file_is_named_as_such(tmp_path, content, expected):
    """Before: "checkpoint format 3, this postcast reads format 3" for the string "3", and "not a readable
    checkpoint ()" for an empty file (issue 38 item 10)."""
    from postcast.models.module import read_checkpoint

    path = tmp_path / "x.ckpt"
    if content is None:
        path.write_bytes(b"")
    else:
        torch.save(content, path)
    with pytest.raises(BadInputError, match=expected):
        read_checkpoint(str(path))
