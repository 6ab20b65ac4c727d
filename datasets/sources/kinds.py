"""Source kinds by name (zarr, netCDF, GRIB): what kind a path is, the sources a folder holds, the truth files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from postcast.datasets.core.errors import BadInputError, MissingInputError

# --- source kinds: one registry, for forecasts and truth alike -----------------------------------
NETCDF_MAGIC = (b"CDF\x01", b"CDF\x02", b"\x89HDF\r\n\x1a\n")  # netCDF classic, 64-bit offset, netCDF-4/HDF5


GRIB_SUFFIXES = (".grib", ".grb", ".grib1", ".grb1", ".grib2", ".grb2")


def _head(p: Path, n: int = 8) -> bytes:
    try:
        with p.open("rb") as f:
            return f.read(n)
    except OSError:
        return b""


def _is_zarr(p: Path) -> bool:
    return p.is_dir() and ((p / "zarr.json").exists() or (p / ".zgroup").exists() or p.suffix == ".zarr")


def is_netcdf(p: Path) -> bool:
    return p.is_file() and (p.suffix in (".nc", ".nc4") or _head(p).startswith(NETCDF_MAGIC))


def is_grib(p: Path) -> bool:
    """By name (ENS-10's ``output.pl.2018MMDD``, GRIB suffixes), else by the leading ``GRIB`` of its
    first message; a damaged file with a GRIB name is GRIB (and refused as corrupt when decoded)."""
    if not p.is_file() or p.suffix in (".nc", ".nc4", ".idx", ".json"):
        return False
    named = p.suffix in GRIB_SUFFIXES or p.name.startswith("output.")
    return named or _head(p).startswith(b"GRIB")


# name -> whether a path is a source of that kind (checked in this order: a zarr store is a folder)
SOURCE_KINDS: dict[str, Callable[[Path], bool]] = {"zarr": _is_zarr, "netcdf": is_netcdf, "grib": is_grib}


KIND_NAMES = {"zarr": "a zarr store", "netcdf": "netCDF files", "grib": "GRIB files"}


def kind_of(path: str | Path) -> str | None:
    """The source kind of one path (a file or a zarr store), or None."""
    p = Path(path)
    return next((name for name, test in SOURCE_KINDS.items() if test(p)), None)


def find_sources(path: str | Path) -> tuple[str | None, list[Path]]:
    """The sources at ``path``: itself when it is one, else the entries of a folder of the first kind
    (registry order) that it holds, sorted; (None, []) when there are none."""
    p = Path(path)
    kind = kind_of(p)
    if kind is not None:
        return kind, [p]
    entries = sorted(p.iterdir()) if p.is_dir() else []
    for name, test in SOURCE_KINDS.items():
        found = [q for q in entries if not q.name.startswith(".") and test(q)]
        if found:
            return name, found
    return None, []


def truth_paths(truth: str | Path) -> list[Path]:
    """The truth files named by ``--truth`` (a zarr store, a netCDF file, or a folder of either).
    Nothing found, or GRIB, is refused naming what was searched: a store written without truth would
    only fail at training."""
    tp = Path(truth)
    if not tp.exists():
        msg = f"truth {tp}: no such file or directory"
        raise MissingInputError(msg)
    kind, found = find_sources(tp)
    if kind == "grib":
        msg = (
            f"truth {tp}: GRIB analyses are not read as truth: convert them to netCDF (e.g. eccodes' "
            "grib_to_netcdf) or give a zarr store"
        )
        raise BadInputError(msg)
    if not found:
        msg = (
            f"truth {tp}: no truth found; searched for {KIND_NAMES['zarr']} and {KIND_NAMES['netcdf']} "
            f"(*.nc or netCDF/HDF5 content){' in this folder' if tp.is_dir() else ''}"
        )
        raise MissingInputError(msg)
    return found
