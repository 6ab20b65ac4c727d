"""Spatial Mixture-of-Experts (Dryden & Hoefler, NeurIPS 2022; the method and its options: docs/models.md).

The layer: E experts, each one 3 x 3 convolution filter (one dense ``Conv2d(C, E)`` without bias);
a gate giving routing weights R (B, E, H, W), either ``latent`` (a learned E x H x W map that does
not depend on the input) or ``conv`` (3 x 3 convolution of the input); at each location the top-k
experts by R are selected and their values (times R when ``weighted``) form the k output channels.

Training techniques, both in the custom backward of :class:`TopKRouting`:

* **routing-classification (RC) loss**: with the task-loss gradient e = dL/dy, a selection is
  *correct* where |e| <= the per-sample ``quantile`` of |e|; labels are 1 for correct selections,
  0 for incorrect ones, and the incorrect mass spread over the unselected experts; the gate learns
  only from BCE-with-logits(R, labels) (its task gradient is blocked);
* **expert-error damping**: expert gradients at incorrectly routed locations are multiplied by
  ``damping`` (0: not updated there).

:class:`SMoEHead` is the SMoE as the final layer of any trunk, one top-1 SMoE per head output
((a, b) for the Gaussian, K = ``NetIO.outputs`` in general); the model
kinds ``smoe`` (on the inputs directly) and ``unet_smoe`` (on U-Net features) use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from postcast.datasets.core.errors import BadInputError, ConfigError
from postcast.models import kernels
from postcast.models.convnets import UNetTrunk
from postcast.models.kernels.reference import TopKRouting, routing_correct
from postcast.models.postprocessors import Batch, Outputs
from postcast.models.registry import NetIO, architecture

__all__ = ["SMoE", "SMoEConfig", "SMoEHead", "TopKRouting", "UNetSMoE", "rc_labels", "routing_correct"]

GATES = ("latent", "conv")


@dataclass(frozen=True)
class SMoEConfig:
    """SMoE options. Defaults follow the reference code's defaults: RC loss on, quantile 0.7, expert-error
    damping off (factor 1; the reference's ``--dampen-expert-error`` uses 0). On the synthetic data
    damping 0 with quantile 0.3 (the heat-diffusion run) trained clearly worse than the plain U-Net."""

    experts: int = 3
    gate: str = "latent"  # latent | conv
    weighted: bool = False  # multiply selected expert values by their routing weight
    rc_loss: bool = True  # routing-classification loss (blocks the gate's task gradient)
    rc_weight: float = 1.0
    quantile: float = 0.7  # |e| quantile below which a selection counts as correct
    damping: float = 1.0  # expert-gradient factor where routing was wrong (1: no damping, 0: no update)

    def __post_init__(self) -> None:
        if self.gate not in GATES:
            msg = f"smoe.gate {self.gate!r}: use one of {GATES}"
            raise ConfigError(msg)
        if self.experts < 2:
            msg = f"smoe.experts={self.experts}: need at least 2 experts to route between"
            raise ConfigError(msg)
        if not 0.0 <= self.quantile <= 1.0 or self.damping < 0.0:
            msg = f"smoe.quantile={self.quantile} must be in [0, 1] and smoe.damping={self.damping} >= 0"
            raise ConfigError(msg)


def rc_labels(idx: torch.Tensor, correct: torch.Tensor, experts: int) -> torch.Tensor:
    """RC-loss targets (B, E, H, W) from top-k indices and correctness, both (B, k, H, W):
    1 for correct selections, 0 for incorrect ones, and each unselected expert gets
    (#incorrect selections) / (#unselected experts); they sum to k per location when E > k."""
    b, k, h, w = idx.shape
    labels = torch.zeros(b, experts, h, w, dtype=torch.float32, device=idx.device)
    n_unselected = experts - k
    if n_unselected > 0:
        wrong = (~correct).sum(dim=1, keepdim=True).float()  # (B, 1, H, W)
        labels += wrong / n_unselected
    return labels.scatter(1, idx, correct.float())


class SMoEHead(nn.Module):
    """SMoE final layer emitting the K head channels (``outputs``; (a, b) for the Gaussian) from
    features (B, C, H, W).

    Each output channel is its own SMoE with ``experts`` experts and top-k = 1 routing (so an
    expert always produces the same quantity, e.g. a or b): experts ``Conv2d(C, KE, 3)`` without bias,
    routing weights (B, K, E, H, W). The K are routed as one batch of KB samples, so the RC-loss
    quantile is taken per sample and per output channel (a and b errors have different scales)."""

    def __init__(self, in_channels: int, grid: tuple[int, int], cfg: SMoEConfig, k: int = 1, outputs: int = 2):
        super().__init__()
        self.cfg, self.k, self.outputs = cfg, k, outputs
        self.experts = nn.Conv2d(in_channels, self.outputs * cfg.experts, 3, padding=1, bias=False)
        nn.init.zeros_(self.experts.weight)  # start at the raw ensemble
        self.gate: nn.Module | None = None
        if cfg.gate == "latent":
            bound = math.sqrt(3.0 / (k / cfg.experts))
            self.latent = nn.Parameter(torch.empty(self.outputs, cfg.experts, *grid).uniform_(-bound, bound))
        else:
            self.gate = nn.Conv2d(in_channels, self.outputs * cfg.experts, 3, padding=1)
        self.last: dict[str, torch.Tensor] = {}  # y, weights, idx of the latest forward (for the RC loss)

    def routing_weights(self, x: torch.Tensor) -> torch.Tensor:
        """(B * K, E, H, W) routing weights (output channel folded into the batch)."""
        b, _, h, w = x.shape
        if self.gate is not None:
            return self.gate(x).view(b * self.outputs, self.cfg.experts, h, w)
        if (h, w) != tuple(self.latent.shape[-2:]):
            msg = (
                f"latent SMoE gate was trained on a {tuple(self.latent.shape[-2:])} grid, "
                f"the input is {(h, w)}; use gate: conv for other grids"
            )
            raise BadInputError(msg)
        return self.latent.unsqueeze(0).expand(b, -1, -1, -1, -1).reshape(b * self.outputs, self.cfg.experts, h, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        weights = self.routing_weights(x)
        values = self.experts(x).view(b * self.outputs, self.cfg.experts, h, w)
        block = self.cfg.rc_loss and self.training
        y = kernels.topk_route(
            values,
            weights,
            self.k,
            self.cfg.weighted,
            block,
            self.cfg.damping if self.training else 1.0,
            self.cfg.quantile,
        )
        self.last = {"y": y, "weights": weights, "idx": weights.topk(self.k, dim=1).indices}
        return y.view(b, self.outputs * self.k, h, w)  # (B, K, H, W) for k = 1

    def rc_loss(self, task_loss: torch.Tensor) -> torch.Tensor:
        """The routing-classification loss of the latest forward (call before ``backward``)."""
        y, weights, idx = self.last["y"], self.last["weights"], self.last["idx"]
        (e,) = torch.autograd.grad(task_loss, y, retain_graph=True)  # through the head only
        labels = rc_labels(idx, routing_correct(e, self.cfg.quantile), self.cfg.experts)
        return F.binary_cross_entropy_with_logits(weights, labels)

    def expert_share(self) -> torch.Tensor:
        """Fraction of selections that went to each expert in the latest forward: (E,)."""
        idx = self.last["idx"]
        return torch.bincount(idx.flatten(), minlength=self.cfg.experts).float() / idx.numel()


class SMoE(nn.Module):
    """SMoE as the whole model: the layer applied to the inputs (B, C, H, W)."""

    def __init__(self, in_channels: int, grid: tuple[int, int], cfg: SMoEConfig, outputs: int = 2):
        super().__init__()
        self.smoe = SMoEHead(in_channels, grid, cfg, outputs=outputs)

    def forward(self, batch: Batch) -> Outputs:
        return tuple(self.smoe(batch["x"]).unbind(1))  # K x (B, H, W)


class UNetSMoE(nn.Module):
    """U-Net whose final layer is an SMoE."""

    def __init__(
        self, in_channels: int, grid: tuple[int, int], cfg: SMoEConfig, base: int = 32, depth: int = 2, outputs: int = 2
    ):
        super().__init__()
        self.trunk = UNetTrunk(in_channels, base, depth)
        self.smoe = SMoEHead(base, grid, cfg, outputs=outputs)

    def forward(self, batch: Batch) -> Outputs:
        return tuple(self.smoe(self.trunk(batch["x"])).unbind(1))  # K x (B, H, W)


# --- architectures ------------------------------------------------------------------------------
@architecture("smoe")
@dataclass(frozen=True)
class SMoEArchitecture:
    """The SMoE layer alone, on the inputs."""

    smoe: SMoEConfig = field(default_factory=SMoEConfig)

    def build(self, io: NetIO) -> nn.Module:
        return SMoE(io.in_channels, io.grid, self.smoe, io.outputs)


@architecture("unet_smoe")
@dataclass(frozen=True)
class UNetSMoEArchitecture:
    """U-Net whose final layer is an SMoE."""

    smoe: SMoEConfig = field(default_factory=SMoEConfig)
    base_filters: int = 32

    def build(self, io: NetIO) -> nn.Module:
        return UNetSMoE(io.in_channels, io.grid, self.smoe, self.base_filters, outputs=io.outputs)
