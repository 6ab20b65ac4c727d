"""The battery's machinery, shared by every file that adds cases to it: run a CLI case (in-process or as a
real process), judge it (an exit code in {2, 65, 66} or 74 for a full disk, exactly one ``postcast: error:``
line, no traceback, nothing marked complete) and record it in the tally.

It is also a pytest plugin (conftest's ``pytest_plugins``): at the end of the run it prints the whole run's
tally, ``BATTERY cases=.. clean=.. data_safe=..``, gathered from every pytest-xdist worker (each sends its
cases to the controller as it ends). Every test that records a case carries the ``battery`` mark, so
``pytest -m battery`` runs the whole battery, across the tiers, in one run."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from postcast.cli import main

OK_CODES = {2, 65, 66}
DISK_FULL = {74}  # EX_IOERR: the output cannot be written (not bad or missing input; see datasets/core/errors.py)
TALLY: dict[str, tuple[bool, bool]] = {}  # case -> (clean, data safe)


@dataclass
class Outcome:
    code: int | None
    err: str
    codes: frozenset[int] = frozenset(OK_CODES)

    @property
    def error_lines(self) -> list[str]:
        return [ln for ln in self.err.splitlines() if ln.startswith("postcast: error:") or ": INVALID:" in ln]

    @property
    def clean(self) -> bool:
        return self.code in self.codes and len(self.error_lines) == 1 and "Traceback" not in self.err


def _rebind_log_streams() -> None:
    """Handlers created during an earlier test (Lightning adds its own at import) still point at that
    test's captured, now closed, stderr; a real process has one stderr, so point them at this one."""
    import logging

    loggers = [
        logging.getLogger(),
        *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    for logger in loggers:
        for h in logger.handlers:
            if type(h) is logging.StreamHandler and getattr(h.stream, "closed", False):
                h.stream = sys.stderr  # (setStream would flush the closed one)


def in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Outcome:
    import logging

    capsys.readouterr()
    _rebind_log_streams()
    root = logging.getLogger()
    handlers = list(root.handlers)  # main's basicConfig binds a handler to this test's captured stderr
    try:
        code: int | None = main(["--no-progress", "--log-level", "ERROR", *argv])
    except SystemExit as stop:  # argparse / the Lightning CLI parser
        code = stop.code if isinstance(stop.code, int) else 2
    except Exception as err:  # (an escaped exception is a traceback: the case is not clean)
        code = None
        print(f"Traceback (escaped from main): {type(err).__name__}: {err}", file=sys.stderr)
    finally:
        root.handlers[:] = handlers
    return Outcome(code, capsys.readouterr().err)


def subprocess_case(argv: list[str], *, fsize: int | None = None, timeout: float = 300) -> Outcome:
    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    proc = subprocess.run(
        [sys.executable, "-m", "postcast", "--no-progress", "--log-level", "ERROR", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    return Outcome(proc.returncode, proc.stderr, frozenset(DISK_FULL if fsize is not None else OK_CODES))


def assert_ok(case: str, out: Outcome, safe: bool = True) -> None:
    TALLY[case] = (out.clean, safe)
    assert out.code in out.codes, f"{case}: exit {out.code}\n{out.err[-3000:]}"
    assert "Traceback" not in out.err, f"{case}:\n{out.err[-3000:]}"
    assert len(out.error_lines) == 1, f"{case}: error lines {out.error_lines}\n{out.err[-3000:]}"
    assert safe, f"{case}: something was left marked complete"


# --- the tally of the whole run (a pytest plugin) ---------------------------------------------------------
WORKERS_TALLY: dict[str, tuple[bool, bool]] = {}  # the controller's: the cases each xdist worker ran


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker sends its cases to the controller (``workeroutput`` travels with its last report)."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["battery"] = {case: list(cs) for case, cs in TALLY.items()}


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent under -p no:xdist
def pytest_testnodedown(node: Any, error: object) -> None:
    for case, (clean, safe) in getattr(node, "workeroutput", {}).get("battery", {}).items():
        WORKERS_TALLY[case] = (clean, safe)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The tally line (each case also failed its own test where it was not clean or not data safe)."""
    tally = {**WORKERS_TALLY, **TALLY}
    if not tally:
        return
    clean = sum(c for c, _ in tally.values())
    safe = sum(s for _, s in tally.values())
    terminalreporter.write_line(f"BATTERY cases={len(tally)} clean={clean} data_safe={safe}")
    for case, (c, s) in sorted(tally.items()):
        if not (c and s):
            terminalreporter.write_line(f"  BAD {case}")
