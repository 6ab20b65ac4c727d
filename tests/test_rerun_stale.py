"""A pipeline rerun keeps a trained model only when it was trained with this run's preset, arguments,
store and splits: a changed learning rate or changed splits retrain from scratch (and evaluate and
forecast rerun on the new checkpoint); an unchanged rerun skips every stage."""

import json
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _config(tmp: Path, train_args: list[str], train_to: int = 2013) -> Path:
    cfg = {
        "kind": "pipeline",
        "workdir": str(tmp / "work"),
        "workers": 1,
        "processes": False,
        "synth": {"seed": 5, "resolution": 10.0, "years": [2012, 2017], "dates_per_year": 3, "levels": [850]},
        "splits": {"train": [2012, train_to], "val": [train_to + 1, 2015], "test": [2016, 2017]},
        "train": [str(ROOT / "configs/train/tiny_emos_t2m.yaml")],
        "train_args": ["--data.cfg.batch_size", "2", "--trainer.max_epochs", "2", *train_args],
        "bootstrap": 20,
        "forecast_from": "2017-06-01",
        "forecast_to": "2017-12-31",
    }
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _state(work: Path) -> tuple[dict[str, str], str, dict]:
    """(status per stage, the checkpoint the train stage keeps, that checkpoint's hyperparameters)."""
    summary = json.loads((work / "summary.json").read_text())["stages"]
    kept = json.loads((work / "manifest.json").read_text())["stages"]["train:tiny_emos_t2m"]["outputs"][0]
    ckpt = torch.load(kept, map_location="cpu", weights_only=False)
    return {k: v["status"] for k, v in summary.items()}, kept, {**ckpt["hyper_parameters"], "step": ckpt["global_step"]}


@pytest.mark.slow  # four small pipeline runs (~1-2 min on the shared machine)
def test_changed_arguments_or_splits_retrain(cli, tmp_path):
    work = tmp_path / "work"
    cli("run", str(_config(tmp_path, [])), check=True)
    status, first, hp = _state(work)
    assert set(status.values()) == {"ran"} and hp["lr"] == pytest.approx(0.05)
    cli("run", str(_config(tmp_path, [])), check=True)
    assert set(_state(work)[0].values()) == {"skipped"}  # unchanged: nothing reruns

    cli("run", str(_config(tmp_path, ["--model.lr", "0.0001"])), check=True)
    status, second, hp2 = _state(work)
    assert status["train:tiny_emos_t2m"] == status["evaluate"] == status["forecast"] == "ran"
    assert status["ingest"] == "skipped"
    # the kept model is a new one, trained from scratch at the new rate (not the old run resumed)
    assert second != first and Path(second).parents[1] != Path(first).parents[1]
    assert hp2["lr"] == pytest.approx(0.0001) and hp2["step"] == hp["step"]
    cli("run", str(_config(tmp_path, ["--model.lr", "0.0001"])), check=True)
    assert set(_state(work)[0].values()) == {"skipped"}

    cli("run", str(_config(tmp_path, ["--model.lr", "0.0001"], train_to=2014)), check=True)
    status, third, hp3 = _state(work)
    assert status["ingest"] == status["train:tiny_emos_t2m"] == status["evaluate"] == "ran"
    assert Path(third).parents[1] not in (Path(first).parents[1], Path(second).parents[1])
    assert hp3["lr"] == pytest.approx(0.0001) and hp3["step"] > 0
    log = (work / "logs/pipeline.log").read_text()
    assert "resuming from" not in log  # no run ever resumed another's checkpoint
