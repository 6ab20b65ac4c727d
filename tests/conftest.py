"""Shared fixtures: small synthetic ENS-10 datasets written once per session through the real writers."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import shutil
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

# Triton kernels run on the CPU through the interpreter; the variable is read when a kernel is
# decorated, so it is set before anything imports postcast.models.kernels.triton_impl.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from postcast.cli import main
from postcast.datasets.ingest.run import IngestConfig, ingest
from postcast.datasets.synth import synthfiles
from postcast.datasets.synth.synthetic import SynthConfig

# Small but complete: 10 deg grid (19 x 36), 2 levels, 6 years x 3 month-days (Feb, Jul, Oct) = 18 dates,
# covering the train (2012-2013), val (2014-2015) and test (2016-2017) splits.
pytest_plugins = ["tiers", "battery"]  # tests/tiers.py: the unit tier; tests/battery.py: the battery's tally

ROOT = Path(__file__).resolve().parents[1]
TINY = SynthConfig(seed=3, resolution=10.0, years=(2012, 2017), dates_per_year=3, levels=(500, 850))


# A runner started in the background by a non-interactive shell (`.ci/run &`, nohup) has SIGINT ignored, and
# every process it starts inherits that: the tests that interrupt a postcast process with SIGINT then saw it
# run on to the end (exit 0, or a training killed after 300 s). The tests' processes get Ctrl-C as a terminal's.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

MYPY: list[subprocess.Popen[str]] = []  # the mypy run of test_quality.py::test_mypy_clean, once started


def start_mypy() -> subprocess.Popen[str]:
    """``python -m mypy`` over the package (its config: pyproject.toml), output captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "mypy"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """mypy, when its test is selected, starts now in its own process: on a cold cache it takes about 25 s of a
    core, which it spends beside the tests instead of after them (test_mypy_clean collects the result)."""
    xdist_worker = "PYTEST_XDIST_WORKER" in os.environ  # every worker collects every test: none starts it early
    if not xdist_worker and any(item.nodeid.endswith("test_quality.py::test_mypy_clean") for item in items):
        MYPY.append(start_mypy())


@pytest.fixture
def mypy_result() -> tuple[int, str]:
    """(exit code, output) of mypy over the package: the run started at collection, else one started now."""
    proc = MYPY.pop() if MYPY else start_mypy()
    out, _ = proc.communicate(timeout=900)
    return proc.returncode, out


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A mypy run nobody collected (the session stopped early) is stopped with it."""
    for proc in MYPY:
        proc.kill()
        proc.communicate()


def run_cli(*args: str, check: bool = False, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the ``postcast`` command in this process: :func:`postcast.cli.main` with stdout and stderr
    captured, answered like a process (exit code; an escaped exception is exit 1 with its traceback on
    stderr). Importing torch and Lightning costs 8 s a process, so the CLI's behaviour is tested here;
    tests whose subject is the process itself (signals, kill and resume, the installed entry point,
    servers) start real ones. ``timeout`` is pytest-timeout's job in-process (kept for the signature)."""
    out, err = io.StringIO(), io.StringIO()
    environ = dict(os.environ)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["--no-progress", *args])
        except SystemExit as stop:  # argparse and the Lightning CLI's parser exit
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except Exception:
            traceback.print_exc()
            code = 1
        finally:
            os.environ.clear()  # a verb may export settings for its workers (serve, ingest)
            os.environ.update(environ)
    proc = subprocess.CompletedProcess(["postcast", *args], code, out.getvalue(), err.getvalue())
    if check and proc.returncode != 0:
        raise AssertionError(f"postcast {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def run_process(*args: str, check: bool = False, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the real ``postcast`` entry point in a subprocess (where the process is the subject)."""
    proc = subprocess.run(
        [sys.executable, "-m", "postcast", "--no-progress", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"postcast {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def planted_bug(*args, **kwargs):
    raise RuntimeError("planted bug")


@pytest.fixture
def internal_error(tmp_path, monkeypatch):
    """(planted_bug, check): a function that raises a plain RuntimeError, to be planted where a bug could be,
    and ``check(proc)``, which asserts the command's answer to it. Logs go to tmp_path/logs."""
    monkeypatch.setenv("POSTCAST_LOG_DIR", str(tmp_path / "logs"))
    return planted_bug, lambda proc: assert_internal_error(proc, tmp_path / "logs")


def assert_internal_error(proc, log_dir):
    """Exit 70, one line naming the log file, no traceback on stderr; the file holds the traceback."""
    assert proc.returncode == 70, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("postcast:")]
    assert lines == [ln for ln in lines if ln.startswith("postcast: internal error: RuntimeError: planted bug")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr and "please report" in lines[0]
    logs = list(log_dir.glob("internal-error-*.log"))
    assert len(logs) == 1 and str(logs[0]) in lines[0]
    text = logs[0].read_text()
    assert "Traceback (most recent call last)" in text and "planted bug" in text and "planted_bug" in text


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Path]) -> Path:
    """``build(folder)``'s result, built once per test run: here without pytest-xdist; under it by the
    first worker that asks, in a folder every worker of the run shares (the parent of the workers' own
    temporary roots), while the others wait on a file lock and then take the same result. The session's
    data is read-only to the tests, so the workers share it instead of building it once each."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent / f"session-{name}"
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when a worker dies
        made = shared / ".built"
        if not made.exists():
            shutil.rmtree(shared, ignore_errors=True)  # a build another worker started and did not finish
            shared.mkdir()
            made.write_text(str(build(shared).relative_to(shared)))
        return shared / made.read_text()


@pytest.fixture(scope="session")
def tiny_cfg() -> SynthConfig:
    return TINY


@pytest.fixture(scope="session")
def synth_zarr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    def build(root: Path) -> Path:
        synthfiles.write_synthetic(TINY, root / "zarr", progress=False)
        return root / "zarr"

    return built_once(tmp_path_factory, "synth_zarr", build)


@pytest.fixture(scope="session")
def synth_grib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_once(tmp_path_factory, "synth_grib", lambda root: _tiny_as(root, "grib"))


@pytest.fixture(scope="session")
def synth_netcdf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TINY as ENS-10 netCDF files (one pair per month-day, each holding six years of dates)."""
    return built_once(tmp_path_factory, "synth_netcdf", lambda root: _tiny_as(root, "netcdf"))


def _tiny_as(root: Path, fmt: str) -> Path:
    """TINY written in ``fmt`` (grib or netcdf) under ``root/fmt``."""
    cfg = SynthConfig(**{**TINY.to_dict(), "format": fmt, "years": tuple(TINY.years), "levels": tuple(TINY.levels)})
    synthfiles.write_synthetic(cfg, root / fmt, progress=False)
    return root / fmt


@pytest.fixture(scope="session")
def store(synth_zarr: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    def build(root: Path) -> Path:
        ingest(IngestConfig(source=str(synth_zarr), out=str(root / "store.zarr"), processes=False, progress=False))
        return root / "store.zarr"

    return built_once(tmp_path_factory, "store", build)


@pytest.fixture(scope="session")
def derived_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 10 deg store of 2010-2015 (24 training dates 2010-2013, 12 validation dates 2014-2015; no test split)
    with the truths of t2m, ws10 and tp24 (synthetic targets opt in)."""
    cfg = SynthConfig(
        seed=7, resolution=10.0, years=(2010, 2015), dates_per_year=6, levels=(850,), targets=("t2m", "ws10", "tp24")
    )

    def build(root: Path) -> Path:
        synthfiles.write_synthetic(cfg, root / "raw", progress=False)
        ingest(IngestConfig(source=str(root / "raw"), out=str(root / "store.zarr"), processes=False, progress=False))
        return root / "store.zarr"

    return built_once(tmp_path_factory, "derived_store", build)


@pytest.fixture(scope="session")
def cli():
    """``cli("ingest", ...)`` runs the ``postcast`` command in this process (:func:`run_cli`)."""
    return run_cli


@pytest.fixture
def process():
    """``process("train", ...)`` runs ``python -m postcast`` as a real process (:func:`run_process`): for
    DDP on several processes, whose launcher starts the other ranks by re-running the command line (in this
    process that is pytest's)."""
    return run_process


@pytest.fixture(scope="session")
def t2m_ckpt(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny local-EMOS T2m checkpoint (1 epoch) on the session store, shared by the battery files."""
    from postcast.pipeline import train

    def build(root: Path) -> Path:
        cli = train.run(
            [
                "fit",
                "-c",
                str(ROOT / "configs/train/tiny_emos_t2m.yaml"),
                "--data.cfg.store",
                str(store),
                "--trainer.default_root_dir",
                str(root / "runs"),
                "--trainer.max_epochs",
                "1",
                "--trainer.enable_model_summary",
                "false",
            ]
        )
        assert cli.trainer.checkpoint_callback is not None
        return Path(cli.trainer.checkpoint_callback.best_model_path)

    return built_once(tmp_path_factory, "t2m_ckpt", build)


@pytest.fixture(scope="session")
def artefact(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small neural-field artefact of the store's T850 truth, shared by the battery files."""

    def build(root: Path) -> Path:
        out = root / "t850.pcnf"
        args = ["compress", str(store), "--var", "truth_t850", "--width", "8", "--depth", "1", "--steps", "5"]
        assert main(["--no-progress", *args, "--out", str(out)]) == 0
        return out

    return built_once(tmp_path_factory, "artefact", build)
