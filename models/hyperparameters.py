"""What a post-processor is, as one typed record read from its hyperparameters (:class:`ModelMeta`): the
keys Lightning saves in a checkpoint's ``hyper_parameters``, read here and nowhere else.

Two keys keep their old names in presets and checkpoints: ``family`` is the network's kind (mlp, unet, emos,
...: :attr:`ModelMeta.network`) and ``distribution`` the predictive law (:attr:`ModelMeta.family`, a
:mod:`postcast.datasets.laws` family), the one meaning of "family" in code."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelMeta:
    """A post-processor's settings: its network kind and options, its predictive family, the grid (H, W) and
    area (south, north, west, east; None for a global grid) it was trained on and the ensemble size."""

    network: str
    net: dict[str, Any]
    family: str
    grid: tuple[int, int]
    grid_area: tuple[float, float, float, float] | None
    n_members: int

    @classmethod
    def of(cls, hparams: Mapping[str, Any]) -> ModelMeta:
        area = hparams.get("grid_area")
        return cls(
            network=str(hparams["family"]),
            net=dict(hparams.get("net") or {}),
            family=str(hparams["distribution"]),
            grid=(int(hparams["grid"][0]), int(hparams["grid"][1])),
            grid_area=None if area is None else (float(area[0]), float(area[1]), float(area[2]), float(area[3])),
            n_members=int(hparams["n_members"]),
        )
