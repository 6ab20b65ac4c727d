"""Plain PyTorch implementations of the fused kernels: the CPU path, the ``torch.compile`` source and
the reference the Triton kernels are tested against. Shapes and units are documented per function
in :mod:`postcast.models.kernels`."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

INV_SQRT_PI = 1.0 / math.sqrt(math.pi)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def ensemble_standardise(members: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """members (B, M, *F) -> mean (B, *F), population std (B, *F), z = (x - mean) / max(std, eps) (B, M, *F)."""
    mean = members.mean(dim=1)
    d = members - mean.unsqueeze(1)
    std = d.square().mean(dim=1).sqrt()
    return mean, std, d / std.clamp_min(eps).unsqueeze(1)


def crps_gaussian(mu: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Closed-form CRPS of N(mu, sigma^2) at y, elementwise (units of y)."""
    z = (y - mu) / sigma
    pdf = INV_SQRT_2PI * torch.exp(-0.5 * z * z)
    cdf = torch.special.ndtr(z)
    return sigma * (z * (2.0 * cdf - 1.0) + 2.0 * pdf - INV_SQRT_PI)


def crps_ensemble(x: torch.Tensor, y: torch.Tensor, fair: bool = True) -> torch.Tensor:
    """Ensemble CRPS of members x (N, M) at y (N,) by sorting: sum_ij |x_i - x_j| = 2 sum_i (2i - M - 1) x_(i)."""
    m = x.shape[-1]
    s = x.sort(dim=-1).values
    w = 2.0 * torch.arange(1, m + 1, dtype=x.dtype, device=x.device) - m - 1.0  # (M,)
    spread = (s * w).sum(-1) / (m * (m - 1) if fair else m * m)
    return (x - y.unsqueeze(-1)).abs().mean(-1) - spread


def routing_correct(e: torch.Tensor, quantile: float, eps: float = 1e-12) -> torch.Tensor:
    """Which selected outputs count as correctly routed: |e| <= per-sample quantile of |e|.
    e: (B, k, H, W) gradient of the task loss w.r.t. the SMoE output -> bool (B, k, H, W)."""
    mag = e.abs().flatten(1)
    q = torch.quantile(mag.float(), quantile, dim=1).to(e.dtype)  # (B,)
    return e.abs() <= q.view(-1, *([1] * (e.dim() - 1))) + eps


def route_forward(
    values: torch.Tensor, weights: torch.Tensor, k: int, weighted: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The routing's forward: values, weights (B, E, H, W) -> y (B, k, H, W), the selected experts idx
    (B, k, H, W) uint8, and what the backward needs when ``weighted`` (else empty): the selected values
    and weights (B, k, H, W). Fresh tensors, none aliasing another (a custom operator's outputs)."""
    idx = weights.topk(k, dim=1).indices  # (B, k, H, W) int64
    sel_v = values.gather(1, idx)
    if not weighted:
        return sel_v, idx.to(torch.uint8), values.new_empty(0), weights.new_empty(0)
    sel_w = weights.gather(1, idx)
    return (sel_v * sel_w).to(values.dtype), idx.to(torch.uint8), sel_v, sel_w  # y in the values' dtype


def route_backward(
    e: torch.Tensor,
    idx: torch.Tensor,
    sel_v: torch.Tensor,
    sel_w: torch.Tensor,
    experts: int,
    weighted: bool,
    block_gate: bool,
    damping: float,
    quantile: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing's backward from the output gradient e (B, k, H, W) and :func:`route_forward`'s saved
    tensors: the values' gradient (B, E, H, W) and the weights' (B, E, H, W; empty when ``block_gate``)."""
    shape = (e.shape[0], experts, *e.shape[2:])
    at = idx.long()
    g_v = (e * sel_w).to(e.dtype) if weighted else e  # a bf16 value and an fp32 weight: the values dtype
    if damping != 1.0:
        g_v = torch.where(routing_correct(e, quantile), g_v, g_v * damping)
    grad_values = e.new_zeros(shape).scatter(1, at, g_v)
    if block_gate:
        return grad_values, e.new_empty(0)
    return grad_values, e.new_zeros(shape).scatter(1, at, e * sel_v if weighted else e)


class TopKRouting(torch.autograd.Function):
    """y = top-k selection of expert values by routing weight, with the SMoE backward (docs/models.md):
    expert gradients only at selected experts, scaled by ``damping`` where the routing was wrong;
    the gate gets no task gradient when ``block_gate`` (it learns from the RC loss instead)."""

    @staticmethod
    def forward(
        ctx: Any,
        values: torch.Tensor,
        weights: torch.Tensor,
        k: int,
        weighted: bool,
        block_gate: bool,
        damping: float,
        quantile: float,
    ) -> torch.Tensor:
        # values, weights: (B, E, H, W) -> y (B, k, H, W)
        y, idx, sel_v, sel_w = route_forward(values, weights, k, weighted)
        ctx.save_for_backward(idx, sel_v, sel_w)
        ctx.cfg = (values.shape[1], weighted, block_gate, damping, quantile)
        return y

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        idx, sel_v, sel_w = ctx.saved_tensors
        block_gate = ctx.cfg[2]
        grad_values, grad_weights = route_backward(grads[0], idx, sel_v, sel_w, *ctx.cfg)
        return grad_values, None if block_gate else grad_weights, None, None, None, None, None


def topk_route(
    values: torch.Tensor,
    weights: torch.Tensor,
    k: int,
    weighted: bool,
    block_gate: bool,
    damping: float,
    quantile: float,
) -> torch.Tensor:
    out: torch.Tensor = TopKRouting.apply(values, weights, k, weighted, block_gate, damping, quantile)
    return out


def fourier_layer(coords: torch.Tensor, bmat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """GELU(W [sin 2 pi x B, cos 2 pi x B] + b): coords (N, D), bmat (D, F), weight (H, 2F), bias (H) -> (N, H)."""
    ang = 2.0 * math.pi * (coords @ bmat)  # (N, F)
    feats = torch.cat([torch.sin(ang), torch.cos(ang)], dim=-1)  # (N, 2F)
    return F.gelu(F.linear(feats, weight, bias))
