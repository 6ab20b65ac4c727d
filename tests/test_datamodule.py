"""Samples from the store, and pointwise post-processors that learn from them."""

import numpy as np
import pandas as pd
import pytest
import torch

from postcast.datasets import ingest, schema
from postcast.datasets.loaders.datamodule import DataConfig, StoreDataModule, StoreDataset
from postcast.models import postprocessors
from postcast.pipeline import metrics


@pytest.fixture(scope="module")
def cfg(store):
    return DataConfig(store=str(store), target="t850")


def test_sample_fields_and_shapes(cfg, store):
    data = StoreDataset(cfg, "train")
    assert len(data) == 6 and cfg.n_channels == 2 * 7 + 3 + 2
    s = data[0]
    assert s["x"].shape == (cfg.n_channels, 19, 36) and s["x"].dtype == torch.float32
    assert s["y"].shape == s["m"].shape == s["s"].shape == s["oracle_mean"].shape == (19, 36)
    assert torch.isfinite(s["x"]).all() and torch.isfinite(s["y"]).all()
    ds = ingest.open_store(store)
    t0 = ds.init_time.values[data.indices[0]]
    want = ds["ens_std_t"].sel(init_time=t0, level=850, step=pd.Timedelta(hours=48)).values
    np.testing.assert_array_equal(s["s"].numpy(), want)
    # normalised channels: about zero mean, unit std over the training dates
    x = torch.stack([data[i]["x"] for i in range(len(data))])
    assert abs(float(x[:, :14].mean())) < 0.05 and 0.8 < float(x[:, :14].std()) < 1.1
    assert set(StoreDataset(cfg, "test").indices.tolist()).isdisjoint(data.indices.tolist())


def test_surface_target_uses_surface_variables(store):
    data = StoreDataset(DataConfig(store=str(store), target="t2m", location_features=False,
                                   season_features=False), "val")
    assert data[0]["x"].shape[0] == 2 * len(schema.SFC_VARIABLES)


def test_loader_with_workers_matches_single_process(cfg):
    dm0 = StoreDataModule(cfg)
    dm2 = StoreDataModule(DataConfig(**{**cfg.__dict__, "num_workers": 2}))
    a = next(iter(dm0.val_dataloader()))
    b = next(iter(dm2.val_dataloader()))
    for k in a:
        torch.testing.assert_close(a[k], b[k])


def test_bad_config():
    with pytest.raises(ValueError, match="target"):
        DataConfig(store="x", target="q700")
    with pytest.raises(ValueError, match="unknown input variables"):
        DataConfig(store="x", variables=("t", "nope"))


@pytest.mark.parametrize("kind", ["mlp", "emos"])
def test_pointwise_models_learn_to_beat_the_raw_ensemble(cfg, kind):
    torch.manual_seed(0)
    data = StoreDataset(cfg, "train")
    batch = {k: torch.stack([data[i][k] for i in range(len(data))]) for k in data[0]}
    if kind == "mlp":
        model: torch.nn.Module = postprocessors.PointwiseMLP(cfg.n_channels, hidden=32)
    else:
        idx = list(cfg.input_variables).index("t")
        model = postprocessors.LocalEMOS((19, 36), 2 * idx, 2 * idx + 1)
    with torch.no_grad():
        raw = float(postprocessors.crps_loss(model, batch))  # zero-initialised head = raw ensemble
    ref = metrics.crps_gaussian(batch["m"].numpy(), np.maximum(batch["s"].numpy(), 1e-6), batch["y"].numpy()).mean()
    assert raw == pytest.approx(ref, rel=1e-4)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(150):
        opt.zero_grad()
        loss = postprocessors.crps_loss(model, batch)
        loss.backward()
        opt.step()
    assert float(loss) < 0.85 * raw  # overfits the training dates: the head corrects bias and spread


def test_lightning_fit_and_self_describing_checkpoint(cfg, tmp_path):
    """Trainer.fit on the store, then the checkpoint alone rebuilds the model with identical output."""
    import dataclasses

    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from postcast.models.module import CHECKPOINT_FORMAT_VERSION, PostProcessor

    L.seed_everything(0, verbose=False)
    dm = StoreDataModule(cfg)
    mean, std = (torch.from_numpy(a) for a in StoreDataset(cfg, "train").normalisation())
    module = PostProcessor("mlp", cfg.n_channels, (19, 36), hidden=16, lr=0.02, data=dataclasses.asdict(cfg))
    module.set_normalisation(mean, std)
    trainer = L.Trainer(max_epochs=8, accelerator="cpu", logger=CSVLogger(tmp_path), enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, log_every_n_steps=1)
    trainer.fit(module, dm)
    res = trainer.test(module, dm, verbose=False)[0]
    assert res["test_crps"] < res["test_raw_crps"]  # learned something that generalises to 2016-2017
    assert res["test_oracle_crps"] < res["test_raw_crps"]
    ckpt = tmp_path / "m.ckpt"
    trainer.save_checkpoint(ckpt)
    raw = torch.load(ckpt, weights_only=False)
    assert raw["postcast"]["format_version"] == CHECKPOINT_FORMAT_VERSION
    assert raw["postcast"]["data"]["target"] == "t850"
    back = PostProcessor.load_from_checkpoint(ckpt)
    torch.testing.assert_close(back.norm_mean[: mean.shape[0]], mean)
    batch = next(iter(dm.test_dataloader()))
    module.eval()
    back.eval()
    with torch.no_grad():
        a, b = module(batch), back(batch)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
