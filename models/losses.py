"""Training losses and the spread-relative distribution head shared by every post-processor.

Head: a network emits K raw maps per point (K = ``distributions.get(name).n_raw``); with the raw
ensemble mean ``m`` and population std ``s`` of the target they become the predictive distribution's
parameters (:mod:`postcast.models.distributions`). For the default ``gaussian`` (the ENS-10 reference
head, docs/ens10.md) the two outputs ``(a, b)`` define

    mu = m + s * a,    sigma = s * exp(b)

so ``a = b = 0`` reproduces the raw ensemble's Gaussian fit. ``s`` is floored (identical members
would give sigma = 0). The loss is the family's closed-form CRPS (:class:`CRPSLoss`; a Gaussian's
is the fused kernel :func:`postcast.models.kernels.crps_gaussian`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from postcast.datasets import laws
from postcast.datasets.core.errors import BadInputError
from postcast.models import distributions
from postcast.models.distributions import Distribution


def distribution_head(
    outs: Sequence[torch.Tensor],
    ens_mean: torch.Tensor,
    ens_std: torch.Tensor,
    name: str = laws.DEFAULT,
    *,
    min_std: float = 1e-6,
) -> Distribution:
    """The predictive distribution ``name`` from K raw network maps (each (B, H, W)) and the raw ensemble
    (m, s), (B, H, W): the family's :meth:`~postcast.models.distributions.Distribution.from_raw`, on ``s``
    floored at ``min_std``."""
    raw = torch.stack(list(outs), dim=-1)  # (B, H, W, K)
    return distributions.get(name).from_raw(raw, ens_mean, ens_std.clamp_min(min_std))


class CRPSLoss(torch.nn.Module):
    """Mean closed-form CRPS of any distribution family over the finite targets (NaN truth ignored; the
    parameters are masked before scoring, so no NaN reaches the gradients)."""

    def forward(self, dist: Distribution, y: torch.Tensor) -> torch.Tensor:
        valid = torch.isfinite(y)  # (B, H, W)
        if not bool(valid.any()):
            msg = "CRPSLoss: every target is NaN; check the truth in the store"
            raise BadInputError(msg)
        return dist.select(valid).crps(y[valid]).mean()
