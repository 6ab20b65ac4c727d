"""`postcast run`: stages, manifest, skipping, --force, and a killed run that resumes."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from postcast.compression.artefact import Artefact

ROOT = Path(__file__).resolve().parents[1]


def pipeline_yaml(tmp: Path, presets: list[str], train_args: list[str]) -> Path:
    cfg = {
        "kind": "pipeline",
        "workdir": str(tmp / "work"),
        "workers": 1,
        "processes": False,
        "synth": {"seed": 3, "resolution": 10.0, "years": [2012, 2017], "dates_per_year": 3, "levels": [500, 850]},
        "train": [str(ROOT / "configs/train" / f"{p}.yaml") for p in presets],
        "train_args": ["--data.cfg.batch_size", "2", *train_args],
        "bootstrap": 50,
        "forecast_from": "2017-06-01",
        "forecast_to": "2017-12-31",
        "compress": [
            {
                "preset": str(ROOT / "configs/train/emos_t850.yaml"),
                "field": {"width": 8, "depth": 1, "steps": 20, "batch_points": 512, "error_bound_std": 0.1},
            }
        ],
    }
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def statuses(work: Path) -> dict[str, str]:
    return {k: v["status"] for k, v in json.loads((work / "summary.json").read_text())["stages"].items()}


def test_run_skips_finished_stages_and_forces_one(cli, tmp_path):
    cfg = pipeline_yaml(tmp_path, ["emos_t850", "mlp_t850"], ["--trainer.max_epochs", "2"])
    out = cli("run", str(cfg), check=True)
    work = tmp_path / "work"
    assert set(statuses(work).values()) == {"ran"} and "report:" in out.stdout
    res = json.loads((work / "report/metrics.json").read_text())
    assert {"raw", "oracle", "emos_t850", "mlp_t850"} <= set(res["targets"]["t850"]["forecasts"])
    assert (work / "logs/pipeline.log").read_text().count("stage evaluate: finished") == 1
    # one forecast file per model and date (2017's last 2 tiny dates): no two products share a path
    written = json.loads((work / "summary.json").read_text())["stages"]["forecast"]["outputs"]
    assert len(written) == len(set(written)) == 2 * 2
    for name in ("emos_t850", "mlp_t850"):
        assert len(list((work / f"forecasts/postprocessed/{name}/t850").glob("*.nc"))) == 2
    art = Artefact.load(work / "compressed/emos_t850_train.pcnf")  # the fields EMOS reads, train dates only
    assert art.header["source"]["split"] == "train" and art.ratio > 1
    assert "truth_t850" in art.header["variables"] and art.decode_array().shape[1] == 6  # train: 2012-13 x 3
    first = json.loads((work / "summary.json").read_text())
    fields = first["stages"]["compress:emos_t850_train"]["fields"]  # every field's error, all worth having
    assert set(fields) == set(art.header["variables"]) and all(0 < f["wrmse_over_std"] <= 0.1 for f in fields.values())
    files = [p for p in work.rglob("*") if p.is_file()]
    assert first["disk_files"] == len(files) - 1  # all but summary.json itself, written after the count
    assert first["disk_bytes"] == sum(p.stat().st_size for p in files if p != work / "summary.json")
    assert f"work directory {work}:" in out.stdout
    cli("run", str(cfg), check=True)
    assert set(statuses(work).values()) == {"skipped"}
    again = json.loads((work / "summary.json").read_text())  # a rerun keeps what the outputs took
    assert {n: s["seconds"] for n, s in again["stages"].items()} == {
        n: s["seconds"] for n, s in first["stages"].items()
    }
    assert again["seconds"] == first["seconds"] > 0
    assert [sorted(r["ran"]) for r in again["runs"]] == [sorted(first["stages"]), []]
    cli("run", str(cfg), "--force", "train:emos_t850", check=True)
    assert statuses(work) == {
        "synth": "skipped",
        "ingest": "skipped",
        "train:emos_t850": "ran",
        "train:mlp_t850": "skipped",
        "evaluate": "ran",
        "forecast": "ran",
        "compress:emos_t850_train": "skipped",
    }
    bad = cli("run", str(cfg), "--force", "train:nope")
    assert bad.returncode == 2 and "no such stage" in bad.stderr


@pytest.mark.slow  # ~1 min; resuming from last.ckpt is also covered by test_evaluate's resume test
def test_killed_run_resumes_training(tmp_path):
    cfg = pipeline_yaml(tmp_path, ["mlp_t850"], ["--trainer.max_epochs", "40"])
    work = tmp_path / "work"
    cmd = [sys.executable, "-m", "postcast", "--no-progress", "run", str(cfg)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600  # against a hang only
    while not list(work.glob("runs/mlp_t850/lightning_logs/version_*/checkpoints/last.ckpt")):
        assert proc.poll() is None and time.time() < deadline, "the run ended before training checkpointed"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    manifest = json.loads((work / "manifest.json").read_text())["stages"]
    assert "ingest" in manifest and "train:mlp_t850" not in manifest
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert statuses(work)["ingest"] == "skipped" and statuses(work)["train:mlp_t850"] == "ran"
    assert "resuming from" in (work / "logs/pipeline.log").read_text()
    last = max(
        work.glob("runs/mlp_t850/lightning_logs/version_*/checkpoints/last*.ckpt"), key=lambda p: p.stat().st_mtime
    )
    assert torch.load(last, weights_only=False)["epoch"] == 39  # finished the planned epochs, not restarted
    # the same run resumed (one version) and the recorded checkpoint is the best of the whole run
    assert [p.name for p in (work / "runs/mlp_t850/lightning_logs").iterdir()] == ["version_0"]
    states = torch.load(last, weights_only=True)["callbacks"]
    best = next(v["best_model_path"] for k, v in states.items() if "'monitor': 'val_crps'" in k)
    assert json.loads((work / "manifest.json").read_text())["stages"]["train:mlp_t850"]["outputs"] == [best]
    assert (work / "report/report.html").exists()


def test_bad_pipeline_configs(cli, tmp_path):
    both = tmp_path / "both.yaml"
    both.write_text("kind: pipeline\nsynth: {seed: 1}\nsource: /data/ens10\n")
    proc = cli("run", str(both))
    assert proc.returncode == 2 and "exactly one of" in proc.stderr
    missing = tmp_path / "missing.yaml"
    missing.write_text("kind: pipeline\nsynth: {seed: 1}\ntrain: [configs/train/nope.yaml]\n")
    proc = cli("config", "validate", str(missing))
    assert proc.returncode == 2 and "not found" in proc.stderr
    narrow = tmp_path / "narrow.yaml"
    narrow.write_text(
        "kind: pipeline\nsynth: {seed: 1}\ncompress: [{preset: configs/train/emos_t850.yaml, field: {width: 0}}]\n"
    )
    proc = cli("config", "validate", str(narrow))
    assert proc.returncode == 2 and "width=0 must be >= 1" in proc.stderr


def test_a_compress_preset_reading_the_land_channel_is_refused_before_any_stage(tmp_path):
    """The land channel reads SST, undefined over land, which a neural field cannot fit: refused up front, named."""
    from postcast.datasets.core.errors import ConfigError
    from postcast.pipeline.jobs import CompressJob

    preset = tmp_path / "mlp_t850_land.yaml"
    with_land = yaml.safe_load((ROOT / "configs/train/mlp_t850.yaml").read_text())
    with_land["data"]["cfg"]["sample"]["land_feature"] = True
    preset.write_text(yaml.safe_dump(with_land))
    CompressJob(str(ROOT / "configs/train/mlp_t850.yaml")).check_fields()  # the same preset without it passes
    with pytest.raises(ConfigError, match="it reads sst"):
        CompressJob(str(preset)).check_fields()
