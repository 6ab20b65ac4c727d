"""The LightningModule every post-processor trains in: CRPS loss, metrics, self-describing checkpoints.

A checkpoint carries everything inference needs: the hyperparameters (model kind and size, data
config, input variables), the normalisation statistics as buffers (``norm_mean``, ``norm_std``:
(C_stats, H, W), the per-grid-point statistics the inputs were scaled with) and
``checkpoint["postcast"]`` with the format version.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import lightning as L
import torch

from postcast.models import convnets, postprocessors, transformer
from postcast.models import smoe as smoe_mod
from postcast.models.losses import crps_gaussian
from postcast.models.smoe import SMoEConfig

CHECKPOINT_FORMAT_VERSION = 1
MODELS = ("emos", "emos_global", "mlp", "lenet", "unet", "unet_smoe", "smoe", "transformer")
MEMBER_MODELS = ("emos_global", "transformer")  # need data.cfg.members: true


def build_net(model: str, *, in_channels: int, grid: tuple[int, int], target_channels: tuple[int, int],
              n_members: int, n_variables: int, hidden: int, base_filters: int, smoe: SMoEConfig,
              width: int, heads: int) -> torch.nn.Module:
    """The network of a model kind (see :data:`MODELS`)."""
    var = target_channels[0] // 2  # the target variable's index among the input variables
    nets: dict[str, Callable[[], torch.nn.Module]] = {
        "emos": lambda: postprocessors.LocalEMOS(grid, *target_channels),
        "emos_global": lambda: postprocessors.GlobalEMOS(n_members, var, target_channels[1]),
        "mlp": lambda: postprocessors.PointwiseMLP(in_channels, hidden),
        "lenet": lambda: convnets.LeNet(in_channels),
        "unet": lambda: convnets.UNet(in_channels, base_filters),
        "unet_smoe": lambda: smoe_mod.UNetSMoE(in_channels, grid, smoe, base_filters),
        "smoe": lambda: smoe_mod.SMoE(in_channels, grid, smoe),
        "transformer": lambda: transformer.EnsembleTransformer(in_channels, n_variables, var, width, heads),
    }
    if model not in nets:
        msg = f"model {model!r}: choose one of {MODELS}"
        raise ValueError(msg)
    return nets[model]()


class PostProcessor(L.LightningModule):
    """Trains one post-processor (``model``, one of :data:`MODELS`) with the closed-form Gaussian CRPS.

    Args:
        model: emos (local, per grid point), emos_global (13 parameters), mlp, lenet, unet,
            unet_smoe (U-Net with an SMoE final layer), smoe (the SMoE layer alone), transformer.
        in_channels, grid, target_channels, n_members, n_variables, data: linked from the data
            module by ``postcast train``; set them only when building a model by hand.
        hidden: MLP hidden units. base_filters: U-Net channels at full resolution (32/64/128).
        smoe: SMoE options (experts, gate, weighted, rc_loss, quantile, damping).
        width, heads: Transformer embedding channels and attention heads.
        lr, weight_decay: AdamW; the learning rate follows a cosine schedule over ``max_epochs``
            when ``cosine`` is true.
    """

    def __init__(self, model: str = "mlp", in_channels: int = 19, grid: tuple[int, int] = (37, 72),
                 hidden: int = 128, lr: float = 1e-3, target_channels: tuple[int, int] = (0, 1),
                 data: dict[str, Any] | None = None, n_members: int = 10, n_variables: int = 7,
                 base_filters: int = 32, smoe: SMoEConfig | dict[str, Any] | None = None, width: int = 16,
                 heads: int = 4, weight_decay: float = 0.0, cosine: bool = True):
        super().__init__()
        smoe_cfg = SMoEConfig(**smoe) if isinstance(smoe, dict) else smoe or SMoEConfig()
        smoe = dataclasses.asdict(smoe_cfg)  # plain types in the checkpoint
        self.save_hyperparameters()
        self.net = build_net(model, in_channels=in_channels, grid=(grid[0], grid[1]),
                             target_channels=(target_channels[0], target_channels[1]), n_members=n_members,
                             n_variables=n_variables, hidden=hidden, base_filters=base_filters, smoe=smoe_cfg,
                             width=width, heads=heads)
        self.smoe_layer: smoe_mod.SMoEHead | None = getattr(self.net, "smoe", None)
        self.norm_mean: torch.Tensor
        self.norm_std: torch.Tensor
        self.register_buffer("norm_mean", torch.zeros(2 * n_variables, *grid))
        self.register_buffer("norm_std", torch.ones(2 * n_variables, *grid))

    def set_normalisation(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Record the statistics the inputs are normalised with (travel in the checkpoint)."""
        with torch.no_grad():
            self.norm_mean.copy_(mean)  # (2 * n_variables, H, W)
            self.norm_std.copy_(std)

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
        loss = self._step(batch, "train")
        layer = self.smoe_layer
        if layer is not None and layer.cfg.rc_loss:
            rc = layer.rc_loss(loss)  # the gate learns from this only
            self.log("train_rc_loss", rc, batch_size=batch["y"].shape[0])
            share = layer.expert_share()
            for i in range(share.numel()):
                self.log(f"train_expert{i}_share", share[i], batch_size=batch["y"].shape[0])
            return loss + layer.cfg.rc_weight * rc
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "val")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "test")

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        mu, sigma = self(batch)
        return {"mu": mu, "sigma": sigma}

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"], weight_decay=self.hparams["weight_decay"])
        epochs = self.trainer.max_epochs if self._trainer is not None else None
        if not self.hparams["cosine"] or not epochs or epochs < 0:
            return opt
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["postcast"] = {"format_version": CHECKPOINT_FORMAT_VERSION, "model": self.hparams["model"],
                                  "data": self.hparams["data"]}


def load_checkpoint(path: str) -> tuple[PostProcessor, dict[str, Any]]:
    """A trained post-processor (eval mode, CPU) and its ``postcast`` metadata from a checkpoint alone."""
    import inspect
    import pickle

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as err:
        msg = f"{path}: not a readable checkpoint ({err})"
        raise ValueError(msg) from err
    meta = ckpt.get("postcast") if isinstance(ckpt, dict) else None
    if meta is None:
        msg = f"{path}: not a postcast checkpoint (no 'postcast' metadata); train it with `postcast train fit`"
        raise ValueError(msg)
    if meta.get("format_version", 0) > CHECKPOINT_FORMAT_VERSION:
        msg = (f"{path}: checkpoint format {meta['format_version']} is newer than this postcast "
               f"({CHECKPOINT_FORMAT_VERSION}); upgrade postcast")
        raise ValueError(msg)
    known = set(inspect.signature(PostProcessor.__init__).parameters) - {"self"}
    model = PostProcessor(**{k: v for k, v in ckpt["hyper_parameters"].items() if k in known})
    model.load_state_dict(ckpt["state_dict"])
    return model.eval(), meta
