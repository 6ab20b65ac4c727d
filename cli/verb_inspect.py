"""``postcast inspect``: a store's (or a raw GRIB/netCDF file's) summary (:mod:`postcast.datasets.inspection`)."""

from __future__ import annotations

import argparse
import json

from postcast.common import Subparsers
from postcast.datasets.core.errors import BadInputError


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

    info = inspection.summary(a.store, verify=a.verify)
    print(json.dumps(info, indent=2, default=str) if a.json else inspection.render(info))
    problem = (info.get("verify") or {}).get("problem")
    if problem:
        raise BadInputError(problem)
    return 0 if info.get("complete", "kind" in info) else 66  # a raw file ("kind") has no completeness
