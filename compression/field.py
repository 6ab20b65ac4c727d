"""Neural-field compression: a coordinate network fitted to gridded fields (after Huang & Hoefler,
ICLR 2023; the recipe, what postcast changed and why, in docs/compression.md).

Inputs per point: (time, pressure, latitude, longitude); latitude/longitude go to the unit sphere
(x, y, z) so there is no seam or pole singularity. Three Gaussian Fourier-feature maps (time, level,
space; fixed matrices, sigma 1.6) plus a learned per-time-step embedding (init dates a week apart are
nearly independent fields; the table interpolates linearly between dates) feed a residual GELU MLP
with one output per variable. Targets are normalised per (variable, level) by mean and std.
Training points are scrambled-Sobol draws uniform *on the sphere*, continuous in time, so the plain
mean squared error over them is an area-weighted loss; targets are the trilinear (time, lat, lon)
interpolant of the grid. After training the weights are stored in fp16 (or int8 per tensor, or
N-bit per output channel, optionally lzma-coded) and every reported error is measured after that cast.

Core functions take and return ``xr.Dataset`` / tensors: :func:`fit` (dataset -> artefact) and
:meth:`postcast.compression.artefact.Artefact.decode` (artefact -> dataset).
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import xarray as xr
from torch import nn
from tqdm.auto import tqdm

from postcast.datasets import schema
from postcast.datasets.core.errors import BadInputError, ConfigError
from postcast.models import kernels

log = logging.getLogger(__name__)
WEIGHT_FORMATS = ("fp16", "int8", "fp32", "q8", "q6", "q4")  # qN: N-bit per output channel (rows)
ENTROPY_CODECS = ("none", "lzma")


@dataclass(frozen=True)
class FieldConfig:
    """How to fit the network (travels in the artefact)."""

    width: int = 48
    depth: int = 3  # residual blocks
    sigma: float = 1.6  # std of the Fourier matrices
    time_features: int = 8
    level_features: int = 8
    space_features: int = 64
    time_embedding: bool = True  # learned per-time-step table (T x width)
    steps: int = 2000
    batch_points: int = 8192
    lr: float = 5e-3
    seed: int = 0
    weights: str = "fp16"  # fp16 | int8 (per tensor) | fp32 | q8/q6/q4 (per row, N bits): stored weights
    entropy: str = "none"  # none | lzma: lossless coding of the artefact's header and arrays
    error_bound: float | None = None  # absolute max error (data units) guaranteed by an SZ3 residual layer
    error_bounds: dict[str, float] = field(default_factory=dict)  # per variable, overriding error_bound
    # max abs error as a fraction of each variable's spread (the smallest cos-latitude weighted std over
    # its levels), for variables without an absolute bound: 0.1 keeps every weighted RMSE / std <= 0.1
    error_bound_std: float | None = None

    def __post_init__(self) -> None:
        if self.weights not in WEIGHT_FORMATS:
            msg = f"weights={self.weights!r}: use one of {WEIGHT_FORMATS}"
            raise ConfigError(msg)
        if self.entropy not in ENTROPY_CODECS:
            msg = f"entropy={self.entropy!r}: use one of {ENTROPY_CODECS}"
            raise ConfigError(msg)
        for name in ("width", "depth", "steps", "batch_points", "space_features"):
            if getattr(self, name) < 1:
                msg = f"{name}={getattr(self, name)} must be >= 1"
                raise ConfigError(msg)
        for name in ("sigma", "lr"):
            if not _positive_finite(getattr(self, name)):
                msg = f"{name}={getattr(self, name)}: give a positive finite number"
                raise ConfigError(msg)
        if self.error_bound is not None and not _positive_finite(self.error_bound):
            msg = (
                f"error_bound={self.error_bound}: give a positive absolute bound (a finite number) in data "
                "units, or none"
            )
            raise ConfigError(msg)
        if self.error_bound_std is not None and not (
            _positive_finite(self.error_bound_std) and self.error_bound_std < 1
        ):
            msg = (
                f"error_bound_std={self.error_bound_std}: give a fraction of each field's standard deviation "
                "in (0, 1), e.g. 0.1, or none"
            )
            raise ConfigError(msg)
        bad = {k: v for k, v in self.error_bounds.items() if not _positive_finite(v)}
        if bad:
            msg = f"error_bounds {bad}: give positive absolute bounds (finite numbers) in each variable's units"
            raise ConfigError(msg)

    def bounds_for(self, variables: list[str], spreads: list[float] | None = None) -> list[float | None]:
        """The guaranteed max abs error of each variable (None: the network alone): its own bound, else
        ``error_bound``, else ``error_bound_std`` times its spread (``spreads``, in data units)."""
        unknown = sorted(set(self.error_bounds) - set(variables))
        if unknown:
            msg = f"error_bounds names {unknown}, which are not among the compressed variables {variables}"
            raise ConfigError(msg)
        relative: list[float | None] = [None] * len(variables)
        if self.error_bound_std is not None and spreads is not None:
            relative = [self.error_bound_std * s if s > 0 else None for s in spreads]
        return [
            float(self.error_bounds[v])
            if v in self.error_bounds
            else self.error_bound
            if self.error_bound is not None
            else rel
            for v, rel in zip(variables, relative, strict=True)
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _positive_finite(value: object) -> bool:
    """A usable error bound: a real number in (0, inf) (0, NaN and inf promise nothing)."""
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


# --- the network -----------------------------------------------------------------------------------
def fourier_matrix(cfg: FieldConfig) -> torch.Tensor:
    """Block-structured B (5, F): row 0 time -> time features, row 1 pressure -> level features,
    rows 2-4 (x, y, z) -> space features; N(0, sigma^2), reproducible from the seed."""
    g = torch.Generator().manual_seed(cfg.seed)
    ft, fl, fs = cfg.time_features, cfg.level_features, cfg.space_features
    b = torch.zeros(5, ft + fl + fs)
    b[0, :ft] = torch.randn(ft, generator=g) * cfg.sigma
    b[1, ft : ft + fl] = torch.randn(fl, generator=g) * cfg.sigma
    b[2:, ft + fl :] = torch.randn(3, fs, generator=g) * cfg.sigma
    return b


class ResBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.lin2(F.gelu(self.lin1(F.gelu(h))))


class FieldNet(nn.Module):
    """coords (N, 5) = (t, p, x, y, z) and time index (N,) float -> normalised values (N, V)."""

    def __init__(self, cfg: FieldConfig, n_out: int, n_times: int):
        super().__init__()
        self.bmat: torch.Tensor
        self.register_buffer("bmat", fourier_matrix(cfg))
        self.first = nn.Linear(2 * self.bmat.shape[1], cfg.width)
        self.embed = nn.Parameter(torch.zeros(n_times, cfg.width)) if cfg.time_embedding else None
        self.blocks = nn.ModuleList([ResBlock(cfg.width) for _ in range(cfg.depth)])
        self.head = nn.Linear(cfg.width, n_out)

    def forward(self, coords: torch.Tensor, t_index: torch.Tensor) -> torch.Tensor:
        h = kernels.fourier_layer(coords, self.bmat, self.first.weight, self.first.bias)  # (N, width)
        if self.embed is not None:
            i0 = t_index.floor().clamp(0, self.embed.shape[0] - 1)
            i1 = (i0 + 1).clamp(max=self.embed.shape[0] - 1)
            frac = (t_index - i0).unsqueeze(-1)
            # F.embedding, not self.embed[idx]: advanced indexing's backward is a parallel scatter-add
            # whose float sums depend on thread timing, so two fits with one seed would differ
            h = h + (1 - frac) * F.embedding(i0.long(), self.embed) + frac * F.embedding(i1.long(), self.embed)
        for block in self.blocks:
            h = block(h)
        out: torch.Tensor = self.head(F.gelu(h))
        return out


# --- coordinates and data --------------------------------------------------------------------------
def sphere(lat_deg: torch.Tensor, lon_deg: torch.Tensor) -> torch.Tensor:
    """(N,) degrees -> (N, 3) unit vectors."""
    phi, lam = torch.deg2rad(lat_deg), torch.deg2rad(lon_deg)
    return torch.stack([torch.cos(phi) * torch.cos(lam), torch.cos(phi) * torch.sin(lam), torch.sin(phi)], -1)


def coordinates(
    t_index: torch.Tensor, n_times: int, pressure: torch.Tensor, lat: torch.Tensor, lon: torch.Tensor
) -> torch.Tensor:
    """Network inputs (N, 5): time scaled to [0, 1], pressure / 1000 hPa, and the sphere point."""
    t = t_index / max(n_times - 1, 1)
    return torch.cat([t.unsqueeze(-1), (pressure / 1000.0).unsqueeze(-1), sphere(lat, lon)], -1)


@dataclass
class Fields:
    """Gridded fields in canonical form: data (V, T, L, H, W) float32 with latitude ascending."""

    data: np.ndarray
    variables: list[str]
    units: list[str]
    times: np.ndarray  # (T,) datetime64[ns] or numbers
    time_dim: str
    levels: np.ndarray  # (L,) hPa; NaN for a single surface "level"
    lat: np.ndarray  # (H,) ascending degrees
    lon: np.ndarray  # (W,) degrees, regular, covering the circle


def to_fields(ds: xr.Dataset, variables: list[str] | None = None) -> Fields:
    """The canonical form of ``ds``'s variables (dims: one time-like dim, optional level, lat, lon)."""
    names = variables or [str(v) for v in ds.data_vars]
    missing = [v for v in names if v not in ds]
    if missing:
        msg = f"variables {missing} are not in the dataset; it has {list(ds.data_vars)}"
        raise BadInputError(msg)
    arrays, time_dim = [], None
    levels = np.array([np.nan])
    for name in names:
        da = ds[name]
        own = _time_dim(da, name)
        if time_dim not in (None, own):
            msg = f"variables disagree on the time dim ({time_dim!r} vs {own!r})"
            raise BadInputError(msg)
        time_dim = own
        if schema.LEVEL in da.dims:
            levels = da[schema.LEVEL].values.astype(np.float64)
        else:
            da = da.expand_dims({schema.LEVEL: 1})
        arrays.append(da.transpose(time_dim, schema.LEVEL, schema.LAT, schema.LON).values.astype(np.float32))
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        msg = f"variables have different shapes {shapes}: compress them separately"
        raise BadInputError(msg)
    data = np.stack(arrays)
    _check_gap_free(names, arrays)
    lat, lon = ds[schema.LAT].values.astype(np.float64), ds[schema.LON].values.astype(np.float64)
    if lat[0] > lat[-1]:
        lat, data = lat[::-1].copy(), data[..., ::-1, :].copy()
    dlon = np.diff(lon)
    if lon.size > 1 and not np.allclose(dlon, 360.0 / lon.size):
        msg = "longitudes must be a regular grid covering the circle (e.g. 0, 0.5, ..., 359.5)"
        raise BadInputError(msg)
    assert time_dim is not None
    return Fields(
        data,
        names,
        [str(ds[v].attrs.get("units", "")) for v in names],
        ds[time_dim].values,
        str(time_dim),
        levels,
        lat,
        lon,
    )


def _time_dim(da: xr.DataArray, name: str) -> str:
    """The one time-like dim of the variable ``name`` beside latitude, longitude and an optional level."""
    other = [d for d in da.dims if d not in (schema.LAT, schema.LON, schema.LEVEL)]
    if len(other) != 1 or schema.LAT not in da.dims or schema.LON not in da.dims:
        msg = (
            f"variable {name!r} has dims {da.dims}: compress fields with one time-like dim, an optional "
            f"{schema.LEVEL!r} dim, {schema.LAT!r} and {schema.LON!r} (select members/steps first)"
        )
        raise BadInputError(msg)
    return str(other[0])


def _check_gap_free(names: list[str], arrays: list[np.ndarray]) -> None:
    """BadInputError naming each variable with NaN or inf, and its share: a neural field fits gap-free fields."""
    gaps = [
        f"{n} ({100 * np.mean(~np.isfinite(a)):.0f}%)"
        for n, a in zip(names, arrays, strict=True)
        if not np.isfinite(a).all()
    ]
    if gaps:
        msg = (
            f"NaN or inf in {', '.join(gaps)}: a neural field fits gap-free fields; "
            "compress other variables, or fill the gaps first"
        )
        raise BadInputError(msg)


def interpolate(
    grid: torch.Tensor, lat: np.ndarray, t: torch.Tensor, level: torch.Tensor, la: torch.Tensor, lo: torch.Tensor
) -> torch.Tensor:
    """Trilinear interpolant of grid (V, T, L, H, W) at continuous time index t, level index, lat, lon
    (N,) each -> (N, V). Latitude ascending (any spacing); longitude regular and periodic."""
    n_t, n_w = grid.shape[1], grid.shape[4]
    lat_t = torch.as_tensor(lat, dtype=la.dtype)
    i = torch.searchsorted(lat_t, la.contiguous()).clamp(1, lat_t.numel() - 1)
    wy = ((la - lat_t[i - 1]) / (lat_t[i] - lat_t[i - 1])).clamp(0, 1)
    x = lo / (360.0 / n_w)
    j0 = x.floor().long() % n_w
    wx = x - x.floor()
    t0 = t.floor().long().clamp(0, n_t - 1)
    wt = (t - t0).clamp(0, 1)
    t1 = (t0 + 1).clamp(max=n_t - 1)
    out = torch.zeros(la.numel(), grid.shape[0], dtype=grid.dtype)
    for ti, wti in ((t0, 1 - wt), (t1, wt)):
        for yi, wyi in ((i - 1, 1 - wy), (i, wy)):
            for xi, wxi in ((j0, 1 - wx), ((j0 + 1) % n_w, wx)):
                out += (wti * wyi * wxi).unsqueeze(-1) * grid[:, ti, level, yi, xi].T
    return out


def sample_points(
    engine: torch.quasirandom.SobolEngine, n: int, n_times: int, n_levels: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """n points: time index in [0, T-1], level index, latitude uniform on the sphere, longitude."""
    u = engine.draw(n).to(torch.float32)  # (n, 3)
    t = u[:, 0] * max(n_times - 1, 0)
    lat = 90.0 - torch.rad2deg(torch.acos((1 - 2 * u[:, 1]).clamp(-1, 1)))
    lon = u[:, 2] * 360.0
    level = torch.randint(0, n_levels, (n,), generator=gen)
    return t, level, lat, lon


# --- fitting ---------------------------------------------------------------------------------------
def normalisation(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per (variable, level) mean and std of data (V, T, L, H, W) -> (V, L) each (std floored)."""
    mean = data.mean(axis=(1, 3, 4))
    std = data.std(axis=(1, 3, 4))
    return mean.astype(np.float32), np.maximum(std, 1e-6 * np.maximum(np.abs(mean), 1.0)).astype(np.float32)


def train_network(fields: Fields, cfg: FieldConfig, progress: bool = True) -> tuple[FieldNet, np.ndarray, np.ndarray]:
    """Fit a FieldNet to ``fields``; returns (network in fp32, mean, std)."""
    torch.manual_seed(cfg.seed)
    mean, std = normalisation(fields.data)
    norm = (fields.data - mean[:, None, :, None, None]) / std[:, None, :, None, None]
    grid = torch.from_numpy(np.ascontiguousarray(norm))  # (V, T, L, H, W)
    n_v, n_t, n_l = grid.shape[:3]
    net = FieldNet(cfg, n_v, n_t)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    warm = max(1, cfg.steps // 20)  # linear warm-up, then cosine decay to zero
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, cfg.steps - warm))),
    )
    engine = torch.quasirandom.SobolEngine(3, scramble=True, seed=cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    pressure = torch.from_numpy(np.nan_to_num(fields.levels, nan=0.0).astype(np.float32))
    bar = tqdm(range(cfg.steps), desc="fit neural field", disable=not progress, mininterval=2.0)
    for _ in bar:
        t, lv, la, lo = sample_points(engine, cfg.batch_points, n_t, n_l, gen)
        target = interpolate(grid, fields.lat, t, lv, la, lo)  # (N, V)
        pred = net(coordinates(t, n_t, pressure[lv], la, lo), t)
        loss = F.mse_loss(pred, target)  # sphere-uniform points: an area-weighted mean
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        opt.step()
        sched.step()
        bar.set_postfix(rmse=f"{math.sqrt(loss.item()):.4f}", refresh=False)
    return net.eval(), mean, std


def quantise(tensor: torch.Tensor, fmt: str) -> tuple[dict[str, np.ndarray], torch.Tensor]:
    """Stored arrays for one weight tensor and the fp32 tensor the decoder will see.

    ``int8``: one symmetric scale per matrix; ``q8``/``q6``/``q4``: one fp16 scale per output row
    (per channel) and integers in [-(2^(N-1) - 1), 2^(N-1) - 1] stored as int8 (the artefact's lossless
    coding squeezes the unused bits). Vectors (biases) stay fp16."""
    if fmt == "fp32":
        a = tensor.detach().float().numpy()
        return {"": a}, torch.from_numpy(a)
    if fmt == "fp16" or tensor.dim() < 2:
        h = tensor.detach().half().numpy()
        return {"": h}, torch.from_numpy(h.astype(np.float32))
    w = tensor.detach().float()  # (out, in)
    if fmt == "int8":
        scale = max(float(w.abs().max()) / 127.0, 1e-12)
        q = torch.round(w / scale).clamp(-127, 127).to(torch.int8).numpy()
        return {"": q, ".scale": np.array([scale], np.float32)}, torch.from_numpy(q.astype(np.float32) * scale)
    qmax = 2 ** (int(fmt[1:]) - 1) - 1
    rows = torch.from_numpy((w.abs().amax(dim=1) / qmax).clamp(min=1e-8).half().numpy().astype(np.float32))  # (out,)
    q = torch.round(w / rows[:, None]).clamp(-qmax, qmax).to(torch.int8).numpy()
    back = q.astype(np.float32) * rows.numpy()[:, None]
    return {"": q, ".scale": rows.numpy().astype(np.float16)}, torch.from_numpy(back)


def dequantise(q: np.ndarray, scale: np.ndarray | None) -> np.ndarray:
    """The fp32 weights of the arrays :func:`quantise` stored (scale: one per tensor, or one per row)."""
    arr = q.astype(np.float32)
    if scale is None:
        return arr
    s = scale.astype(np.float32)
    return arr * (s[0] if s.size == 1 else s.reshape(-1, *([1] * (arr.ndim - 1))))
