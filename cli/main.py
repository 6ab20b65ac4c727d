"""The ``postcast`` command line: the parser assembled from the verb modules, logging, and the one place
that turns exceptions into exit codes.

Each verb module (``verb_*.py``, the :class:`postcast.common.Verb` interface) turns flags (and an
optional YAML preset) into a typed config and calls one library function; :data:`VERBS` lists them in
the order ``--help`` shows them. Exit codes: :data:`postcast.datasets.core.errors.EXIT_CODES`.
:func:`main` maps what escapes a verb (see :func:`exit_code`): the library raises a ``PostcastError``
subclass where it finds an expected problem (bad usage, bad or missing input, an unwritable output);
anything else is a bug (exit 70, the traceback in a log file: :func:`internal_error`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import postcast
from postcast import (
    verb_compress,
    verb_config,
    verb_download,
    verb_evaluate,
    verb_forecast,
    verb_ingest,
    verb_inspect,
    verb_run,
    verb_serve,
    verb_synth,
    verb_train,
)
from postcast.common import Verb, log
from postcast.datasets.core.errors import EXIT_CODES, ConfigError, MissingInputError, OutputError, PostcastError

# the verbs, in the order of `postcast --help`
VERBS: tuple[Verb, ...] = (
    verb_synth,
    verb_ingest,
    verb_inspect,
    verb_config,
    verb_train,
    verb_evaluate,
    verb_run,
    verb_forecast,
    verb_serve,
    verb_compress,
    verb_download,
)
INTERRUPTED = 130  # exit code after Ctrl-C (128 + SIGINT)
INTERNAL = 70  # EX_SOFTWARE: a bug in postcast, never the user's data

EPILOG = (
    """\
quickstart (synthetic ENS-10, coarse grid), all stages at once:
  postcast run configs/quickstart.yaml
or step by step:
  postcast synth --out runs/quickstart/synth
  postcast ingest runs/quickstart/synth --out runs/quickstart/store.zarr
  postcast inspect runs/quickstart/store.zarr
  postcast train fit -c configs/train/unet_t850.yaml   (reads the store configs/paths.yaml names)
  postcast evaluate runs/quickstart/store.zarr \\
      --checkpoints runs/unet_t850/lightning_logs/version_0/checkpoints/best*.ckpt

exit codes:
"""
    + "\n".join(f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES.items())
    + "\n"
)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; every option's help ends with its default where it has one
    and does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.option_strings and not action.required and "default" not in text
        switch = isinstance(action, argparse._StoreConstAction)  # store_true/false: the flag says what it does
        if shown and not switch and action.default not in (None, False, [], (), argparse.SUPPRESS):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """argparse whose usage error is one line, the problem and where the help is (argparse prints its
    whole usage block above the error). The verbs' parsers are of this class too (``add_subparsers``
    makes its parsers of the parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="postcast",
        description="Post-processing of ensemble weather forecasts (ENS-10).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"postcast {postcast.__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="lowest level of log lines on stderr",
    )
    parser.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="no progress bars (there are none when stderr is not a terminal: log lines report progress)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for verb in VERBS:
        before = set(sub.choices)
        verb.add_parser(sub)
        for name in sub.choices.keys() - before:  # the command(s) this module added run its `run`
            sub.choices[name].set_defaults(verb=verb)
    _use_formatter(parser)
    return parser


def _use_formatter(parser: argparse.ArgumentParser) -> None:
    """:class:`HelpFormatter` for the parser and every verb's (and sub-verb's) parser."""
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _use_formatter(sub)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line as a namespace. ``train`` hands every word after it to the Lightning CLI
    verbatim (``postcast train --help`` included); other verbs refuse unknown arguments."""
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(words)
    # bars only on a terminal: in a log file their carriage returns run into the log lines
    args.progress = args.progress and sys.stderr.isatty()
    if args.command == "train":
        args.lightning_args = words[words.index("train") + 1 :]
    elif extra:
        _verb_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _verb_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of the verb ``command`` (its errors name the verb and point at its help)."""
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return verbs.choices[command]


# --- errors -> exit codes ------------------------------------------------------------------------
def exit_code(err: BaseException) -> int | None:
    """The exit code of an exception that escaped a verb; None for an internal error (exit 70, the
    traceback in a log file: :func:`internal_error`). The CLI's one mapping, first match wins:

    * :class:`PostcastError` carries its own code: ``ConfigError`` 2, ``BadInputError`` 65 (the
      compression ``ArtefactError`` is one), ``MissingInputError`` 66, ``OutputError`` 74; so does
      an exception raised *from* one (:func:`expected`: the Lightning CLI wraps errors of linked
      arguments in a ``ValueError``);
    * ``argparse.ArgumentError``: a usage error of a parser told not to exit (jsonargparse's in its
      debug mode; otherwise it prints the usage and exits 2 itself): 2;
    * an ``OSError`` of a full disk, a file size limit, a quota or a read-only filesystem, wrapped or not: 74
      (``OutputError``);
    * any other ``FileNotFoundError``: missing input, 66.

    Nothing else: a ``ValueError``, ``KeyError`` or ``OSError`` that the library did not turn into a
    ``PostcastError`` where it found the problem is a bug, not the user's data.
    """
    known = expected(err)
    if known is not None:
        return known.exit_code
    if isinstance(err, argparse.ArgumentError):
        return ConfigError.exit_code
    if out_of_space(err) is not None or read_only(err) is not None:
        return OutputError.exit_code
    if isinstance(err, FileNotFoundError):
        return MissingInputError.exit_code
    return None


def expected(err: BaseException) -> PostcastError | None:
    """``err`` if it is a PostcastError, else the one it was raised from (``raise ... from``, at any depth);
    not one it was raised *while handling* (that would pass a bug in an ``except`` block off as the
    user's error)."""
    seen: list[BaseException] = []
    cause: BaseException | None = err
    while cause is not None and all(cause is not e for e in seen):
        if isinstance(cause, PostcastError):
            return cause
        seen.append(cause)
        cause = cause.__cause__
    return None


def out_of_space(err: BaseException) -> OSError | None:
    """The "disk full" / "file too large" / "quota" OSError behind ``err`` (zarr, dask and netCDF4 wrap
    it), else None."""
    import errno

    full = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
    return next((e for e in _chain(err) if isinstance(e, OSError) and e.errno in full), None)


def read_only(err: BaseException) -> OSError | None:
    """The "read-only file system" OSError (EROFS) behind ``err``, else None: only a write meets it."""
    import errno

    return next((e for e in _chain(err) if isinstance(e, OSError) and e.errno == errno.EROFS), None)


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the exceptions it was raised from or during, each once (chains can be cycles)."""
    out: list[BaseException] = []
    seen: BaseException | None = err
    while seen is not None and all(seen is not e for e in out):
        out.append(seen)
        seen = seen.__cause__ or seen.__context__
    return out


def _message(err: BaseException, path: str | None) -> str:
    """The error line's text. A plain exception (not a PostcastError, whose message says what it means)
    is prefixed with the verb's input path, unless it names that path already."""
    full = out_of_space(err)
    if full is not None:
        return _full_message(full)
    ro = read_only(err)
    if ro is not None:
        return f"cannot write {ro.filename or 'the output'}: read-only file system; choose a writable folder"
    err = expected(err) or err
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    plain = not isinstance(err, PostcastError)
    return f"{path}: {text}" if plain and path and path not in text else text


def _full_message(full: OSError) -> str:
    """The line for a full disk: the file being written named, and when it lies in the scratch folder
    (TMPDIR: the EMOS fit's bands, evaluate's sorted runs), that folder and the way to move it."""
    import tempfile

    written = full.filename or _open_file_of(full)
    scratch = Path(tempfile.gettempdir())
    if written is not None and scratch in Path(str(written)).parents:
        return (
            f"the scratch folder {scratch} (TMPDIR) is full: {full.strerror or full} writing {written}; free "
            "space there or set TMPDIR to a folder with room, and rerun (nothing partial was marked complete)"
        )
    return (
        f"cannot write {written or 'the output'}: {full.strerror or full} (disk full or file size "
        "limit); free space and rerun (finished work is kept, nothing partial was marked complete)"
    )


def _open_file_of(err: BaseException) -> str | None:
    """The name of the file object a write that raised ``err`` was writing (a ``write`` call's OSError carries
    no file name): the one held by the innermost frame of its traceback that holds one."""
    import io

    tb, frames = err.__traceback__, []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        names = [getattr(v, "name", None) for v in frame.f_locals.values() if isinstance(v, io.IOBase)]
        named = [n for n in names if isinstance(n, str)]
        if named:
            return named[0]
    return None


def internal_error(err: BaseException) -> int:
    """A bug, not the user's fault: one line naming the log file that holds the traceback, exit 70."""
    import traceback

    path = _crash_log()
    text = "".join(traceback.format_exception(err))
    try:
        path.write_text(f"postcast {postcast.__version__}, argv {sys.argv!r}\n{text}")
        where = str(path)
    except OSError:  # nowhere to write: the trace goes to stderr after the line
        where = "stderr, below"
    print(f"postcast: internal error: {type(err).__name__}: {err} (details in {where}; please report)", file=sys.stderr)
    if where != str(path):
        print(text, file=sys.stderr)
    return INTERNAL


def _crash_log() -> Path:
    """A new file for one internal error's traceback: under $POSTCAST_LOG_DIR, else
    $XDG_STATE_HOME/postcast (~/.local/state/postcast); the system's temporary folder if neither can be made."""
    import os
    import tempfile
    import time

    base = os.environ.get("POSTCAST_LOG_DIR") or str(
        Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "postcast"
    )
    name = f"internal-error-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
    for folder in (Path(base), Path(tempfile.gettempdir()) / "postcast"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            return folder / name
        except OSError:
            continue
    return Path(tempfile.gettempdir()) / name


# --- logging -------------------------------------------------------------------------------------
def _log_handler(level: str) -> logging.Handler:
    """One handler on the root logger, on this call's stderr: every library's records (Lightning's,
    uvicorn's, dask's) are printed once, in one format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_AsyncioLeftovers())
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    return handler


class _AsyncioLeftovers(logging.Filter):
    """Libraries' reports of their own leftovers, at DEBUG only, so that an error stays one line: asyncio's
    "Future exception was never retrieved" about a leftover future (dask's tornado timeouts at cluster
    shutdown), logged whenever it is garbage-collected; and tornado's traceback of distributed's ``sync``
    cancelling, after Ctrl-C, a call whose coroutine had not started yet (its ``cancel`` reads a future not
    made yet: a NameError, distributed 2025's)."""

    def filter(self, record: logging.LogRecord) -> bool:
        first = str(record.msg).split("\n", 1)[0]
        leftover = record.name == "asyncio" and first.endswith("exception was never retrieved")
        cancelled = record.name == "tornado.application" and "sync.<locals>.cancel" in record.getMessage()
        return not (leftover or cancelled) or logging.getLogger().level <= logging.DEBUG


def _check_out(out: object) -> None:
    """An ``--out`` below a regular file, or in a folder that cannot be written (a read-only filesystem, no
    permission), is refused before the verb starts (its writer would meet a NotADirectoryError or an EROFS
    deep inside a library: exit 70): exit 74, naming the folder."""
    import os

    if not out:
        return
    path = Path(str(out))
    for above in ([path] if path.is_dir() else []) + list(path.parents):  # the nearest first: the first there decides
        if above.exists():
            if not above.is_dir():
                msg = f"--out {out}: {above} is a file, not a folder; choose a writable folder"
                raise OutputError(msg)
            if not os.access(above, os.W_OK):
                why = "on a read-only filesystem" if os.statvfs(above).f_flag & os.ST_RDONLY else "not writable"
                msg = f"--out {out}: {above} is {why}; choose a writable folder"
                raise OutputError(msg)
            return


def run() -> NoReturn:
    """The process's entry point (the ``postcast`` script, ``python -m postcast``): :func:`main`, then exit.
    Libraries' asyncio tasks still pending at interpreter shutdown (zarr's reads in a loader's threads that a
    signal cut off) are destroyed after postcast's one line; asyncio's reports of them ("Task was destroyed
    but it is pending!", a traceback of "exception was never retrieved") are not the user's business, so
    asyncio's logger is silenced once the verb has ended."""
    code = main()
    logging.getLogger("asyncio").disabled = True
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    level = logging.getLogger().level  # restored on return: a caller's logging (a test, an embedding) is its own
    handler = _log_handler(args.log_level)
    try:
        _check_out(getattr(args, "out", None))
        return int(args.verb.run(args))
    except KeyboardInterrupt:
        print("postcast: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # the reader stopped reading (`postcast inspect S | head`): not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python exits
        return 0
    except Exception as err:
        code = exit_code(err)
        if code is None:
            return internal_error(err)
        input_path = getattr(args, "input_path", None)  # the name of the argument holding the input
        print(f"postcast: error: {_message(err, getattr(args, input_path) if input_path else None)}", file=sys.stderr)
        log.debug("traceback of the error above", exc_info=err)
        return code
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(level)
