"""What the verb modules share: the interface each one implements (:class:`Verb`), the logger and the
argument types of their flags.

A verb module (``cli/verb_<name>.py``) registers its parser(s) in ``add_parser`` and does its work in
``run``; :mod:`postcast.main` lists the modules, builds the command line from them and turns what
``run`` raises into exit codes (the one place that does). The modules are named ``verb_*``: a verb
named like the module would shadow a layer (``postcast.serve``) or, run as a script, the standard
library (``inspect``).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("postcast")

Subparsers = argparse._SubParsersAction  # what ``add_parser`` receives: the ``COMMAND`` sub-parsers


class Verb(Protocol):
    """A verb module: ``add_parser(sub)`` adds its parser (or a few related ones: ``compress``,
    ``decompress``, ``compress-report``) to ``sub``; ``run(args)`` does the work of a command it added
    and returns the exit code. It raises a ``PostcastError`` subclass for an expected problem (bad
    usage 2, bad input 65, missing input 66, unwritable output 74) and lets anything else (a bug)
    escape. ``set_defaults(input_path=<argument>)`` names the input in the line of a plain I/O error."""

    def add_parser(self, sub: Subparsers) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def int_tuple(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as err:
        msg = f"expected comma-separated integers, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from err


def str_tuple(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def year_range(text: str) -> tuple[int, int]:
    parts = int_tuple(text.replace(":", ","))
    if len(parts) != 2:
        msg = f"expected START:END years, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return (parts[0], parts[1])


def float_tuple(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as err:
        msg = f"expected comma-separated numbers, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from err


def float_list(text: str) -> list[float]:
    return list(float_tuple(text))


def progress(enabled: bool, unit: str) -> Callable[[Any], Any]:
    """A tqdm wrapper for an iterable, shown only when ``enabled`` (``--no-progress``, not a terminal)."""
    from tqdm.auto import tqdm

    return lambda it: tqdm(it, unit=unit, disable=not enabled)
