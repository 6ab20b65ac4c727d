"""The LightningModule every post-processor trains in: CRPS loss, metrics, self-describing checkpoints.

A checkpoint carries everything inference needs: the hyperparameters (model kind and size, data
config, input variables), the normalisation statistics as buffers (``norm_mean``, ``norm_std``:
(C_stats, H, W), the per-grid-point statistics the inputs were scaled with) and
``checkpoint["postcast"]`` with the format version.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from postcast.models import postprocessors
from postcast.models.losses import crps_gaussian

CHECKPOINT_FORMAT_VERSION = 1
MODELS = ("mlp", "emos")


class PostProcessor(L.LightningModule):
    """Trains ``model`` ("mlp" or "emos") with the closed-form Gaussian CRPS."""

    def __init__(self, model: str = "mlp", in_channels: int = 19, grid: tuple[int, int] = (37, 72),
                 hidden: int = 128, lr: float = 1e-3, target_channels: tuple[int, int] = (0, 1),
                 data: dict[str, Any] | None = None):
        super().__init__()
        if model not in MODELS:
            msg = f"model {model!r}: choose one of {MODELS}"
            raise ValueError(msg)
        self.save_hyperparameters()
        self.net: torch.nn.Module
        if model == "mlp":
            self.net = postprocessors.PointwiseMLP(in_channels, hidden)
        else:
            self.net = postprocessors.LocalEMOS(grid, *target_channels)
        self.norm_mean: torch.Tensor
        self.norm_std: torch.Tensor
        self.register_buffer("norm_mean", torch.zeros(in_channels, *grid))
        self.register_buffer("norm_std", torch.ones(in_channels, *grid))

    def set_normalisation(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Record the statistics the inputs are normalised with (travel in the checkpoint)."""
        with torch.no_grad():
            self.norm_mean[: mean.shape[0]].copy_(mean)
            self.norm_std[: std.shape[0]].copy_(std)

    def on_fit_start(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        if dm is not None and hasattr(dm, "normalisation"):
            mean, std = dm.normalisation()
            self.set_normalisation(torch.from_numpy(mean), torch.from_numpy(std))

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(mu, sigma) in physical units, each (B, H, W)."""
        return postprocessors.predict(self.net, batch)

    def _step(self, batch: dict[str, torch.Tensor], split: str) -> torch.Tensor:
        mu, sigma = self(batch)
        ok = torch.isfinite(batch["y"])
        loss = crps_gaussian(mu[ok], sigma[ok], batch["y"][ok]).mean()
        self.log(f"{split}_crps", loss, prog_bar=split != "train", batch_size=batch["y"].shape[0])
        if split != "train":
            raw = crps_gaussian(batch["m"][ok], batch["s"][ok].clamp_min(1e-6), batch["y"][ok]).mean()
            self.log(f"{split}_raw_crps", raw, batch_size=batch["y"].shape[0])
            if "oracle_mean" in batch:
                orc = crps_gaussian(batch["oracle_mean"][ok], batch["oracle_std"][ok], batch["y"][ok]).mean()
                self.log(f"{split}_oracle_crps", orc, batch_size=batch["y"].shape[0])
        return loss

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "val")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams["lr"])

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["postcast"] = {"format_version": CHECKPOINT_FORMAT_VERSION, "model": self.hparams["model"],
                                  "data": self.hparams["data"]}
