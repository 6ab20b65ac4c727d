"""The compressed artefact: one self-describing file that alone reproduces the decode.

The file is a JSON header and named raw arrays in the container of :mod:`postcast.compression.container`
(its byte layout, checksum and codec; a damaged file is its ``ArtefactError``). The header holds the
format version, the :class:`FieldConfig`, variable names and units, the time axis, levels, the grid (a
regular-grid spec, or the latitudes when irregular), the per-(variable, level) normalisation, the measured
error summary and, in the error-bounded mode, the SZ3 residual layer and the exact fix-ups. The
compression ratio is raw float32 bytes over the file's size.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from postcast.compression import container, field, sz3
from postcast.compression.field import FieldConfig, FieldNet, Fields
from postcast.datasets import io, schema
from postcast.datasets.core.errors import ConfigError

DECODE_POINTS = 65536  # points per decoder batch (fixed: the error-bounded layer relies on a repeatable decode)


MAX_REGRID_BYTES = 16 * 2**30  # a regridded decode larger than this (float32) is refused before allocating


def check_resolution(resolution: float, shape: Sequence[int]) -> None:
    """Refuse a regridding resolution that is not a number in (0, 90] degrees, or whose output
    (``shape`` = variables, times, levels on that grid, float32) would exceed :data:`MAX_REGRID_BYTES`."""
    if not math.isfinite(resolution) or not 0 < resolution <= 90:
        msg = f"--resolution {resolution}: give degrees in (0, 90], e.g. 1.0"
        raise ConfigError(msg)
    n_lat, n_lon = round(180 / resolution) + 1, round(360 / resolution)  # as _regular builds them
    need = 4 * math.prod(int(n) for n in shape) * n_lat * n_lon
    if need > MAX_REGRID_BYTES:
        msg = (
            f"--resolution {resolution}: the decoded fields would take {need / 2**30:.0f} GiB (limit "
            f"{MAX_REGRID_BYTES / 2**30:.0f} GiB); choose a coarser resolution"
        )
        raise ConfigError(msg)


@dataclass
class Artefact:
    header: dict[str, Any]
    arrays: dict[str, np.ndarray]
    path: str | None = None
    fit_seconds: float | None = dc_field(default=None, compare=False)  # wall clock of the fit (not stored)
    _residual_cache: list[np.ndarray] = dc_field(default_factory=list, repr=False, compare=False)

    # --- construction ------------------------------------------------------------------------------
    @classmethod
    def build(cls, fields: Fields, cfg: FieldConfig, progress: bool = True) -> Artefact:
        """Fit the network, quantise its weights, measure the errors and (optionally) add the residual layer."""
        t0 = time.perf_counter()
        net, mean, std = field.train_network(fields, cfg, progress)
        return cls.from_network(fields, cfg, net, mean, std, time.perf_counter() - t0)

    @classmethod
    def from_network(
        cls,
        fields: Fields,
        cfg: FieldConfig,
        net: FieldNet,
        mean: np.ndarray,
        std: np.ndarray,
        fit_seconds: float | None = None,
    ) -> Artefact:
        """The artefact of a trained fp32 network stored as ``cfg`` says (weights format, lossless
        coding, error bounds): one fit, many storage settings. Errors are measured after the cast."""
        arrays: dict[str, np.ndarray] = {"norm.mean": mean, "norm.std": std}
        for name, tensor in net.state_dict().items():
            if name == "bmat":
                continue  # stored below: its non-zero blocks only
            stored, _ = field.quantise(tensor, cfg.weights)
            for suffix, arr in stored.items():
                arrays[f"w.{name}{suffix}"] = arr
        b = net.bmat.numpy()
        ft, fl = cfg.time_features, cfg.level_features
        arrays["fourier.time"], arrays["fourier.level"] = b[0, :ft], b[1, ft : ft + fl]
        arrays["fourier.space"] = b[2:, ft + fl :]
        times = fields.times
        is_time = np.issubdtype(times.dtype, np.datetime64)
        header: dict[str, Any] = {
            "format_version": container.FORMAT_VERSION,
            "config": cfg.to_dict(),
            "variables": fields.variables,
            "units": fields.units,
            "time_dim": fields.time_dim,
            "times": [str(t) for t in times.astype("datetime64[s]")] if is_time else [float(t) for t in times],
            "times_are_datetimes": bool(is_time),
            "levels": [None if math.isnan(v) else float(v) for v in fields.levels],
            "grid": grid_spec(fields.lat, fields.lon),
            "shape": list(fields.data.shape),
        }
        art = cls(header, arrays)
        art.fit_seconds = fit_seconds  # not in the header: the artefact's bytes depend on the data and settings only
        decoded = art.decode_array()
        bounds = cfg.bounds_for(fields.variables, spreads(fields.data, fields.lat))
        if any(b is not None for b in bounds):
            art.add_residual_layer(fields.data, decoded, bounds)
            decoded = art.decode_array()
        art.header["errors"] = error_summary(fields.data, decoded, fields.lat)
        return art

    def with_error_bounds(self, fields: Fields, bounds: dict[str, float]) -> Artefact:
        """A copy of this network-only artefact with a residual layer guaranteeing ``bounds`` (per
        variable, data units) on ``fields`` (the data it was fitted to): no refit."""
        if "residual.fix_index" in self.arrays:
            msg = "this artefact already has a residual layer: start from the network-only artefact"
            raise ConfigError(msg)
        cfg = FieldConfig(**{**self.header["config"], "error_bounds": dict(bounds)})
        art = Artefact(
            {**self.header, "config": cfg.to_dict(), "format_version": container.FORMAT_VERSION}, dict(self.arrays)
        )
        art.add_residual_layer(
            fields.data, self.decode_array(), cfg.bounds_for(fields.variables, spreads(fields.data, fields.lat))
        )
        art.header["errors"] = error_summary(fields.data, art.decode_array(), fields.lat)
        return art

    def add_residual_layer(self, data: np.ndarray, decoded: np.ndarray, bounds: list[float | None]) -> None:
        """Per variable with a bound: SZ3 on the network's residual at 0.99 x the bound, then exact
        fix-ups wherever the sum still misses it, so that max |decoded - data| <= bound holds at every
        point of that variable. Variables without a bound keep the network's decode."""
        resid = (data - decoded).astype(np.float32)  # (V, T, L, H, W)
        miss = np.zeros(data.shape, bool)
        for v, bound in enumerate(bounds):
            if bound is None:
                continue
            blob = sz3.encode(resid[v], 0.99 * bound)
            back = sz3.decode(blob, resid[v].shape)
            self.arrays[f"residual.sz3.{v}"] = blob
            miss[v] = np.abs((decoded[v] + back) - data[v]) > 0.99 * bound
        bad = np.flatnonzero(miss.ravel())
        self.arrays["residual.fix_index"] = bad.astype(np.int64)
        self.arrays["residual.fix_value"] = data.ravel()[bad].astype(np.float32)
        shared = set(bounds)
        self.header["residual"] = {
            "bound": shared.pop() if len(shared) == 1 else None,
            "bounds": bounds,
            "codec": "sz3-abs",
            "sz3_factor": 0.99,
            "fixups": int(bad.size),
        }
        self._residual_cache.clear()

    # --- file i/o ----------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        return container.pack(self.header, self.arrays)

    def save(self, path: str | os.PathLike[str]) -> int:
        """Write atomically; returns the file size in bytes."""
        data = self.to_bytes()
        with io.atomic_path(path) as tmp:
            tmp.write_bytes(data)
        self.path = str(path)
        return len(data)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Artefact:
        p = Path(path)
        if not p.is_file():
            msg = f"{p}: no such artefact (write one with `postcast compress`)"
            raise FileNotFoundError(msg)
        art = cls.from_bytes(p.read_bytes(), str(p))
        art.path = str(p)
        return art

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "artefact") -> Artefact:
        return cls(*container.unpack(data, name), name)

    @property
    def nbytes(self) -> int:
        return len(self.to_bytes())

    @property
    def raw_bytes(self) -> int:
        """Size of the fields as float32 (the uncompressed reference of the ratio)."""
        return 4 * math.prod(self.header["shape"])

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.nbytes

    # --- decoding ----------------------------------------------------------------------------------
    @property
    def config(self) -> FieldConfig:
        return FieldConfig(**self.header["config"])

    def network(self) -> FieldNet:
        """The decoder network (eval mode, fp32) from the stored arrays alone."""
        cfg = self.config
        n_v, n_t = self.header["shape"][0], self.header["shape"][1]
        net = FieldNet(cfg, n_v, n_t)
        state: dict[str, torch.Tensor] = {}
        for name in net.state_dict():
            if name == "bmat":
                continue
            arr = field.dequantise(self.arrays[f"w.{name}"], self.arrays.get(f"w.{name}.scale"))
            state[name] = torch.from_numpy(arr)
        b = torch.zeros_like(net.bmat)
        ft, fl = cfg.time_features, cfg.level_features
        b[0, :ft] = torch.from_numpy(self.arrays["fourier.time"].copy())
        b[1, ft : ft + fl] = torch.from_numpy(self.arrays["fourier.level"].copy())
        b[2:, ft + fl :] = torch.from_numpy(self.arrays["fourier.space"].copy())
        state["bmat"] = b
        net.load_state_dict(state)
        return net.eval()

    def lat_lon(self) -> tuple[np.ndarray, np.ndarray]:
        return grid_arrays(self.header["grid"])

    def _denormalise(self, pred: torch.Tensor, level_index: torch.Tensor) -> np.ndarray:
        mean = torch.from_numpy(self.arrays["norm.mean"].astype(np.float32))  # (V, L)
        std = torch.from_numpy(self.arrays["norm.std"].astype(np.float32))
        return (pred * std[:, level_index].T + mean[:, level_index].T).numpy()  # (N, V)

    @torch.inference_mode()
    def decode_points(
        self,
        t_index: np.ndarray,
        level_index: np.ndarray,
        lat: np.ndarray,
        lon: np.ndarray,
        net: FieldNet | None = None,
    ) -> np.ndarray:
        """Values at arbitrary points (time index may be fractional; lat/lon in degrees, any grid):
        (N,) each -> (V, N). The network part only (no residual layer: that lives on the grid)."""
        net = net or self.network()
        n_t = self.header["shape"][1]
        pressure = np.nan_to_num(np.array(self.header["levels"], dtype=np.float64), nan=0.0)
        t = torch.as_tensor(np.asarray(t_index, np.float32))
        lv = torch.as_tensor(np.asarray(level_index, np.int64))
        la = torch.as_tensor(np.asarray(lat, np.float32))
        lo = torch.as_tensor(np.asarray(lon, np.float32))
        out = np.empty((t.numel(), len(self.header["variables"])), np.float32)
        p = torch.as_tensor(pressure.astype(np.float32))
        for s in range(0, t.numel(), DECODE_POINTS):
            sl = slice(s, s + DECODE_POINTS)
            coords = field.coordinates(t[sl], n_t, p[lv[sl]], la[sl], lo[sl])
            out[sl] = self._denormalise(net(coords, t[sl]), lv[sl])
        return out.T

    def decode_array(self, times: list[int] | None = None, levels: list[int] | None = None) -> np.ndarray:
        """Whole (time, level) slices on the stored grid -> (V, T', L', H, W) float32, including the
        error-bounded layer when present."""
        n_v, n_t, n_l, n_h, n_w = self.header["shape"]
        ti = list(range(n_t)) if times is None else list(times)
        li = list(range(n_l)) if levels is None else list(levels)
        lat, lon = self.lat_lon()
        la, lo = np.meshgrid(lat, lon, indexing="ij")
        net = self.network()
        out = np.empty((n_v, len(ti), len(li), n_h, n_w), np.float32)
        for a, t in enumerate(ti):
            for b, lv in enumerate(li):
                vals = self.decode_points(np.full(la.size, t), np.full(la.size, lv), la.ravel(), lo.ravel(), net)
                out[:, a, b] = vals.reshape(n_v, n_h, n_w)
        if "residual.fix_index" in self.arrays:
            out += self._residual()[:, ti][:, :, li]
            flat = np.zeros((n_v, n_t, n_l, n_h, n_w), bool).ravel()
            flat[self.arrays["residual.fix_index"]] = True
            mask = flat.reshape(n_v, n_t, n_l, n_h, n_w)[:, ti][:, :, li]
            exact = np.zeros(n_v * n_t * n_l * n_h * n_w, np.float32)
            exact[self.arrays["residual.fix_index"]] = self.arrays["residual.fix_value"]
            out[mask] = exact.reshape(n_v, n_t, n_l, n_h, n_w)[:, ti][:, :, li][mask]
        return out

    def _residual(self) -> np.ndarray:
        """The SZ3 residual layer, (V, T, L, H, W); decompressed once per artefact object."""
        if self._residual_cache:
            return self._residual_cache[0]
        shape = tuple(self.header["shape"])
        if "residual.sz3" in self.arrays:  # format 1: one stream for all variables
            out = sz3.decode(self.arrays["residual.sz3"], shape)
        else:
            out = np.zeros(shape, np.float32)
            for v in range(shape[0]):
                if f"residual.sz3.{v}" in self.arrays:
                    out[v] = sz3.decode(self.arrays[f"residual.sz3.{v}"], shape[1:])
        self._residual_cache.append(out)
        return out

    def regrid(self, resolution: float) -> xr.Dataset:
        """Every (time, level) slice decoded on a regular ``resolution``-degree grid (network only)."""
        check_resolution(resolution, self.header["shape"][:3])
        lat, lon = _regular(resolution)
        la, lo = np.meshgrid(lat, lon, indexing="ij")
        n_v, n_t, n_l = self.header["shape"][:3]
        net = self.network()
        arr = np.empty((n_v, n_t, n_l, lat.size, lon.size), np.float32)
        for t in range(n_t):
            for lv in range(n_l):
                vals = self.decode_points(np.full(la.size, t), np.full(la.size, lv), la.ravel(), lo.ravel(), net)
                arr[:, t, lv] = vals.reshape(n_v, lat.size, lon.size)
        return self._dataset(arr, None, lat, lon)

    def decode(self, times: list[int] | None = None) -> xr.Dataset:
        """The decoded fields as a dataset with the source's names, dims and units."""
        lat, lon = self.lat_lon()
        return self._dataset(self.decode_array(times), times, lat, lon)

    def _dataset(self, arr: np.ndarray, times: list[int] | None, lat: np.ndarray, lon: np.ndarray) -> xr.Dataset:
        h = self.header
        tvals = np.array(h["times"], dtype="datetime64[ns]") if h["times_are_datetimes"] else np.array(h["times"])
        if times is not None:
            tvals = tvals[times]
        levels = h["levels"]
        ds = xr.Dataset(coords={h["time_dim"]: tvals, schema.LAT: lat, schema.LON: lon})
        for i, (name, units) in enumerate(zip(h["variables"], h["units"], strict=True)):
            if levels == [None]:
                ds[name] = ((h["time_dim"], schema.LAT, schema.LON), arr[i, :, 0], {"units": units})
            else:
                ds = ds.assign_coords({schema.LEVEL: np.array(levels)})
                ds[name] = ((h["time_dim"], schema.LEVEL, schema.LAT, schema.LON), arr[i], {"units": units})
        ds.attrs["postcast_compressed_from"] = json.dumps(h.get("selection") or h.get("source") or {})
        ds.attrs["postcast_compression_ratio"] = round(self.ratio, 2)
        return ds


def _regular(resolution: float) -> tuple[np.ndarray, np.ndarray]:
    n_lat = round(180.0 / resolution) + 1
    return np.linspace(-90.0, 90.0, n_lat), np.arange(round(360.0 / resolution)) * resolution


def grid_spec(lat: np.ndarray, lon: np.ndarray) -> dict[str, Any]:
    """A compact description of the grid (regular grids need 6 numbers)."""
    spec: dict[str, Any] = {"lon0": float(lon[0]), "nlon": int(lon.size)}
    dl = np.diff(lat)
    if lat.size > 1 and np.allclose(dl, dl[0]):
        spec.update(lat0=float(lat[0]), dlat=float(dl[0]), nlat=int(lat.size))
    else:
        spec["lat"] = [float(v) for v in lat]
    return spec


def grid_arrays(spec: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    lon = spec["lon0"] + np.arange(spec["nlon"]) * (360.0 / spec["nlon"])
    lat = np.array(spec["lat"]) if "lat" in spec else spec["lat0"] + np.arange(spec["nlat"]) * spec["dlat"]
    return lat, lon


def error_summary(data: np.ndarray, decoded: np.ndarray, lat: np.ndarray) -> dict[str, Any]:
    """Per variable: cos-latitude weighted RMSE, MAE, max abs error, PSNR (data range), and the largest
    weighted RMSE / weighted std over its levels (``wrmse_over_std``: 1 is no better than the field's
    mean; the quickstart asks for at most 0.1)."""
    from postcast.compression.metrics import field_errors, relative_wrmse

    return {
        f"var{i}": {
            **field_errors(data[i], decoded[i], lat),
            "wrmse_over_std": relative_wrmse(data[i], decoded[i], lat),
        }
        for i in range(data.shape[0])
    }


def spreads(data: np.ndarray, lat: np.ndarray) -> list[float]:
    """Each variable's spread for relative error bounds: its smallest weighted std over levels
    (data (V, T, L, H, W), data units)."""
    from postcast.compression.metrics import weighted_std

    return [float(min(weighted_std(data[v][:, lv], lat) for lv in range(data.shape[2]))) for v in range(data.shape[0])]


def write_decoded(ds: xr.Dataset, out: str | os.PathLike[str]) -> None:
    """Write decoded fields as zarr (``out`` ending in .zarr) or netCDF, atomically: built under a
    temporary sibling and renamed into place when whole, so that a failed write (a full disk) leaves
    nothing at ``out`` that a reader would open as the decoded fields."""
    if str(out).endswith(".zarr"):
        with io.atomic_path(out) as tmp:
            io.write_zarr(ds, tmp)
    else:
        io.write_netcdf(ds, out)  # atomic itself


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The header of an artefact without decoding (inspect)."""
    return Artefact.load(path).header


__all__ = ["Artefact", "grid_arrays", "grid_spec", "read_header", "write_decoded"]
