"""``postcast config validate``: check YAML presets against their typed schema.

A preset's ``kind:`` names its dataclass; :mod:`postcast.datasets.core.config` finds the kinds through
the package's entry points (group ``postcast.config_kinds``), so this verb imports no stage itself.
Lightning training presets (no ``kind:``) go through the training parser's own checks.
"""

from __future__ import annotations

import argparse
import sys

from postcast.common import Subparsers
from postcast.datasets.core.errors import PostcastError


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "config",
        help="validate configuration presets",
        description="Check YAML presets against their typed schema (kind: synth | ingest | ...).",
    )
    csub = p.add_subparsers(dest="config_cmd", required=True)
    v = csub.add_parser("validate", help="validate one or more YAML files")
    v.add_argument("files", nargs="+")


def run(a: argparse.Namespace) -> int:
    from postcast.datasets.core import config

    worst = 0
    for f in a.files:
        if config.is_lightning_preset(f):
            from postcast.pipeline.train import validate_preset

            problem = validate_preset(f)
            if problem is None:
                print(f"{f}: ok (Lightning CLI training preset)")
            else:
                print(f"{f}: INVALID: {problem}", file=sys.stderr)
                worst = max(worst, 2)
            continue
        try:
            cfg = config.load(f)
            print(f"{f}: ok ({type(cfg).__name__})")
        except PostcastError as err:
            print(f"{f}: INVALID: {err}", file=sys.stderr)
            worst = max(worst, err.exit_code)
    return worst
