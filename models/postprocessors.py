"""Pointwise post-processors and the model interface.

Every post-processor is an ``nn.Module`` whose ``forward(batch)`` maps a batch of
:class:`~postcast.datasets.loaders.datamodule.StoreDataset` samples to K head outputs, each
(B, H, W), for the spread-relative distribution head of :mod:`postcast.models.losses` (K =
``NetIO.outputs``: 2, ``(a, b)``, for the Gaussian). The last layer of each is zero-initialised, so
an untrained model reproduces the raw ensemble (all outputs 0).

Pointwise models (this module): the ENS-10 MLP, a local (per-grid-point) EMOS and the 13-parameter
global EMOS of the ENS-10 reference. Grid models live in :mod:`.convnets`, :mod:`.smoe` and
:mod:`.transformer`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import nn

from postcast.datasets import laws
from postcast.datasets.core.errors import BadInputError, ConfigError
from postcast.models import emos_forms
from postcast.models.distributions import Distribution
from postcast.models.earth import Smoother, check_embedding
from postcast.models.losses import CRPSLoss, distribution_head
from postcast.models.registry import NetIO, architecture

Batch = dict[str, torch.Tensor]
Outputs = tuple[torch.Tensor, ...]  # K head maps, each (B, H, W)


def zero_init(layer: nn.Module) -> nn.Module:
    """Zero a layer's weight and bias (the head then starts at the raw ensemble)."""
    for p in layer.parameters():
        nn.init.zeros_(p)
    return layer


def constant_outputs(extra: torch.Tensor | None, like: torch.Tensor) -> Outputs:
    """Head outputs beyond the first two that do not depend on the input: each (K - 2, ...) entry of
    ``extra`` broadcast to ``like`` (B, H, W); none for two-parameter families."""
    return () if extra is None else tuple(e.expand_as(like) for e in extra)


class PointwiseMLP(nn.Module):
    """ENS-10 MLP baseline: per grid point, inputs -> hidden (ReLU) -> K head outputs; shared weights.
    Implemented as 1x1 convolutions, so a whole date is one batch (B, C, H, W).

    ``embedding`` > 0 gives every grid point of ``grid`` that many learned numbers, read as extra inputs
    (the station embedding of Rasp and Lerch 2018): the shared network then learns what is local to a
    place (a static bias) beside what the weather explains; ``smoothing`` > 0 reads them through a Gaussian
    filter of that many grid cells (:mod:`postcast.models.earth`), so that neighbouring places share their
    dates. Such a model is bound to its training grid, like the local EMOS."""

    def __init__(
        self,
        in_channels: int,
        hidden: int = 128,
        outputs: int = 2,
        *,
        layers: int = 1,
        grid: tuple[int, int] = (0, 0),
        embedding: int = 0,
        smoothing: float = 0.0,
    ):
        super().__init__()
        self.embedding = nn.Parameter(torch.zeros(embedding, *grid)) if embedding else None  # (E, H, W)
        self.smooth = Smoother(grid, smoothing) if embedding and smoothing > 0 else nn.Identity()
        widths = [in_channels + embedding] + [hidden] * layers
        hidden_layers = [m for a, b in itertools.pairwise(widths) for m in (nn.Conv2d(a, b, 1), nn.ReLU())]
        self.net = nn.Sequential(*hidden_layers, zero_init(nn.Conv2d(hidden, outputs, 1)))

    def forward(self, batch: Batch) -> Outputs:
        x = batch["x"]  # (B, C, H, W)
        if self.embedding is not None:
            own = self.smooth(self.embedding)  # (E, H, W)
            x = torch.cat([x, own.expand(x.shape[0], -1, -1, -1)], dim=1)  # (B, C + E, H, W)
        return tuple(self.net(x).unbind(1))  # K x (B, H, W)


@dataclass(frozen=True)
class _PointFields:
    """A batch's fields as the EMOS forms read them, points first: each (P, B) (:mod:`emos_forms`)."""

    xm: torch.Tensor
    xs: torch.Tensor
    m: torch.Tensor
    s: torch.Tensor
    u: torch.Tensor | None
    season: torch.Tensor | None  # (P, B, 2): sin, cos of the day of year


class LocalEMOS(nn.Module):
    """EMOS with its own coefficients at every grid point, (a0, a1, b0, b1) on x_mean and x_std (the target's
    normalised ensemble mean and std channels) in ``form`` (:mod:`postcast.models.emos_forms`): ``spread``,
    location m + s (a0 + a1 x_mean) and scale s exp(b0 + b1 x_std); ``standard``, location m + u (a0 + a1 x_mean)
    and scale sqrt(c^2 + d^2 s^2) with c = u b0, d = b1, u the point's ``unit`` (a buffer, set by
    the fit); ``sh`` (the censored shifted gamma's), the standard scale and a shift bounded in units of u. A family
    with more than two head outputs gets one more constant per point for each. ``solver``:
    ``newton`` fits every point to its training-CRPS optimum before the first epoch
    (:mod:`postcast.models.emos_fit`); ``gradient`` leaves the coefficients to the epochs' optimiser; ``auto``
    (the default) is ``newton`` for the location-scale families (:attr:`postcast.datasets.laws.Family.location_scale`)
    and ``gradient`` for the others. ``form: auto`` is the spread form until the fit chooses (:meth:`PostProcessor`).
    ``season_channels`` (the inputs' sine and cosine of the day of year): two more coefficients per point, the
    location's seasonal terms (:mod:`postcast.models.emos_forms`)."""

    def __init__(
        self,
        grid: tuple[int, int],
        mean_channel: int,
        std_channel: int,
        outputs: int = 2,
        solver: str = "auto",
        form: str = "spread",
        season_channels: tuple[int, int] | None = None,
    ):
        super().__init__()
        self.mean_channel, self.std_channel, self.solver, self.form = mean_channel, std_channel, solver, form
        self.season_channels = season_channels
        self.coef = nn.Parameter(torch.zeros(4, *grid))  # (a0, a1, b0, b1) per point
        self.extra = nn.Parameter(torch.zeros(outputs - 2, *grid)) if outputs > 2 else None  # (K - 2, H, W)
        self.season = nn.Parameter(torch.zeros(emos_forms.SEASON, *grid)) if season_channels else None  # (2, H, W)
        self.unit: torch.Tensor | None
        if form in ("standard", "sh"):
            self.register_buffer("unit", torch.ones(*grid))  # (H, W), target units
        else:
            self.unit = None

    def forward(self, batch: Batch) -> Outputs:
        x = batch["x"]  # (B, C, H, W)
        b, _, h, w = x.shape
        s = batch["s"].clamp_min(1e-6)  # (B, H, W): the head's floor (losses.distribution_head)

        def points(t: torch.Tensor) -> torch.Tensor:
            return t.flatten(1).T  # (B, H, W) -> (P, B)

        u = None if self.unit is None else self.unit.flatten()[:, None].expand(-1, b).to(s)
        season = None
        if self.season_channels is not None:  # (P, B, 2): the inputs' sin and cos of the day of year
            season = torch.stack([points(x[:, c]) for c in self.season_channels], dim=-1)
        xm, xs = points(x[:, self.mean_channel]), points(x[:, self.std_channel])
        fields = _PointFields(xm, xs, points(batch["m"]), points(s), u, season)
        form = "spread" if self.form == "auto" else self.form
        raw = emos_forms.raw(self._theta(), fields, form)  # (P, B, K)
        return tuple(raw.permute(2, 1, 0).reshape(-1, b, h, w).unbind(0))  # K x (B, H, W)

    def _theta(self) -> torch.Tensor:
        parts: list[torch.Tensor] = [p for p in (self.coef, self.extra, self.season) if p is not None]
        return torch.cat(parts).flatten(1).T  # (P, 4 + K - 2 [+ 2])

    def theta(self) -> torch.Tensor:
        """The coefficients per point, (P, 4 + K - 2 [+ 2 seasonal]) with P = H * W (row-major points)."""
        return self._theta().detach()

    def set_theta(self, theta: torch.Tensor, unit: torch.Tensor | None = None) -> None:
        """Coefficients from a per-point fit, theta (P, 4 + K - 2 [+ 2 seasonal]) with P = H * W (row-major
        points), and the standard form's unit per point (P,)."""
        with torch.no_grad():
            self.coef.copy_(theta[:, :4].T.reshape(self.coef.shape))
            k = 4
            for part in (self.extra, self.season):
                if part is not None:
                    part.copy_(theta[:, k : k + part.shape[0]].T.reshape(part.shape))
                    k += part.shape[0]
            if self.unit is not None and unit is not None:
                self.unit.copy_(unit.reshape(self.unit.shape))


def require_members(batch: Batch, model: str) -> torch.Tensor:
    if "members" not in batch:
        msg = f"the {model} model reads the raw members: set data.cfg.sample.members: true in the training config"
        raise ConfigError(msg)
    return batch["members"]  # (B, M, V, H, W)


class GlobalEMOS(nn.Module):
    """The ENS-10 reference EMOS: one set of 13 parameters (10 members) for the whole globe.

    a = sum_j w_j z_j + c  (z_j: member j of the target variable, normalised; M + 1 parameters);
    b = w_s x_std + c_s    (x_std: the normalised ensemble-std channel; 2 parameters);
    one global constant for each further head output.
    """

    def __init__(self, n_members: int, variable_index: int, std_channel: int, outputs: int = 2):
        super().__init__()
        self.variable_index, self.std_channel = variable_index, std_channel
        self.mean = zero_init(nn.Linear(n_members, 1))
        self.spread = zero_init(nn.Linear(1, 1))
        self.extra = nn.Parameter(torch.zeros(outputs - 2)) if outputs > 2 else None  # (K - 2,)

    def forward(self, batch: Batch) -> Outputs:
        z = require_members(batch, "emos_global")[:, :, self.variable_index]  # (B, M, H, W)
        if z.shape[1] != self.mean.in_features:
            msg = f"emos_global was built for {self.mean.in_features} members, the batch has {z.shape[1]}"
            raise BadInputError(msg)
        a = self.mean(z.movedim(1, -1)).squeeze(-1)  # (B, H, W)
        b = self.spread(batch["x"][:, self.std_channel].unsqueeze(-1)).squeeze(-1)
        return (a, b, *constant_outputs(self.extra, a))


def predict(model: nn.Module, batch: Batch, distribution: str = laws.DEFAULT) -> Distribution:
    """The predictive distribution in physical units, parameters (B, H, W), for a batch from
    :class:`StoreDataset` (``gaussian``: ``.mu``, ``.sigma``)."""
    return distribution_head(model(batch), batch["m"], batch["s"], distribution)


def crps_loss(model: nn.Module, batch: Batch, distribution: str = laws.DEFAULT) -> torch.Tensor:
    return CRPSLoss()(predict(model, batch, distribution), batch["y"])


SOLVERS = ("auto", "newton", "gradient")
FORMS = ("spread", "standard", "sh", "auto")  # auto: the candidates fitted, the lowest validation CRPS kept
# ``solver: auto`` fits a location-scale family's local EMOS (laws.Family.location_scale) by ``newton`` (ws10 at
# 5 deg, truncated normal: 10 s alone on 2 cores, within 2e-7 of scipy's per-point optimum on the test split). The
# censored shifted gamma keeps the gradient epochs under ``auto``: its mean is (m + shift) exp(a0 + a1 x_mean),
# and fitted to its optimum on a few training dates it extrapolates: on the 24-date 10 deg test store its
# validation CRPS was 1.17 against the raw members' 0.99 (one point 77 mm worse: a1 = 2 at a wet date), while 20
# gradient epochs from the raw ensemble beat the members. The tp24 preset, for stores of 128 training dates and
# more, names ``solver: newton`` (5 deg: 6.6e-4 below scipy's per-point fit on the test split, where 20 gradient
# epochs were 5e-3 above).


# --- architectures ------------------------------------------------------------------------------
@architecture("emos")
@dataclass(frozen=True)
class LocalEMOSArchitecture:
    """Local EMOS: 4 coefficients per grid point on the target's normalised ensemble mean and std."""

    solver: str = "auto"  # newton: full-batch fit to the CRPS optimum at fit start; gradient: the epochs' optimiser
    form: str = "spread"  # spread | standard | sh (csg) | auto (spread and the family's other, kept on validation)
    radii: tuple[int, ...] = ()  # pooling candidates: neighbours within these grid cells (models/emos_pool.py) ...
    weights: tuple[float, ...] = ()  # ... counted with these weights relative to a point's own dates
    shrink_radii: tuple[int, ...] = ()  # shrinkage candidates: towards the neighbours' coefficients within these
    shrink_weights: tuple[float, ...] = ()  # ... grid cells, at these penalty weights (models/emos_pool.py)
    season: bool = False  # the location's seasonal terms: sin and cos of the day of year (every form)

    def __post_init__(self) -> None:
        if self.solver not in SOLVERS:
            msg = f"model.net.solver {self.solver!r}: choose one of {list(SOLVERS)}"
            raise ConfigError(msg)
        if self.form not in FORMS:
            msg = f"model.net.form {self.form!r}: choose one of {list(FORMS)}"
            raise ConfigError(msg)
        if any(r < 1 for r in self.radii) or any(not 0.0 < w <= 1.0 for w in self.weights):
            msg = f"model.net radii {list(self.radii)} / weights {list(self.weights)}: radii >= 1, weights in (0, 1]"
            raise ConfigError(msg)
        if bool(self.radii) != bool(self.weights):
            msg = "model.net: pooling needs both radii and weights (e.g. radii: [1], weights: [0.25, 1.0]), or neither"
            raise ConfigError(msg)
        if any(r < 1 for r in self.shrink_radii) or any(not w > 0.0 for w in self.shrink_weights):
            msg = (
                f"model.net shrink_radii {list(self.shrink_radii)} / shrink_weights {list(self.shrink_weights)}: "
                "radii >= 1, weights > 0"
            )
            raise ConfigError(msg)
        if bool(self.shrink_radii) != bool(self.shrink_weights):
            msg = "model.net: shrinkage needs both shrink_radii and shrink_weights (e.g. [1] and [0.01]), or neither"
            raise ConfigError(msg)
        if (self.form != "spread" or self.radii or self.shrink_radii) and self.solver == "gradient":
            msg = "model.net: the standard form and pooling are fitted by the full-batch solver: set solver: newton"
            raise ConfigError(msg)

    def build(self, io: NetIO) -> nn.Module:
        if {"standard": 2, "sh": 3}.get(self.form, io.outputs) != io.outputs:  # the families' head outputs
            msg = f"model.net.form {self.form!r}: sh is the csg's form, standard the location-scale families' (or auto)"
            raise ConfigError(msg)
        if self.season and (io.season_channels is None or self.solver == "gradient"):
            msg = (
                "model.net.season: the seasonal terms need the season among the inputs "
                "(data.cfg.sample.season_features: true) and the newton solver"
            )
            raise ConfigError(msg)
        season = io.season_channels if self.season else None
        return LocalEMOS(io.grid, *io.target_channels, io.outputs, self.solver, self.form, season)


@architecture("emos_global", needs_members=True)
@dataclass(frozen=True)
class GlobalEMOSArchitecture:
    """The ENS-10 reference EMOS: M + 3 parameters for the whole globe (reads the members)."""

    def build(self, io: NetIO) -> nn.Module:
        return GlobalEMOS(io.n_members, io.target_variable, io.target_channels[1], io.outputs)


@architecture("mlp")
@dataclass(frozen=True)
class MLPArchitecture:
    """The ENS-10 pointwise MLP."""

    hidden: int = 128  # hidden units per layer
    layers: int = 1  # hidden layers (ReLU)
    embedding: int = 0  # learned numbers per grid point read as inputs (0: none; the model is then grid-free)
    smoothing: float = 0.0  # the embedding read through a Gaussian filter this many grid cells wide (0: none)

    def __post_init__(self) -> None:
        bad = {k: v for k, v in (("hidden", self.hidden), ("layers", self.layers)) if v < 1}
        if bad:
            msg = f"model.net (mlp) {bad}: hidden and layers must be >= 1"
            raise ConfigError(msg)
        check_embedding("mlp", self.embedding, self.smoothing)

    def build(self, io: NetIO) -> nn.Module:
        return PointwiseMLP(
            io.in_channels,
            self.hidden,
            io.outputs,
            layers=self.layers,
            grid=io.grid,
            embedding=self.embedding,
            smoothing=self.smoothing,
        )
