"""Selecting fields to compress, and the comparison table of neural artefacts against SZ3 and ZFP on
the same arrays (used by ``postcast compress-report`` and ``benchmarks/compression.py``)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from postcast.compression import baselines
from postcast.compression.artefact import Artefact
from postcast.compression.field import Fields, to_fields
from postcast.compression.metrics import field_errors
from postcast.datasets import contract, io, schema
from postcast.datasets.core.errors import BadInputError, ConfigError, MissingInputError
from postcast.datasets.sources import conventions


@dataclass(frozen=True)
class Selection:
    """Which fields of a source file to compress (recorded in the artefact, so reports can reopen it)."""

    source: str
    variables: tuple[str, ...]
    levels: tuple[int, ...] = ()
    step_h: int | None = 48  # lead time to take when the source has a step dim
    member: str = "mean"  # "mean" (ensemble mean) or a member index, when the source has a member dim

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "variables": list(self.variables),
            "levels": list(self.levels),
            "step_h": self.step_h,
            "member": self.member,
        }


def open_source(path: str | os.PathLike[str]) -> xr.Dataset:
    p = Path(path)
    if not p.exists():
        msg = f"{p}: no such file or store"
        raise FileNotFoundError(msg)
    if p.is_dir() or p.suffix == ".zarr":
        return io.open_zarr(p)
    with io.NETCDF_LOCK:  # any engine xarray picks for the file (netCDF4 needs the lock; cfgrib takes it)
        raw = xr.open_dataset(p)
    try:  # forecasts in any layout (cfgrib, CDS, WeatherBench 2) -> postcast's names, dims and units
        return conventions.normalise(raw, source=str(p))
    except MissingInputError:  # no ENS-10 variable: fields under their own names
        return raw


def select(sel: Selection) -> xr.Dataset:
    """The selected fields as (time, [level], lat, lon) variables, loaded."""
    ds = open_source(sel.source)
    missing = [v for v in sel.variables if v not in ds]
    if missing:
        msg = f"{sel.source}: no variables {missing}; it has {sorted(map(str, ds.data_vars))}"
        raise MissingInputError(msg)
    out = ds[list(sel.variables)]
    if schema.STEP in out.dims:
        if sel.step_h is None:
            msg = "the source has lead times: pass --step-hours"
            raise ConfigError(msg)
        out = out.isel({schema.STEP: contract.step_position(out.get_index(schema.STEP), sel.step_h, "--step-hours")})
    if schema.MEMBER in out.dims:
        out = out.mean(schema.MEMBER) if sel.member == "mean" else out.isel({schema.MEMBER: _member(sel, out)})
    if sel.levels:
        if schema.LEVEL not in out.dims:
            msg = f"--level {list(sel.levels)}: the variables {list(sel.variables)} have no pressure levels"
            raise ConfigError(msg)
        out = out.sel({schema.LEVEL: list(sel.levels)})
        if len(sel.levels) == 1:
            out = out.squeeze(schema.LEVEL, drop=True)
    keep = {d for v in out.data_vars for d in out[v].dims}
    return out.drop_vars([c for c in out.coords if c not in keep]).load()


def _member(sel: Selection, ds: xr.Dataset) -> int:
    """The member index ``sel.member`` asks for, checked against the ``n`` members of ``ds`` (0..n-1)."""
    n = ds.sizes[schema.MEMBER]
    text = str(sel.member)
    if not (text.isdigit() and int(text) < n):
        msg = f"--member {text}: {sel.source} has {n} members; give an index 0..{n - 1} or 'mean'"
        raise ConfigError(msg)
    return int(text)


def store_fields(
    store_path: str, rows: Sequence[int] | np.ndarray, step_h: int, channels: Sequence[Sequence[Any]]
) -> xr.Dataset:
    """Fields of a training store as (init_time, lat, lon) variables: ``rows`` (init-time indices) at
    lead ``step_h``, one variable per channel ``(name, store variable, level or None)``."""
    ds = contract.open_store(store_path)
    step = contract.step_position(ds.get_index(schema.STEP), step_h)
    rows_ds = ds.isel({schema.INIT_TIME: list(rows), schema.STEP: step})
    out = xr.Dataset()
    for name, var, lv in channels:
        da = rows_ds[var]
        if lv is not None:
            da = da.sel({schema.LEVEL: lv})
        out[name] = da.drop_vars([c for c in da.coords if c not in da.dims]).load()
    return out


def source_fields(art: Artefact) -> Fields:
    """The fields ``art`` was fitted to, reopened from what it records: a selection of a file or store
    (``postcast compress``) or a split of a training store (``postcast run``'s compress stage)."""
    sel, src = art.header.get("selection"), art.header.get("source")
    if sel:
        return to_fields(
            select(
                Selection(sel["source"], tuple(sel["variables"]), tuple(sel["levels"]), sel["step_h"], sel["member"])
            )
        )
    if src and "channels" in src:
        times = pd.DatetimeIndex(np.asarray(art.header["times"], dtype="datetime64[ns]"))
        index = pd.DatetimeIndex(contract.open_store(src["store"])[schema.INIT_TIME].values)
        missing = times.difference(index)
        if len(missing):
            msg = f"{src['store']}: lacks the init times {list(missing.astype(str)[:3])} this artefact was fitted to"
            raise MissingInputError(msg)
        return to_fields(store_fields(src["store"], index.get_indexer(times), src["step_h"], src["channels"]))
    msg = (
        f"{art.path or 'this artefact'} records neither a source selection nor a store split: "
        "regenerate it with `postcast compress` or `postcast run`"
    )
    raise BadInputError(msg)


def neural_row(fields: Fields, art: Artefact, label: str, codec: str = "neural") -> dict[str, Any]:
    t0 = time.perf_counter()
    decoded = art.decode_array()
    dt = time.perf_counter() - t0
    err = field_errors(fields.data, decoded, fields.lat)
    mb = fields.data.nbytes / 1e6
    fit_s = art.fit_seconds or art.header.get("fit_seconds", float("nan"))
    return {
        "codec": codec,
        "setting": label,
        "ratio": fields.data.nbytes / art.nbytes,
        "bytes": art.nbytes,
        **err,
        "encode_MBps": mb / fit_s,
        "decode_MBps": mb / dt,
        "encode_s_per_GB": fit_s / (mb / 1e3),
    }


def baseline_rows(
    fields: Fields, sz3: list[float], zfp_tol: list[float], zfp_rate: list[float], ebcc: Sequence[float] = ()
) -> list[dict[str, Any]]:
    """SZ3, ZFP and EBCC (absolute bounds) on the same (V, T, L, H, W) array (one call per variable,
    sizes summed; a single level is dropped so that every codec sees (time, lat, lon))."""
    runs = (
        [lambda x, b=b: baselines.sz3(x, b) for b in sz3]
        + [lambda x, t=t: baselines.zfp(x, tolerance=t) for t in zfp_tol]
        + [lambda x, r=r: baselines.zfp(x, rate=r) for r in zfp_rate]
        + [lambda x, b=b: baselines.ebcc(x, b) for b in ebcc]
    )
    rows = []
    n_l = fields.data.shape[2]
    for run in runs:
        parts = [run(fields.data[v, :, 0] if n_l == 1 else fields.data[v]) for v in range(fields.data.shape[0])]
        decoded = np.stack([p.decoded for p in parts]).reshape(fields.data.shape)
        nbytes = sum(p.nbytes for p in parts)
        mb = fields.data.nbytes / 1e6
        rows.append(
            {
                "codec": parts[0].codec,
                "setting": parts[0].setting,
                "ratio": fields.data.nbytes / nbytes,
                "bytes": nbytes,
                **field_errors(fields.data, decoded, fields.lat),
                "encode_MBps": mb / sum(p.encode_s for p in parts),
                "decode_MBps": mb / sum(p.decode_s for p in parts),
                "encode_s_per_GB": sum(p.encode_s for p in parts) / (mb / 1e3),
            }
        )
    return rows


def compare(
    artefacts: list[str], sz3: list[float], zfp_tol: list[float], zfp_rate: list[float]
) -> list[dict[str, Any]]:
    """Rows for every artefact and baseline setting, on the fields of the first artefact's source."""
    arts = [Artefact.load(p) for p in artefacts]
    fields = source_fields(arts[0])
    rows = [neural_row(fields, a, f"{Path(a.path or '').name} w={a.config.width}") for a in arts]
    return rows + baseline_rows(fields, sz3, zfp_tol, zfp_rate)


def format_table(rows: list[dict[str, Any]]) -> str:
    width = max([7, *(len(r["codec"]) for r in rows)])
    head = (
        f"{'codec':{width}} {'setting':28} {'ratio':>8} {'wRMSE':>10} {'MAE':>10} {'max abs':>10} {'PSNR dB':>8} "
        f"{'enc MB/s':>9} {'enc s/GB':>9} {'dec MB/s':>9}"
    )
    lines = [head]
    for r in rows:
        enc_s_gb = r.get("encode_s_per_GB", 1e3 / r["encode_MBps"])
        lines.append(
            f"{r['codec']:{width}} {r['setting'][:28]:28} {r['ratio']:>8.1f} {r['wrmse']:>10.4g} "
            f"{r['mae']:>10.4g} {r['max_abs']:>10.4g} {r['psnr_db']:>8.1f} {r['encode_MBps']:>9.3g} "
            f"{enc_s_gb:>9.3g} {r['decode_MBps']:>9.3g}"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str | os.PathLike[str], title: str = "") -> None:
    """Compression ratio against weighted RMSE, one line per codec (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for codec, marker in (("neural", "o"), ("sz3", "s"), ("zfp", "^")):
        pts = sorted(
            (r["wrmse"], r["ratio"]) for r in rows if r["codec"] == codec or (codec == "zfp" and r["codec"] == "zfp")
        )
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=marker, label=codec)
    ax.set(xscale="log", yscale="log", xlabel="cos-latitude weighted RMSE", ylabel="compression ratio", title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save_png(fig, path, dpi=120)


def save_png(fig: Any, path: str | os.PathLike[str], dpi: int = 110) -> None:
    """Lay out, write atomically as PNG and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with io.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    plt.close(fig)


def ratio_at_equal_error(rows: list[dict[str, Any]], codec: str, error: float, key: str = "wrmse") -> float:
    """The ``codec``'s compression ratio at a given error (``key``: "wrmse", "max_abs", ...),
    interpolated log-log between its settings (NaN outside their range)."""
    pts = sorted((r[key], r["ratio"]) for r in rows if r["codec"] == codec)
    if len(pts) < 2 or not pts[0][0] <= error <= pts[-1][0]:
        return float("nan")
    e, c = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.exp(np.interp(np.log(error), e, c)))


def plot_panels(rows: list[dict[str, Any]], path: str | os.PathLike[str], fields: list[str], title: str = "") -> None:
    """Ratio against weighted RMSE (top) and against max abs error (bottom), one column per field,
    one line per codec (log-log); rows carry a "field" key."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(fields), figsize=(5.5 * len(fields), 8), squeeze=False)
    codecs = sorted({r["codec"] for r in rows}, key=lambda c: (c.split("+")[0] != "neural", c))
    colours = {c: plt.get_cmap("tab20" if len(codecs) > 10 else "tab10")(i) for i, c in enumerate(codecs)}
    for col, name in enumerate(fields):
        for row, key in enumerate(("wrmse", "max_abs")):
            ax = axes[row, col]
            for codec in codecs:
                pts = sorted((r[key], r["ratio"]) for r in rows if r["codec"] == codec and r["field"] == name)
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", ms=4, label=codec, color=colours[codec])
            ax.axhspan(100, 1000, color="0.9", zorder=0)
            ax.set(
                xscale="log",
                yscale="log",
                ylabel="compression ratio",
                title=f"{name}",
                xlabel="cos-latitude weighted RMSE" if key == "wrmse" else "max abs error",
            )
            ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title)
    save_png(fig, path, dpi=110)
