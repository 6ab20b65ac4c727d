"""docs/api.md runs: every ```python block of the page, in order, in one namespace, from a folder laid out as
the quickstart leaves ``runs/quickstart`` (the session's synthetic store, a local EMOS checkpoint for T850
trained by ``postcast train`` with the quickstart's preset, and the U-Net preset's training fields
compressed as the quickstart's compress stage does), so the page's calls are the current ones."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from postcast.compression.field import FieldConfig
from postcast.compression.loader import compress_split
from postcast.pipeline import train
from postcast.pipeline.jobs import CompressJob

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs/api.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
TINY_FIELD = {"width": 8, "depth": 1, "steps": 20, "batch_points": 2048}  # a short fit: the page reads it, no more


def blocks(text: str) -> list[str]:
    """The page's ```python blocks, in order."""
    return BLOCK.findall(text)


def _checkpoint(store: Path, runs: Path) -> None:
    """The quickstart's local EMOS for T850 (its preset), one epoch on ``store``, under ``runs``."""
    args = ["fit", "-c", str(ROOT / "configs/train/emos_t850.yaml"), "--data.cfg.store", str(store)]
    args += ["--trainer.default_root_dir", str(runs), "--trainer.max_epochs", "1"]
    train.run([*args, "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"])


def _artefact(store: Path, out: Path) -> None:
    """The quickstart's compress job (the U-Net preset's fields of the training split), with a short fit."""
    job = CompressJob(preset=str(ROOT / "configs/train/unet_t850.yaml"), split="train", field=TINY_FIELD)
    compress_split(job.data_config(store), FieldConfig(**TINY_FIELD), job.split, progress=False).save(out)


@pytest.fixture(scope="module")
def quickstart(store, tmp_path_factory) -> Path:
    """A folder holding ``runs/quickstart`` with the store, checkpoint and artefact the page reads."""
    root = tmp_path_factory.mktemp("docs_api")
    run = root / "runs/quickstart"
    run.mkdir(parents=True)
    (run / "store.zarr").symlink_to(store)
    _checkpoint(store, run / "runs/emos_t850")
    (run / "compressed").mkdir()
    _artefact(store, run / "compressed/unet_t850_train.pcnf")
    return root


def test_the_page_has_a_block_for_each_use():
    code = "\n".join(blocks(PAGE.read_text()))
    calls = ("open_store(", "split_rows(", "StoreDataModule(", "load_checkpoint(", "apply_model(", "Artefact.load(")
    for call in calls:
        assert call in code, call
    assert "CompressedDataModule(" in code and code.count("trainer.fit(") == 2


def test_every_python_block_of_the_api_page_runs(quickstart, monkeypatch):
    monkeypatch.chdir(quickstart)
    namespace: dict[str, object] = {"__name__": "docs_api"}
    out = io.StringIO()
    found = blocks(PAGE.read_text())
    before = sorted(quickstart.rglob("*"))
    for k, code in enumerate(found):
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"{PAGE}:block{k + 1}", "exec"), namespace)  # the page's own code
    printed = out.getvalue()
    assert len(found) == 5 and "test dates" in printed and "smaller" in printed
    forecast = namespace["forecast"]
    assert forecast.attrs["predictive_distribution"] == "gaussian"  # type: ignore[attr-defined]
    assert sorted(quickstart.rglob("*")) == before  # the page writes no file
