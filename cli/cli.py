"""The ``postcast`` console script's entry point (``postcast.cli:run`` in pyproject.toml; ``main`` kept under
this name for the scripts, tests and benchmarks that import it): the command line itself is assembled in
:mod:`postcast.main` from the verb modules (``verb_*.py``)."""

from postcast.main import main, run

__all__ = ["main", "run"]
