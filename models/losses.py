"""Training losses and the spread-relative Gaussian head shared by every post-processor.

Head (the ENS-10 reference head, docs/ens10.md): with the raw ensemble mean ``m`` and population std
``s`` of the target, a network's two outputs ``(a, b)`` define

    mu = m + s * a,    sigma = s * exp(b)

so ``a = b = 0`` reproduces the raw ensemble's Gaussian fit. ``s`` is floored (identical members
would give sigma = 0).
"""

from __future__ import annotations

import torch

from postcast.models import kernels


def gaussian_head(a: torch.Tensor, b: torch.Tensor, ens_mean: torch.Tensor, ens_std: torch.Tensor,
                  *, min_std: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(mu, sigma) from network outputs (a, b) and the raw ensemble (m, s); all the same shape."""
    s = ens_std.clamp_min(min_std)
    return ens_mean + s * a, s * torch.exp(b)


def crps_gaussian(mu: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Closed-form CRPS of N(mu, sigma^2) at y, elementwise and differentiable (units of y); fused
    forward + gradient on GPUs (see :mod:`postcast.models.kernels`)."""
    return kernels.crps_gaussian(mu, sigma, y)


class CRPSGaussianLoss(torch.nn.Module):
    """Mean closed-form Gaussian CRPS over all elements (NaN targets, e.g. missing truth, ignored)."""

    def forward(self, mu: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        valid = torch.isfinite(y)
        if not bool(valid.any()):
            msg = "CRPSGaussianLoss: every target is NaN; check the truth in the store"
            raise ValueError(msg)
        return crps_gaussian(mu[valid], sigma[valid], y[valid]).mean()
