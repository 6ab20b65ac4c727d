"""Errors -> exit codes: only postcast's own error classes (and a parser's usage errors) are the user's
problem; any other exception, a ValueError included, is a bug: exit 70, one line, the traceback in a log."""

import argparse
import errno
import multiprocessing.resource_sharer
import os
import subprocess
import sys
from pathlib import Path

import pytest

from postcast.datasets.core.errors import BadInputError, ConfigError, MissingInputError, OutputError

ROOT = Path(__file__).resolve().parents[1]

CALLBACK = '''
from lightning.pytorch.callbacks import Callback


class PlantedBug(Callback):
    """A bug in training code: a ValueError that no user input causes."""

    def on_train_start(self, trainer, pl_module):
        raise ValueError("planted bug")
'''


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
def test_a_bug_inside_train_fit_is_an_internal_error(store, tmp_path):
    """`train fit` answered every ValueError as bad usage (exit 2, "postcast: error: planted bug"), bugs
    included; a real process with a callback that raises one now exits 70 with the traceback in a log."""
    (tmp_path / "planted_callbacks.py").write_text(CALLBACK)
    logs = tmp_path / "logs"
    cmd = [
        sys.executable,
        "-m",
        "postcast",
        "--no-progress",
        "train",
        "fit",
        "-c",
        str(ROOT / "configs/train/tiny_emos_t2m.yaml"),
        "--data.cfg.store",
        str(store),
        "--trainer.default_root_dir",
        str(tmp_path / "runs"),
        "--trainer.max_epochs",
        "1",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.callbacks+=planted_callbacks.PlantedBug",
    ]
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "POSTCAST_LOG_DIR": str(logs), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300, check=False)
    assert proc.returncode == 70, (proc.returncode, proc.stderr[-3000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("postcast:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("postcast: internal error: ValueError: planted bug") and "please report" in lines[0]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    files = list(logs.glob("internal-error-*.log"))
    assert len(files) == 1 and str(files[0]) in lines[0], (files, lines[0])
    text = files[0].read_text()
    assert "Traceback (most recent call last)" in text and "on_train_start" in text and "planted bug" in text


def _raised_while_handling(err: Exception, handled: Exception) -> Exception:
    """``err`` as raised in an ``except`` block of ``handled`` (its ``__context__``, not its cause)."""
    try:
        try:
            raise handled
        except Exception:
            raise err  # noqa: B904
    except Exception as caught:
        return caught


@pytest.mark.parametrize(
    ("err", "code"),
    [
        (ConfigError("bad option"), 2),
        (BadInputError("bad data"), 65),
        (MissingInputError("no file"), 66),
        (OutputError("cannot write"), 74),
        (argparse.ArgumentError(None, "bad usage"), 2),
        (OSError(errno.ENOSPC, "No space left on device"), 74),
        (FileNotFoundError("x.zarr"), 66),
        (ValueError("a bug"), None),
        (KeyError("a bug"), None),
        (TypeError("a bug"), None),
        (_raised_while_handling(ValueError("a bug in an except block"), ConfigError("bad option")), None),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_only_postcast_errors_are_the_users(err, code):
    """None: an internal error (exit 70)."""
    from postcast.main import exit_code

    assert exit_code(err) == code


def test_a_postcast_error_raised_from_is_the_users():
    """The Lightning CLI wraps an error of a linked argument in a ValueError raised from it."""
    from postcast.main import _message, exit_code

    try:
        try:
            raise ConfigError("data.cfg.sample.target 't999': use one of t2m, t850")
        except ConfigError as cause:
            raise ValueError(f"Call to compute_fn of link failed: {cause}") from cause
    except ValueError as wrapped:
        assert exit_code(wrapped) == 2
        assert _message(wrapped, None) == "data.cfg.sample.target 't999': use one of t2m, t850"


def test_a_worker_gone_mid_handshake_is_not_a_traceback_during_training(capsys):
    """multiprocessing's resource sharer reports a loader worker that went away mid-handshake through
    ``sys.excepthook``: when a signal stops the run, that can happen before the SIGTERM handler has run
    (Lightning's own handler runs first), and its traceback reached stderr (seen once in 880 tests, in
    test_signals_end_training_promptly[plain-workers-15-143]). During a run such reports are logged at
    DEBUG; any other error reaching the hook is still printed."""
    import sys

    from postcast.pipeline import train

    sharer = str(Path(multiprocessing.resource_sharer.__file__))

    def raised(code: str, filename: str) -> tuple[type[BaseException], BaseException, object]:
        try:
            exec(compile(code, filename, "exec"))
        except BaseException:
            return sys.exc_info()
        raise AssertionError("nothing raised")

    with train._signals_end_the_run():
        sys.excepthook(*raised("raise ConnectionResetError(104, 'Connection reset by peer')", sharer))
        assert capsys.readouterr().err == ""
        sys.excepthook(*raised("raise ValueError('a real bug')", "elsewhere.py"))
        assert "a real bug" in capsys.readouterr().err
    assert sys.excepthook is sys.__excepthook__


LEFTOVER_TASK = """
import asyncio, sys
from postcast import main

async def forever():
    await asyncio.Event().wait()

# a library's task still pending when the interpreter shuts down (zarr's read of a loader that a signal
# stopped): asyncio reports it as the task is destroyed, after postcast's one line
loop = asyncio.new_event_loop()
task = loop.create_task(forever())
loop.run_until_complete(asyncio.sleep(0))
sys.argv = ["postcast", "inspect", sys.argv[1]]
main.run()
"""


def test_asyncio_reports_at_interpreter_shutdown_stay_off_stderr(tmp_path):
    """A SIGINT during training (the auto loader reading zarr chunks in threads) printed "postcast:
    interrupted", then asyncio's "exception was never retrieved" traceback and "Task was destroyed but it is
    pending!" for zarr reads cut off at interpreter shutdown (the system tier under load, 2026-11-26). The
    process's entry point silences asyncio's reports once the verb has ended."""
    proc = subprocess.run(
        [sys.executable, "-c", LEFTOVER_TASK, str(tmp_path / "absent.zarr")], capture_output=True, text=True
    )
    assert proc.returncode == 66, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("postcast: "), proc.stderr
