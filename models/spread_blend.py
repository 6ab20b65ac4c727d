"""The networks' scale between the date's spread and the point's climatological spread (``model.scale: blend``).

Every network head is the ENS-10 spread form: the location is m + s a and the scale s exp(b), with s the
date's ensemble spread (:mod:`postcast.models.distributions`). Where the members' spread says little about the
error (10 m wind in the synthetic world: the correlation of s and |y - m| over the dates of a point is about
0.1, and |y - m| / s spans 0.5 to 20), a network must learn b = log(scale / s), a function of 1 / s that ReLU
layers fit badly: the local EMOS met the same problem and fixed it with the standard form's floor
(docs/emos.md). ``blend`` gives each point a learned exponent lambda (zero at the start) and reads the head
outputs in the units

    s_lambda = u^lambda s^(1 - lambda),

u the point's mean training spread of the target (the model's normalisation statistics): the scale is
s_lambda exp(b) and, for the location-scale families, the location m + s_lambda a. lambda = 0 is the spread
form, so an untrained model is still the raw ensemble's law exactly; lambda = 1 reads the outputs in the
point's climatological units, where the date's spread enters only as an input.
"""

from __future__ import annotations

import torch
from torch import nn

SCALES = ("spread", "blend")


class SpreadBlend(nn.Module):
    """The head outputs (K maps, each (B, H, W)) rewritten so the spread form reads them in s_lambda's units."""

    def __init__(self, grid: tuple[int, int], location: bool):
        super().__init__()
        self.exponent = nn.Parameter(torch.zeros(*grid))  # (H, W): lambda per point
        self.location = location  # the location is m + s a (location-scale families), so a is rescaled too

    def forward(self, outs: tuple[torch.Tensor, ...], s: torch.Tensor, unit: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``s`` (B, H, W) the date's spread, ``unit`` (H, W) the point's mean training spread (target units)."""
        log_ratio = self.exponent * torch.log(unit.clamp_min(1e-6) / s.clamp_min(1e-6))  # (B, H, W): log(s_l / s)
        a, b, *rest = outs
        if self.location:
            a = a * torch.exp(log_ratio)  # s a' = s_lambda a
        return (a, b + log_ratio, *rest)  # s exp(b') = s_lambda exp(b)
