"""Special functions the predictive families' scores need, in torch and to full precision: softplus, the
Mills ratio of the normal, and for the censored shifted gamma the regularised lower incomplete gamma P(k, x)
with a gradient in the shape k (torch has none), x g_k(x) (g_k the Gamma(k, 1) density) and k B(1/2, k + 1/2)
through Stirling's remainder, where differences of logs of order k log k would lose every digit at the shapes
near-identical members give (1e10 to 1e18). Elementwise, on any shape; :mod:`postcast.models.distributions`
uses them, and docs/distributions.md says why each form.
"""

from __future__ import annotations

import math
from typing import Any

import torch

SQRT2 = math.sqrt(2.0)
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + e^x) to full precision (``F.softplus`` returns x itself above 20, 2e-9 short there)."""
    return torch.logaddexp(x, torch.zeros_like(x))


def mills(x: torch.Tensor) -> torch.Tensor:
    """Mills ratio M(x) = Phi(-x) / phi(x) through the scaled complementary error function (x >= 0)."""
    return math.sqrt(math.pi / 2.0) * torch.special.erfcx(x / SQRT2)


class _GammaInc(torch.autograd.Function):
    """Regularised lower incomplete gamma P(k, x) with a gradient in the shape k too (torch has none):
    dP/dx = x^(k-1) e^-x / Gamma(k); dP/dk by a central difference (in float64) with step 1e-5 k up to shape 100
    and 1e-4 sqrt(k) above, where P varies over sqrt(k) in k: a step of 1e-5 k made dCRPS/db 2.5 % wrong at
    k = 2.5e5 (tests/test_distributions.py)."""

    @staticmethod
    def forward(k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.special.gammainc(k, x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, torch.Tensor], output: torch.Tensor) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, x = ctx.saved_tensors
        h = 1e-5 * torch.minimum(k, 10.0 * k.sqrt())  # P varies over k below shape 1, over sqrt(k) above
        dk = (torch.special.gammainc(k + h, x) - torch.special.gammainc(k - h, x)) / (2.0 * h)
        dx = torch.exp(torch.xlogy(k - 1.0, x) - x - torch.lgamma(k))
        return grad * dk, grad * dx


def gammainc(k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """P(k, x), differentiable in both arguments."""
    k, x = torch.broadcast_tensors(k, x)
    out: torch.Tensor = _GammaInc.apply(k, x)
    return out


def _stirlerr(k: torch.Tensor) -> torch.Tensor:
    """log Gamma(k + 1) - (k + 1/2) log k + k - log(2 pi) / 2 (Stirling's remainder, k > 0): its series
    from 15 on (the first term left out is below 3e-16 there), else directly."""
    big = k.clamp_min(15.0)
    inv2 = 1.0 / (big * big)
    series = (1.0 / 12 - inv2 * (1.0 / 360 - inv2 * (1.0 / 1260 - inv2 * (1.0 / 1680 - inv2 / 1188)))) / big
    small = k.clamp_max(15.0)
    direct = torch.lgamma(small + 1.0) - (small + 0.5) * torch.log(small) + small - HALF_LOG_2PI
    return torch.where(k >= 15.0, series, direct)


def _x_minus_log1p(e: torch.Tensor) -> torch.Tensor:
    """e - log(1 + e), e > -1, without cancellation near 0. Below |e| = 1/4, with u = e / (2 + e) (so
    log(1 + e) = 2 atanh(u) and e - 2u = e u): e u - 2 u^3 sum_n>=0 u^2n / (2n + 3), whose correction is at most
    4 % of e u (Horner, 11 terms: u^2 <= 0.021, 0.021^11 < 1e-18 relative)."""
    near = e.clamp(-0.25, 0.25)
    u = near / (2.0 + near)
    u2 = u * u
    acc = torch.full_like(e, 1.0 / 23)
    for n in range(9, -1, -1):
        acc = 1.0 / (2 * n + 3) + u2 * acc
    far = torch.where(e.abs() >= 0.25, e, torch.ones_like(e))  # each branch on inputs valid for it
    return torch.where(e.abs() < 0.25, near * u - 2.0 * u * u2 * acc, far - torch.log1p(far))


def x_gamma_density(k: torch.Tensor, x: torch.Tensor, gap: torch.Tensor) -> torch.Tensor:
    """x g_k(x) = x^k e^-x / Gamma(k) at x = k + gap (g_k the Gamma(k, 1) density; 0 at x = 0). Below shape
    1000 directly; above, as k Poisson(k; x) in Loader's saddle-point form sqrt(k / 2 pi) exp(-stirlerr(k) -
    k (e - log(1 + e))), e = gap / k, where no log of order k log k is formed (exact to rounding for k up
    to 1e18 and more; the direct form loses 1e-16 k log k: 37 at k = 1e16)."""
    small = k.clamp_max(1000.0)
    direct = torch.exp(torch.xlogy(small, x) - x - torch.lgamma(small))
    big = k.clamp_min(1000.0)
    e = gap / big
    inside = e > -1.0
    safe = torch.where(inside, e, torch.zeros_like(e))
    saddle = torch.sqrt(big / (2.0 * math.pi)) * torch.exp(-_stirlerr(big) - big * _x_minus_log1p(safe))
    return torch.where(k < 1000.0, direct, torch.where(inside, saddle, torch.zeros_like(saddle)))


def k_beta_half(k: torch.Tensor) -> torch.Tensor:
    """k B(1/2, k + 1/2) = sqrt(pi) k Gamma(k + 1/2) / Gamma(k + 1); above k = 1 through Stirling's
    remainder, sqrt(pi k) exp(stirlerr(k - 1/2) - stirlerr(k) - k (e - log(1 + e))), e = -1 / (2k), where
    lgamma's difference would lose 1e-16 k log k."""
    big = k.clamp_min(1.0)
    stable = (
        math.sqrt(math.pi)
        * torch.sqrt(big)
        * torch.exp(_stirlerr(big - 0.5) - _stirlerr(big) - big * _x_minus_log1p(-0.5 / big))
    )
    small = k.clamp_max(1.0)
    direct = math.sqrt(math.pi) * small * torch.exp(torch.lgamma(small + 0.5) - torch.lgamma(small + 1.0))
    return torch.where(k > 1.0, stable, direct)
