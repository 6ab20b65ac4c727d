"""``postcast inspect``: a store's (or a raw GRIB/netCDF file's) summary (:mod:`postcast.datasets.inspection`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from postcast.common import Subparsers
from postcast.datasets.core.errors import BadInputError, MissingInputError


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "inspect",
        help="summarise a training store, or what a GRIB/netCDF file holds",
        description="Dims, variables, dates, splits, completeness and statistics of a store; for a "
        "raw GRIB or netCDF file, its parameters (GRIB shortName, paramId, postcast name "
        "or 'not in schema'), levels, members, steps, step types and grid.",
    )
    p.add_argument("store", help="a store written by `postcast ingest`, or a GRIB or netCDF file")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument(
        "--verify",
        action="store_true",
        help="read every chunk and check it against the checksums recorded at ingest "
        "(exit 65 when a chunk is missing or damaged)",
    )


def run(a: argparse.Namespace) -> int:
    from postcast.datasets import inspection

    _check_readable(a.store)
    info = inspection.summary(a.store, verify=a.verify)
    print(json.dumps(info, indent=2, default=str) if a.json else inspection.render(info))
    problem = (info.get("verify") or {}).get("problem")
    if problem:
        raise BadInputError(problem)
    return 0 if info.get("complete", "kind" in info) else 66  # a raw file ("kind") has no completeness


def _check_readable(path: str) -> None:
    """Refuse, naming what it is and the fix, a path that is neither a store (complete or interrupted)
    nor a raw GRIB/netCDF file: ``ingest --out`` is the fix only for a path where a store should be."""
    from postcast.datasets import contract, sources

    p = Path(path)
    if contract.partial_path(p).exists():
        return  # an interrupted ingest: its summary
    if not p.exists():
        msg = f"{p}: no such file or directory"
        raise MissingInputError(msg)
    if not (p.is_file() or p.is_dir()):
        msg = f"{p}: neither a file nor a folder (a pipe or a device); give a store, a GRIB or a netCDF file"
        raise BadInputError(msg)
    if contract.VERSION_ATTR in (contract.attributes(p) or {}):
        return  # a store, complete or not
    kind, found = sources.find_sources(p)
    if p.is_file() and kind is None:
        with p.open("rb") as f:
            artefact = f.read(4) == b"PCNF"
        what = f" but a compressed artefact: read it with `postcast decompress {p} --out OUT.zarr`" if artefact else ""
        msg = f"{p}: not a store, a GRIB or a netCDF file{what}"
        raise BadInputError(msg)
    if p.is_dir() and kind in ("grib", "netcdf") and p not in found:
        msg = (
            f"{p}: a folder of {len(found)} {kind} file(s), not a store: inspect one of them (e.g. {found[0]}), "
            f"or build a store from them with `postcast ingest {p} --out STORE.zarr`"
        )
        raise BadInputError(msg)
    if kind == "zarr":
        msg = (
            f"{p}: a zarr store that is not a postcast training store (no postcast attributes; a forecast "
            f"product, or raw forecasts: build a store from those with `postcast ingest {p} --out STORE.zarr`)"
        )
        raise BadInputError(msg)
