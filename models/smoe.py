"""Spatial Mixture-of-Experts (Dryden & Hoefler, NeurIPS 2022; ../shared/reference/smoe.md).

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

:class:`SMoEHead` is the SMoE as the final layer (k = 2 outputs: a, b) of any trunk; the model
kinds ``smoe`` (on the inputs directly) and ``unet_smoe`` (on U-Net features) use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from postcast.models.convnets import UNetTrunk
from postcast.models.postprocessors import Batch

GATES = ("latent", "conv")


@dataclass(frozen=True)
class SMoEConfig:
    """SMoE options (defaults: the reference heat-diffusion run, the suggested ENS-10 start)."""

    experts: int = 3
    gate: str = "latent"  # latent | conv
    weighted: bool = False  # multiply selected expert values by their routing weight
    rc_loss: bool = True  # routing-classification loss (blocks the gate's task gradient)
    rc_weight: float = 1.0
    quantile: float = 0.3  # |e| quantile below which a selection counts as correct
    damping: float = 0.0  # expert-gradient factor where routing was wrong (1: no damping)

    def __post_init__(self) -> None:
        if self.gate not in GATES:
            msg = f"smoe.gate {self.gate!r}: use one of {GATES}"
            raise ValueError(msg)
        if self.experts < 2:
            msg = f"smoe.experts={self.experts}: need at least 2 (k = 2 outputs are selected)"
            raise ValueError(msg)
        if not 0.0 <= self.quantile <= 1.0 or self.damping < 0.0:
            msg = f"smoe.quantile={self.quantile} must be in [0, 1] and smoe.damping={self.damping} >= 0"
            raise ValueError(msg)


def routing_correct(e: torch.Tensor, quantile: float, eps: float = 1e-12) -> torch.Tensor:
    """Which selected outputs count as correctly routed: |e| <= per-sample quantile of |e|.
    e: (B, k, H, W) gradient of the task loss w.r.t. the SMoE output -> bool (B, k, H, W)."""
    mag = e.abs().flatten(1)
    q = torch.quantile(mag.float(), quantile, dim=1).to(e.dtype)  # (B,)
    return e.abs() <= q.view(-1, 1, 1, 1) + eps


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


class TopKRouting(torch.autograd.Function):
    """y = top-k selection of expert values by routing weight, with the SMoE backward."""

    @staticmethod
    def forward(ctx: Any, values: torch.Tensor, weights: torch.Tensor, k: int, weighted: bool,
                block_gate: bool, damping: float, quantile: float) -> torch.Tensor:
        # values, weights: (B, E, H, W) -> y (B, k, H, W)
        idx = weights.topk(k, dim=1).indices  # (B, k, H, W)
        sel_v = values.gather(1, idx)
        sel_w = weights.gather(1, idx)
        ctx.save_for_backward(idx, sel_v, sel_w)
        ctx.cfg = (values.shape[1], weighted, block_gate, damping, quantile)
        ctx.mark_non_differentiable(idx)
        return sel_v * sel_w if weighted else sel_v

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        e = grads[0]  # (B, k, H, W)
        idx, sel_v, sel_w = ctx.saved_tensors
        experts, weighted, block_gate, damping, quantile = ctx.cfg
        shape = (e.shape[0], experts, *e.shape[2:])
        g_v = e * sel_w if weighted else e
        if damping != 1.0:
            g_v = torch.where(routing_correct(e, quantile), g_v, g_v * damping)
        grad_values = e.new_zeros(shape).scatter(1, idx, g_v)
        grad_weights = None
        if not block_gate:
            grad_weights = e.new_zeros(shape).scatter(1, idx, e * sel_v if weighted else e)
        return grad_values, grad_weights, None, None, None, None, None


class SMoEHead(nn.Module):
    """SMoE layer emitting k = 2 channels (a, b) from features (B, C, H, W) on a fixed grid."""

    k = 2

    def __init__(self, in_channels: int, grid: tuple[int, int], cfg: SMoEConfig):
        super().__init__()
        self.cfg = cfg
        self.experts = nn.Conv2d(in_channels, cfg.experts, 3, padding=1, bias=False)
        nn.init.zeros_(self.experts.weight)  # start at the raw ensemble
        self.gate: nn.Module | None = None
        if cfg.gate == "latent":
            bound = math.sqrt(3.0 / (self.k / cfg.experts))
            self.latent = nn.Parameter(torch.empty(cfg.experts, *grid).uniform_(-bound, bound))
        else:
            self.gate = nn.Conv2d(in_channels, cfg.experts, 3, padding=1)
        self.last: dict[str, torch.Tensor] = {}  # y, weights, idx of the latest forward (for the RC loss)

    def routing_weights(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.gate(x)  # (B, E, H, W)
        if x.shape[-2:] != self.latent.shape[-2:]:
            msg = (f"latent SMoE gate was trained on a {tuple(self.latent.shape[-2:])} grid, "
                   f"the input is {tuple(x.shape[-2:])}; use gate: conv for other grids")
            raise ValueError(msg)
        return self.latent.unsqueeze(0).expand(x.shape[0], -1, -1, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.routing_weights(x)
        block = self.cfg.rc_loss and self.training
        y = TopKRouting.apply(self.experts(x), weights, self.k, self.cfg.weighted, block,
                              self.cfg.damping if self.training else 1.0, self.cfg.quantile)
        self.last = {"y": y, "weights": weights, "idx": weights.topk(self.k, dim=1).indices}
        return y  # (B, 2, H, W)

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

    def __init__(self, in_channels: int, grid: tuple[int, int], cfg: SMoEConfig):
        super().__init__()
        self.smoe = SMoEHead(in_channels, grid, cfg)

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.smoe(batch["x"])
        return out[:, 0], out[:, 1]


class UNetSMoE(nn.Module):
    """U-Net whose final layer is an SMoE."""

    def __init__(self, in_channels: int, grid: tuple[int, int], cfg: SMoEConfig, base: int = 32, depth: int = 2):
        super().__init__()
        self.trunk = UNetTrunk(in_channels, base, depth)
        self.smoe = SMoEHead(base, grid, cfg)

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.smoe(self.trunk(batch["x"]))
        return out[:, 0], out[:, 1]
