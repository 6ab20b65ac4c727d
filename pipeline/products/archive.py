"""The forecast archive: one contract between the writer (``postcast forecast``) and the reader
(``postcast serve``).

Layout, one file (netCDF) or directory (zarr) per product, model, target and init time::

    ROOT/<product>/<model>/<target>/<target>_<YYYYmmddTHH>.nc      (or .zarr)

``product`` is ``postprocessed`` or ``fallback_raw``; ``model`` is the forecast's name, so the
products of two models never share a path. Each file holds the CF dataset
:func:`postcast.pipeline.products.content.products` builds (one predictive law: its family and parameters, mean,
std, quantiles and exceedance probabilities) and is written
atomically by :func:`write_product` (a reader sees the old file or the new one, never half of one).

Readers call :func:`scan` (what is there, and which ``.nc``/``.zarr`` entries are foreign, with the
reason), :func:`read_scores` (the verification scores of the archive's models, from evaluate's
``metrics.json`` that :func:`scores_path` finds) and :func:`read_field` (one product in memory, or
:class:`UnreadableProduct` / :class:`ProductGone`). Each :class:`Product` carries a ``signature``
(inode, mtime, size) so a reader can tell a replaced file from the one it cached. Hidden entries
(``.name.tmp-PID``, the atomic writes' temporaries) and other file types are not part of the archive
and are ignored silently.

No torch here: the service imports this module.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import io, laws, schema
from postcast.datasets.core.errors import BadInputError, MissingInputError
from postcast.datasets.core.geo import coordinate_problems
from postcast.pipeline.products.content import GAUSSIAN, THRESHOLD_SOURCES

POSTPROCESSED, FALLBACK = "postprocessed", "fallback_raw"
PRODUCTS = (POSTPROCESSED, FALLBACK)
EXTENSIONS = {"netcdf": "nc", "zarr": "zarr"}  # format name -> file extension
DEFAULT_QUANTILES = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95)
INIT_FORMAT = "%Y%m%dT%H"
# evaluate's metrics.json for the archive's models: in the archive, else in WORKDIR/report beside
# WORKDIR/forecasts (where `postcast run` writes both); the models are its forecasts of the same name
SCORE_FILES = ("metrics.json", "../report/metrics.json")
SCORE = "crps_weighted"  # the score read: the global area-weighted CRPS (target units, lower is better)


def product_path(root: str | Path, product: str, model: str, target: str, init: pd.Timestamp, ext: str) -> Path:
    """``ROOT/<product>/<model>/<target>/<target>_<YYYYmmddTHH>.<ext>``."""
    return Path(root) / product / model / target / f"{target}_{init:{INIT_FORMAT}}.{ext}"


def write_product(ds: xr.Dataset, path: Path) -> None:
    """Write one product atomically, netCDF or zarr by the path's extension."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".nc":
        io.write_netcdf(ds, path)
    else:
        with io.atomic_path(path) as tmp:
            io.write_zarr(ds, tmp)


# --- reading ------------------------------------------------------------------------------------------
Signature = tuple[int, int, int]  # (inode, mtime_ns, size): changes whenever a product is rewritten


@dataclass(frozen=True)
class Product:
    target: str
    init: pd.Timestamp
    valid: pd.Timestamp
    product: str
    model: str
    path: Path
    signature: Signature


@dataclass(frozen=True)
class Skipped:
    """An entry of the archive that is not served: ``path`` relative to the root, and why (``reason``,
    which may name server paths; ``public``: the same said without them, None when ``reason`` names
    none)."""

    path: str
    reason: str
    public: str | None = None

    @property
    def public_reason(self) -> str:
        return self.reason if self.public is None else self.public


class UnreadableProduct(BadInputError):
    """A product file exists but cannot be read as a forecast (truncated, corrupt, wrong content)."""


class ProductGone(MissingInputError):
    """A product listed by :func:`scan` was removed before it was read."""


@dataclass(frozen=True)
class Field:
    """One forecast in memory: (lat, lon) mean/std, (Q, lat, lon) quantiles, (T, lat, lon) exceedance,
    the predictive family and its parameters by name ((lat, lon), Bernstein's (K, lat, lon))."""

    lat: np.ndarray
    lon: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    quantile_levels: np.ndarray
    quantiles: np.ndarray
    thresholds: np.ndarray
    exceedance: np.ndarray
    units: str
    family: str = GAUSSIAN
    params: dict[str, np.ndarray] = field(default_factory=dict)
    threshold_source: str | None = None  # one of THRESHOLD_SOURCES; None: a file from before it was recorded
    members: np.ndarray | None = None  # (M, lat, lon) the raw ensemble's members; None: not in the file


def signature(path: Path) -> Signature:
    """(inode, mtime, size) of a product; for zarr, of its ``zarr.json`` too (a rewrite replaces both)."""
    st = path.stat()
    sig = (st.st_ino, st.st_mtime_ns, st.st_size)
    if path.is_dir():
        meta = (path / "zarr.json").stat()
        sig = (st.st_ino ^ meta.st_ino, max(st.st_mtime_ns, meta.st_mtime_ns), meta.st_size)
    return sig


def parse(root: Path, path: Path) -> Product:
    """The product at ``path`` (``root/<product>/<model>/<target>/<target>_<init>.<ext>``); ValueError
    saying why when the path does not follow the layout."""
    product, model, target = path.parent.parent.parent.name, path.parent.parent.name, path.parent.name
    if product not in PRODUCTS:
        msg = f"product folder {product!r} is not one of {', '.join(PRODUCTS)}"
        raise ValueError(msg)
    if target not in schema.TARGETS:
        msg = f"target folder {target!r} is not one of {', '.join(schema.TARGETS)}"
        raise ValueError(msg)
    prefix, _, stamp = path.stem.rpartition("_")
    try:
        init = pd.to_datetime(stamp, format=INIT_FORMAT)
    except ValueError:
        init = None
    if prefix != target or init is None:
        msg = f"not a forecast file name (expected {target}_YYYYmmddTHH{path.suffix})"
        raise ValueError(msg)
    return Product(target, init, init + pd.Timedelta(hours=schema.TARGET_STEP_H), product, model, path, signature(path))


def scan(root: str | Path) -> tuple[list[Product], list[Skipped]]:
    """Every product under ``root`` (sorted by path) and the foreign ``.nc``/``.zarr`` entries."""
    root = Path(root)
    found, skipped = [], []
    for path in sorted(root.glob("*/*/*/*")):
        if path.name.startswith(".") or path.suffix not in (".nc", ".zarr"):
            continue  # temporaries of atomic writes, notes, anything that is not a product
        try:
            found.append(parse(root, path))
        except ValueError as err:
            skipped.append(Skipped(str(path.relative_to(root)), str(err)))
        except FileNotFoundError:
            continue  # removed while scanning
    return found, skipped


@contextmanager
def _open_product(path: Path) -> Iterator[xr.Dataset]:
    """A product file open for a ``with`` block: netCDF under the HDF5 lock (``io.open_netcdf``), zarr as is."""
    if path.suffix == ".nc":
        with io.open_netcdf(path) as ds:
            yield ds
    else:
        with xr.open_dataset(path, engine="zarr", consolidated=False) as ds:
            yield ds


def product_identity(path: Path) -> dict[str, Any]:
    """What made a product file (netCDF or zarr): the checkpoint's SHA-256, the input, the quantile
    levels and the thresholds; {} when it cannot be read."""
    try:
        with _open_product(path) as ds:
            return {
                "checkpoint_sha256": ds.attrs.get("checkpoint_sha256"),
                "inputs": ds.attrs.get("inputs"),
                "quantiles": [float(q) for q in ds["quantile"].values],
                "thresholds": [float(t) for t in ds["threshold"].values],
            }
    except Exception:  # an unreadable file is one to rebuild, whatever the reason
        return {}


def read_field(p: Product) -> Field:
    """Load one product; :class:`ProductGone` if it was removed, :class:`UnreadableProduct` if it cannot
    be read or lacks the variables of its target."""
    if not p.path.exists():
        msg = f"{p.path}: removed since the archive was scanned"
        raise ProductGone(msg)
    t = p.target
    try:
        with _open_product(p.path) as opened:
            ds = opened.isel(forecast_reference_time=0).load()
        family = str(ds.attrs.get("predictive_distribution", GAUSSIAN))  # files before families: Gaussian
        named = str(ds.attrs.get("predictive_parameters", f"mu: {t}_mean sigma: {t}_std")).split()
        read = Field(
            lat=ds[schema.LAT].values,
            lon=ds[schema.LON].values,
            mean=ds[f"{t}_mean"].values,
            std=ds[f"{t}_std"].values,
            quantile_levels=ds["quantile"].values,
            quantiles=ds[f"{t}_quantile"].values,
            thresholds=ds["threshold"].values,
            exceedance=ds[f"{t}_exceedance_probability"].values,
            units=str(ds[f"{t}_mean"].attrs.get("units", "")),
            family=family,
            params={k.rstrip(":"): ds[v].values for k, v in zip(named[::2], named[1::2], strict=True)},
            threshold_source=ds.attrs.get("threshold_source"),
            members=ds[f"{t}_raw_member"].values if f"{t}_raw_member" in ds else None,
        )
    except FileNotFoundError as err:
        msg = f"{p.path}: removed while being read"
        raise ProductGone(msg) from err
    except Exception as err:  # any failure to read a file means the file is unreadable
        msg = f"{p.path}: unreadable ({type(err).__name__}: {str(err)[:200]})"
        raise UnreadableProduct(msg) from err
    _check(p, read)
    return read


def _check(p: Product, f: Field) -> None:
    wrong = coordinate_problems(f.lat, f.lon)  # the check ingest makes of a source's coordinates
    if wrong:
        msg = f"{p.path}: {'; '.join(wrong)}: rewrite it with `postcast forecast`"
        raise UnreadableProduct(msg)
    shape = (f.lat.size, f.lon.size)
    if f.mean.shape != shape or f.std.shape != shape or f.quantiles.shape[1:] != shape:
        msg = f"{p.path}: fields of shape {f.mean.shape} do not match the grid {shape}"
        raise UnreadableProduct(msg)
    if f.family not in laws.names() or set(f.params) != set(laws.get(f.family).names):
        msg = (
            f"{p.path}: predictive family {f.family!r} with parameters {sorted(f.params)}; this postcast reads "
            f"{', '.join(f'{k} ({sorted(laws.get(k).names)})' for k in laws.names())}"
        )
        raise UnreadableProduct(msg)
    if f.members is not None and (f.members.ndim != 3 or f.members.shape[1:] != shape):
        msg = f"{p.path}: raw members of shape {f.members.shape} do not match the grid {shape}"
        raise UnreadableProduct(msg)
    if f.threshold_source not in (*THRESHOLD_SOURCES, None):
        msg = f"{p.path}: threshold_source {f.threshold_source!r}; this postcast writes one of {THRESHOLD_SOURCES}"
        raise UnreadableProduct(msg)
    # a censored law may put all its mass at 0 (std 0); a Gaussian's std is its sigma (> 0)
    spread = f.std > 0 if f.family == GAUSSIAN else f.std >= 0
    if not (np.isfinite(f.mean).all() and np.isfinite(f.std).all() and spread.all()):
        msg = f"{p.path}: non-finite mean or non-positive std"
        raise UnreadableProduct(msg)


def exceedance_at(f: Field, i: int, j: int, t: float) -> float:
    """P(Y > t) of the forecast's law at grid point (i, j), for a threshold the file does not carry (the
    family's survival function, datasets/laws.py)."""
    return float(laws.get(f.family).sf({k: v[..., i, j] for k, v in f.params.items()}, t))


# --- verification scores ------------------------------------------------------------------------------
def scores_path(root: str | Path) -> tuple[str, Path] | None:
    """The first of :data:`SCORE_FILES` under ``root`` that exists: (its name relative to the root, its
    path); None when there is none."""
    for name in SCORE_FILES:
        path = Path(root) / name
        if path.is_file():
            return name, path
    return None


def _is_score(v: object) -> bool:
    """A CRPS: a finite non-negative number (not a JSON boolean, which Python reads as an int)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def read_scores(path: Path) -> dict[str, dict[str, float]]:
    """target -> model -> :data:`SCORE` from evaluate's ``metrics.json`` (``targets.<target>.forecasts.
    <model>.global.crps_weighted``; what is not a finite non-negative number left out); :class:`BadInputError`
    naming the file when it is not such a summary."""
    try:
        targets = json.loads(path.read_text())["targets"]
        scores = {
            str(t): {str(m): s["global"][SCORE] for m, s in summary["forecasts"].items()}
            for t, summary in targets.items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:  # (deep nesting)
        msg = (
            f"{path}: not the metrics.json of `postcast evaluate` ({type(err).__name__}: {str(err)[:200]}); "
            "rewrite it with `postcast evaluate` or remove it"
        )
        raise BadInputError(msg) from err
    return {t: {m: float(v) for m, v in by_model.items() if _is_score(v)} for t, by_model in scores.items()}
