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

Gates (:class:`Gate`, the reference's ``smoe_gates.py``): ``latent``, ``conv`` (3 x 3), ``conv1x1``,
``coordconv`` (a convolution of the input and two coordinate channels; ``gate_layers`` > 1: a multi-layer
CoordConv), ``lcn`` (locally connected: a 1 x 1 map of its own at every point) and ``fixed`` (a fixed map:
E equal latitude bands, expert e owning band e); extras: ``normalise`` (softmax over experts), ``noise``
(training-time Gaussian noise of std noise / E) and ``absolute`` (route by |R|).

:class:`SMoEHead` is the SMoE as the final layer of any trunk, one top-1 SMoE per head output
((a, b) for the Gaussian, K = ``NetIO.outputs`` in general); the model
kinds ``smoe`` (on the inputs directly) and ``unet_smoe`` (on U-Net features) use it. :class:`SMoELayer` is a
hidden SMoE (top-C of E >= C experts, residual: x + y, zero experts so it starts as the identity) that
``unet_smoe`` puts between its decoder blocks with ``decoder_experts`` > 0 (the gate learns from the task
loss there: the reference runs the RC loss for a single, final SMoE only).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from postcast.datasets.core.errors import BadInputError, ConfigError
from postcast.models import kernels
from postcast.models.convnets import PointHead, UNetTrunk, check_norm
from postcast.models.earth import PointEmbedding, check_embedding
from postcast.models.kernels.reference import TopKRouting, routing_correct
from postcast.models.postprocessors import Batch, Outputs
from postcast.models.registry import NetIO, architecture

__all__ = [
    "Gate",
    "SMoE",
    "SMoEConfig",
    "SMoEHead",
    "SMoELayer",
    "TopKRouting",
    "UNetSMoE",
    "rc_labels",
    "routing_correct",
]

GATES = ("latent", "conv", "conv1x1", "coordconv", "lcn", "fixed")
GRID_GATES = ("latent", "lcn", "fixed")  # gates bound to the grid they were built for


@dataclass(frozen=True)
class SMoEConfig:
    """SMoE options. Defaults follow the reference code's defaults: RC loss on, quantile 0.7, expert-error
    damping off (factor 1; the reference's ``--dampen-expert-error`` uses 0). On the synthetic data
    damping 0 with quantile 0.3 (the heat-diffusion run) trained clearly worse than the plain U-Net."""

    experts: int = 3
    gate: str = "latent"  # one of GATES
    gate_layers: int = 1  # conv / coordconv gates: convolutions (ReLU between; > 1: the multi-layer CoordConv)
    normalise: bool = False  # softmax of the routing weights over the experts
    noise: float = 0.0  # training-time Gaussian noise on the routing weights, std noise / experts
    absolute: bool = False  # route by |R| (the largest magnitude wins)
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
        if self.gate_layers < 1 or self.noise < 0.0:
            msg = f"smoe.gate_layers={self.gate_layers} must be >= 1 and smoe.noise={self.noise} >= 0"
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


def _coords(x: torch.Tensor) -> torch.Tensor:
    """Two coordinate channels in [-1, 1] (row, column) for (B, C, H, W): (B, 2, H, W)."""
    b, _, h, w = x.shape
    rows = torch.linspace(-1.0, 1.0, h, device=x.device, dtype=x.dtype).view(1, 1, h, 1).expand(b, 1, h, w)
    cols = torch.linspace(-1.0, 1.0, w, device=x.device, dtype=x.dtype).view(1, 1, 1, w).expand(b, 1, h, w)
    return torch.cat([rows, cols], dim=1)


def _bands(n: int, grid: tuple[int, int]) -> torch.Tensor:
    """The fixed gate's map (n, H, W): 1 where expert e owns the point (n equal latitude bands), else 0."""
    band = torch.arange(grid[0]) * n // grid[0]  # (H,)
    return F.one_hot(band, n).T.float()[:, :, None].expand(n, *grid).clone()


class Gate(nn.Module):
    """Routing weights R (B, n, H, W) of ``n`` experts from features (B, C, H, W), by ``cfg.gate`` (module
    docstring), then the extras (absolute value, softmax, training noise). A grid-bound gate (latent, lcn,
    fixed) refuses another grid."""

    def __init__(self, in_channels: int, n: int, grid: tuple[int, int], cfg: SMoEConfig, k: int = 1):
        super().__init__()
        self.cfg, self.n, self.grid = cfg, n, grid
        self.convs: nn.Sequential | None = None
        if cfg.gate == "latent":  # init: uniform, bound sqrt(3 / (k / E)) (the reference's)
            bound = math.sqrt(3.0 / (k / cfg.experts))
            self.map = nn.Parameter(torch.empty(n, *grid).uniform_(-bound, bound))  # (n, H, W)
        elif cfg.gate == "lcn":  # a 1 x 1 map of its own at every point: weight (n, C, H, W), bias (n, H, W)
            self.map = nn.Parameter(torch.zeros(n, *grid))
            self.local = nn.Parameter(torch.randn(n, in_channels, *grid) / math.sqrt(in_channels))
        elif cfg.gate == "fixed":  # the same bands for each of the n / E routed quantities (head outputs)
            self.register_buffer("map", _bands(cfg.experts, grid).repeat(n // cfg.experts, 1, 1))
        else:
            self.convs = self._convs(in_channels + 2 * (cfg.gate == "coordconv"), n)

    def _convs(self, c_in: int, n: int) -> nn.Sequential:
        size = 1 if self.cfg.gate == "conv1x1" else 3
        layers: list[nn.Module] = []
        for _ in range(self.cfg.gate_layers - 1):
            layers += [nn.Conv2d(c_in, c_in, size, padding=size // 2), nn.ReLU()]
        return nn.Sequential(*layers, nn.Conv2d(c_in, n, size, padding=size // 2))

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        """The gate's own weights (B, n, H, W), before the extras."""
        b, _, h, w = x.shape
        if self.convs is not None:
            return self.convs(torch.cat([x, _coords(x)], dim=1) if self.cfg.gate == "coordconv" else x)
        if (h, w) != tuple(self.grid):
            msg = (
                f"{self.cfg.gate} SMoE gate was trained on a {tuple(self.grid)} grid, "
                f"the input is {(h, w)}; use gate: conv for other grids"
            )
            raise BadInputError(msg)
        out = self.map.unsqueeze(0).expand(b, -1, -1, -1)
        if self.cfg.gate == "lcn":
            out = out + torch.einsum("bchw,nchw->bnhw", x, self.local)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.raw(x)  # (B, n, H, W)
        if self.cfg.absolute:
            r = r.abs()
        if self.cfg.normalise:
            r = r.softmax(dim=1)
        if self.training and self.cfg.noise > 0.0:
            r = r + torch.randn_like(r) * (self.cfg.noise / self.cfg.experts)
        return r


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
        self.gate = Gate(in_channels, self.outputs * cfg.experts, grid, cfg, k)
        self.last: dict[str, torch.Tensor] = {}  # y, weights, idx of the latest forward (for the RC loss)

    def routing_weights(self, x: torch.Tensor) -> torch.Tensor:
        """(B * K, E, H, W) routing weights (output channel folded into the batch)."""
        b, _, h, w = x.shape
        return self.gate(x).reshape(b * self.outputs, self.cfg.experts, h, w)

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


class SMoELayer(nn.Module):
    """A hidden SMoE: (B, C, H, W) -> x + y, y (B, C, H, W) the top-C of ``experts`` (>= C) experts at every
    point (the paper's layer with k = C outputs), the gate learning from the task loss (no RC loss, no
    damping). The experts start at zero, so the layer starts as the identity."""

    def __init__(self, channels: int, experts: int, grid: tuple[int, int], cfg: SMoEConfig):
        super().__init__()
        if experts < channels:
            msg = f"an SMoE layer of {channels} channels needs at least {channels} experts, not {experts}"
            raise ConfigError(msg)
        self.channels, self.weighted = channels, cfg.weighted
        self.experts = nn.Conv2d(channels, experts, 3, padding=1, bias=False)
        nn.init.zeros_(self.experts.weight)
        self.gate = Gate(channels, experts, grid, dataclasses.replace(cfg, experts=experts), channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = kernels.topk_route(self.experts(x), self.gate(x), self.channels, self.weighted, False, 1.0, 0.5)
        return x + y  # (B, C, H, W)


class SMoE(nn.Module):
    """SMoE as the whole model: the layer applied to the inputs (B, C, H, W)."""

    def __init__(
        self, in_channels: int, grid: tuple[int, int], cfg: SMoEConfig, outputs: int = 2, *, embedding: int = 0
    ):
        super().__init__()
        self.embedding = PointEmbedding(embedding, grid)
        self.smoe = SMoEHead(in_channels + embedding, grid, cfg, outputs=outputs)

    def forward(self, batch: Batch) -> Outputs:
        return tuple(self.smoe(self.embedding(batch["x"])).unbind(1))  # K x (B, H, W)


class UNetSMoE(nn.Module):
    """U-Net whose final layer is an SMoE; with ``decoder_experts`` > 0, an :class:`SMoELayer` of that many experts
    per channel between its decoder blocks; with ``embedding`` > 0, E learned numbers per grid point join the
    inputs (:class:`~postcast.models.earth.PointEmbedding`); with ``head`` > 0, the U-Net's pointwise head of that
    many hidden units beside the SMoE, the two outputs added (the SMoE a routed correction of the U-Net's)."""

    def __init__(
        self,
        in_channels: int,
        grid: tuple[int, int],
        cfg: SMoEConfig,
        base: int = 32,
        depth: int = 2,
        outputs: int = 2,
        *,
        embedding: int = 0,
        smoothing: float = 0.0,
        decoder_experts: int = 0,
        norm: str = "batch",
        head: int = 0,
    ):
        super().__init__()

        def between(channels: int, level_grid: tuple[int, int]) -> nn.Module:
            return SMoELayer(channels, decoder_experts * channels, level_grid, cfg)

        self.trunk = UNetTrunk(
            in_channels,
            base,
            depth,
            grid=grid,
            embedding=embedding,
            smoothing=smoothing,
            between=between if decoder_experts else None,
            norm=norm,
        )
        c = self.trunk.out_channels
        self.head = PointHead(c, in_channels, head, outputs) if head else None
        self.smoe = SMoEHead(c, grid, cfg, outputs=outputs)

    def forward(self, batch: Batch) -> Outputs:
        x = batch["x"]  # (B, C, H, W)
        feats = self.trunk(x)  # (B, base + E, H, W)
        out = self.smoe(feats)  # (B, K, H, W)
        if self.head is not None:
            out = out + self.head(feats, x)
        return tuple(out.unbind(1))  # K x (B, H, W)


# --- architectures ------------------------------------------------------------------------------
@architecture("smoe")
@dataclass(frozen=True)
class SMoEArchitecture:
    """The SMoE layer alone, on the inputs."""

    smoe: SMoEConfig = field(default_factory=SMoEConfig)
    embedding: int = 0  # learned numbers per grid point joined to the inputs (0: none)

    def __post_init__(self) -> None:
        check_embedding("smoe", self.embedding)

    def build(self, io: NetIO) -> nn.Module:
        return SMoE(io.in_channels, io.grid, self.smoe, io.outputs, embedding=self.embedding)


@architecture("unet_smoe")
@dataclass(frozen=True)
class UNetSMoEArchitecture:
    """U-Net whose final layer is an SMoE."""

    smoe: SMoEConfig = field(default_factory=SMoEConfig)
    base_filters: int = 32
    embedding: int = 0  # learned numbers per grid point joined to the inputs (0: none; the model is then grid-free)
    smoothing: float = 0.0  # the embedding read through a Gaussian filter this many grid cells wide (0: none)
    decoder_experts: int = 0  # > 0: an SMoE layer between the decoder blocks, top-C of C x this many experts
    norm: str = "batch"  # normalisation in each block: batch, group or none
    head: int = 0  # > 0: the U-Net's pointwise head (this many hidden units) beside the SMoE, outputs added

    def __post_init__(self) -> None:
        check_embedding("unet_smoe", self.embedding, self.smoothing)
        check_norm("unet_smoe", self.norm)
        if self.decoder_experts < 0:
            msg = f"model.net (unet_smoe) decoder_experts={self.decoder_experts}: give experts per channel, >= 0"
            raise ConfigError(msg)

    def build(self, io: NetIO) -> nn.Module:
        return UNetSMoE(
            io.in_channels,
            io.grid,
            self.smoe,
            self.base_filters,
            outputs=io.outputs,
            embedding=self.embedding,
            smoothing=self.smoothing,
            decoder_experts=self.decoder_experts,
            norm=self.norm,
            head=self.head,
        )
