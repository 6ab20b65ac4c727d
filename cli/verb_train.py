"""``postcast train {fit,validate,test,predict}``: the Lightning CLI (:mod:`postcast.pipeline.train`).

Every word after ``train`` goes to the Lightning CLI verbatim (``--help`` included: :func:`postcast.main.parse`
hands them over). Its parser answers bad usage itself (the usage and one line on stderr, exit 2); what
escapes ``run`` is mapped by :mod:`postcast.main` like any verb's error: a ``PostcastError`` (also one the
Lightning CLI wrapped while linking arguments) by its code, anything else is a bug (exit 70).
"""

from __future__ import annotations

import argparse

from postcast.common import Subparsers


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "train",
        help="train a post-processor with the Lightning CLI (fit, validate, test, predict)",
        description="The Lightning CLI over a postcast store: `postcast train fit -c configs/train/mlp_t850.yaml`. "
        "Everything after `train` goes to Lightning; `postcast train fit --help` lists all options.",
        add_help=False,
    )
    p.add_argument("lightning_args", nargs=argparse.REMAINDER)


def run(a: argparse.Namespace) -> int:
    from postcast.pipeline.train import run as lightning_cli

    lightning_cli(a.lightning_args or ["--help"])
    return 0
