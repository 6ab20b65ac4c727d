"""``postcast train {fit,validate,test,predict}``: the Lightning CLI over postcast's store and models.

Presets live in ``configs/train/`` (LightningCLI YAML: ``trainer``, ``model``, ``data``). The model's
input channels, grid and data config are linked from the instantiated DataModule, and the
normalisation statistics are copied into the model at fit start, so checkpoints are self-describing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from postcast.datasets.loaders.datamodule import StoreDataModule
from postcast.models import plugins  # noqa: F401  (plugin classes show up in --help as known subclasses)
from postcast.models.module import PostProcessor


class PostcastCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: Any) -> None:
        # model selection on the validation split (never test) ...
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.monitor": "val_crps", "checkpoint.mode": "min",
                             "checkpoint.filename": "best-{epoch}-{val_crps:.4f}", "seed_everything": 0})
        # ... and "last.ckpt" after every epoch for resuming (ModelCheckpoint's own save_last only
        # refreshes it when the best checkpoint changes)
        parser.add_lightning_class_args(ModelCheckpoint, "latest")
        parser.set_defaults({"latest.filename": "last", "latest.monitor": None, "latest.save_top_k": 1,
                             "latest.enable_version_counter": False})
        parser.link_arguments("data", "model.in_channels", compute_fn=lambda dm: dm.cfg.n_channels,
                              apply_on="instantiate")
        parser.link_arguments("data", "model.grid", compute_fn=lambda dm: dm.grid, apply_on="instantiate")
        parser.link_arguments("data", "model.data", compute_fn=lambda dm: dataclasses.asdict(dm.cfg),
                              apply_on="instantiate")
        parser.link_arguments("data", "model.target_channels", compute_fn=lambda dm: dm.target_channels,
                              apply_on="instantiate")
        parser.link_arguments("data", "model.n_members", compute_fn=lambda dm: dm.n_members, apply_on="instantiate")
        parser.link_arguments("data", "model.n_variables", compute_fn=lambda dm: len(dm.cfg.input_variables),
                              apply_on="instantiate")


def validate_preset(path: str) -> str | None:
    """Parse a training preset without instantiating anything; None if valid, else the error."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            run(["fit", "--config", path, "--print_config"])
    except SystemExit as stop:
        if stop.code in (0, None):
            return None
        lines = [ln for ln in err.getvalue().strip().splitlines() if ln.strip()]
        return lines[-1] if lines else f"invalid (exit {stop.code})"
    return None


def run(args: Sequence[str]) -> PostcastCLI:
    """Run the Lightning CLI on ``args``; returns the CLI (``cli.trainer.checkpoint_callback
    .best_model_path`` after ``fit``). ``sys.argv`` is left alone: DDP's launcher re-runs it for the
    other ranks."""
    import warnings

    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")  # by design, see above
    return PostcastCLI(PostProcessor, StoreDataModule, save_config_kwargs={"overwrite": True},
                       parser_kwargs={"prog": "postcast train"}, args=list(args))
