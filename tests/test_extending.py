"""Extending postcast touches only the places docs/architecture.md lists ("where do I change X").

A new variable is a schema entry and a synthetic generator: registered here at run time (the same
objects the two files would define), it is synthesised, ingested (ensemble statistics, training
statistics) and read by a training preset, with no other change.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from postcast.datasets import contract, schema
from postcast.datasets.synth import synthetic

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def wind_speed(monkeypatch):
    """10 m wind speed as a new surface variable: its schema entry and its generator, nothing else."""
    var = schema.Variable(
        "si10", "10si", 207, "m s**-1", "10 metre wind speed", "wind_speed", schema.LevelType.SURFACE, 0.0, 100.0
    )

    def _f_si10(world, level, init, step_h, valid):  # what @generates("si10") would register
        return np.hypot(world.members_field("u10", 0, init, step_h), world.members_field("v10", 0, init, step_h))

    monkeypatch.setattr(schema, "SFC_VARIABLES", (*schema.SFC_VARIABLES, var))
    monkeypatch.setitem(schema.VARIABLES, "si10", var)
    monkeypatch.setitem(synthetic.GENERATORS, "si10", _f_si10)
    return var


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
def test_a_new_variable_goes_from_the_schema_to_training(wind_speed, cli, tmp_path):
    synth, store, runs = tmp_path / "synth", tmp_path / "store.zarr", tmp_path / "runs"
    cli(
        "synth",
        "--out",
        str(synth),
        "--resolution",
        "10",
        "--years",
        "2012:2017",
        "--dates-per-year",
        "2",
        "--levels",
        "500,850",
        check=True,
    )
    cli("ingest", str(synth), "--out", str(store), "--threads", "--variables", "t2m,u10,v10,si10", check=True)
    ds = contract.open_store(store)
    assert {"si10", "ens_mean_si10", "ens_std_si10"} <= set(ds.data_vars)
    assert ds["si10"].dims == wind_speed.dims and ds["si10"].attrs["units"] == "m s**-1"
    u, v, si = (ds[n].isel({schema.INIT_TIME: 0}).values for n in ("u10", "v10", "si10"))
    np.testing.assert_allclose(si, np.hypot(u, v), rtol=1e-5)  # the generator's field, stored as made
    np.testing.assert_allclose(ds["ens_mean_si10"].isel({schema.INIT_TIME: 0}).values, si.mean(axis=0), rtol=1e-5)
    cli(
        "train",
        "fit",
        "-c",
        str(ROOT / "configs/train/mlp_t2m.yaml"),
        "--data.cfg.store",
        str(store),
        "--data.cfg.sample.variables",
        "[t2m, si10]",
        "--trainer.default_root_dir",
        str(runs),
        "--trainer.max_epochs",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--data.cfg.batch_size",
        "2",
        check=True,
    )
    ckpt = torch.load(sorted(runs.rglob("best*.ckpt"))[-1], weights_only=True)
    assert ckpt["postcast"]["sample"]["variables"] == ["t2m", "si10"]
