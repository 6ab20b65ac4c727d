"""The ``postcast`` console script's entry point (``postcast.cli:main`` in pyproject.toml), kept under
this name for the scripts, tests and benchmarks that import it: the command line itself is assembled in
:mod:`postcast.main` from the verb modules (``verb_*.py``)."""

from postcast.main import main

__all__ = ["main"]
