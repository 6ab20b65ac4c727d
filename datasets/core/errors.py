"""Errors that carry an exit code, so every driver (CLI, batch job, pipeline) maps them the same way.

Exit codes (documented in the README, after BSD sysexits.h):

====  ===================  ==========================================================
code  class                meaning
====  ===================  ==========================================================
0     -                    success, including "already done"
2     ConfigError          bad command line or configuration
65    BadInputError        input data exist but are invalid (corrupt, wrong grid, NaNs, units)
66    MissingInputError    input files, variables, levels, members or dates are missing (retryable)
70    (other exceptions)   internal error: a bug in postcast (EX_SOFTWARE); the traceback goes to a log
                           file, the user sees one line naming it
74    OutputError          the output cannot be written: disk full, file size limit, quota (EX_IOERR)
130   KeyboardInterrupt    interrupted (128 + SIGINT)
143   -                    terminated by SIGTERM during training (128 + SIGTERM; resume from last.ckpt)
====  ===================  ==========================================================
"""

from __future__ import annotations

TERMINATED = 143  # 128 + SIGTERM: training stopped by SIGTERM (pipeline/train.py)

# The one table of exit codes: the CLI's help is built from it; README and docs are tested against it.
EXIT_CODES: dict[int, str] = {
    0: "ok or already done",
    2: "bad usage or config",
    65: "invalid input data",
    66: "missing input (retryable)",
    70: "internal error (a bug; the traceback is in a log file)",
    74: "cannot write the output (disk full)",
    130: "interrupted",
    143: "terminated (SIGTERM; training resumes from last.ckpt)",
}


class PostcastError(Exception):
    """Base class; ``exit_code`` is what the CLI returns."""

    exit_code = 1


class ConfigError(PostcastError, ValueError):
    exit_code = 2


class BadInputError(PostcastError, ValueError):
    exit_code = 65


class MissingInputError(PostcastError, FileNotFoundError):
    exit_code = 66

    def __init__(self, *args: object, missing: list[str] | None = None) -> None:
        super().__init__(*args)
        self.missing: list[str] = missing if missing is not None else [str(a) for a in args]


class OutputError(PostcastError, OSError):
    """The output cannot be written (disk full, file size limit, quota); the CLI also maps a plain
    ``OSError`` with ENOSPC, EFBIG or EDQUOT to this code."""

    exit_code = 74
