"""Bad-input cases of issue 56 (operations side) in the shared battery (tests/battery.py): scheduler addresses
of another protocol, a scheduler without a worker, synth values that divided by zero, pipeline keys the
validator let through, a checkpoint whose weights are NaN or whose settings contradict its weights, an
``--out`` on a read-only filesystem. Each: the exit code, exactly one error line, no traceback, and nothing
left that a reader would take for a result."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from battery import Outcome, assert_ok, in_process

from postcast.datasets import contract
from postcast.models.module import content_checksum

ROOT = Path(__file__).resolve().parents[1]
AT = ["--init-time", "2017-11-01"]  # a test date of the session store
TINY_SYNTH = {"seed": 3, "resolution": 10.0, "years": [2012, 2017], "dates_per_year": 3, "levels": [500, 850]}


# --- --scheduler --------------------------------------------------------------------------------------
@pytest.mark.battery
@pytest.mark.parametrize("verb", ["ingest", "evaluate", "forecast"])
def test_a_scheduler_address_of_another_protocol(verb, synth_zarr, store, t2m_ckpt, tmp_path, capsys):
    """``--scheduler http://...`` was exit 70 "unknown address scheme"; now 2 naming the forms accepted."""
    out = tmp_path / "out"
    argv = {
        "ingest": ["ingest", str(synth_zarr), "--out", str(out)],
        "evaluate": ["evaluate", str(store), "--checkpoints", str(t2m_ckpt), "--out", str(out), "--workers", "1"],
        "forecast": ["forecast", "--checkpoint", str(t2m_ckpt), "--input", str(synth_zarr), "--out", str(out)],
    }[verb]
    if verb == "forecast":
        argv += [*AT, "--workers", "1"]
    res = in_process([*argv, "--scheduler", "http://127.0.0.1:8786"], capsys)
    assert_ok(f"{verb}: --scheduler http://", res, not out.exists() or not any(out.rglob("*.nc")))
    line = res.error_lines[0]
    assert res.code == 2 and "http://" in line and "tcp://HOST:PORT" in line and "scheduler file" in line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def lone_scheduler(tmp_path: Path):
    """A real ``dask scheduler`` process with no worker: (its scheduler file, the process)."""
    file = tmp_path / "scheduler.json"
    cmd = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1"]
    cmd += ["--port", str(_free_port()), "--dashboard-address", ":0", "--scheduler-file", str(file)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120  # against a hang only
        while not (file.exists() and "address" in file.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.1)
        yield file, proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.battery
def test_a_scheduler_without_a_worker(synth_zarr, lone_scheduler, tmp_path, capsys, monkeypatch):
    """A live scheduler with no worker: the ingest waited forever, silently; now a warning after a short wait
    and exit 66 after a bounded one (shortened here to 3 s)."""
    monkeypatch.setenv("POSTCAST_WORKER_WAIT_S", "3")
    out, file = tmp_path / "s.zarr", lone_scheduler[0]
    start = time.monotonic()
    res = in_process(["ingest", str(synth_zarr), "--out", str(out), "--scheduler", str(file)], capsys)
    assert_ok("ingest: a scheduler without a worker", res, not contract.is_complete(out))
    assert res.code == 66 and "no worker" in res.error_lines[0] and "dask worker" in res.error_lines[0]
    assert time.monotonic() - start < 60


@pytest.mark.battery
def test_the_scheduler_dies_during_an_ingest(synth_zarr, lone_scheduler, tmp_path):
    """A real scheduler and worker; the scheduler is killed once the ingest has started its dates: exit 70
    "internal error: FutureCancelledError ... scheduler-connection-lost" with distributed's tracebacks; now one
    line, exit 66, saying to rerun to resume."""
    file, scheduler = lone_scheduler
    worker = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(file), "--nthreads", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    out = tmp_path / "s.zarr"
    argv = ["--no-progress", "--log-level", "ERROR", "ingest", str(synth_zarr), "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "postcast", *argv, "--scheduler", str(file)],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    try:
        deadline = time.monotonic() + 600  # against a hang only
        while not (contract.partial_path(out) / "plan.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the ingest did not start"
            time.sleep(0.05)
        scheduler.kill()
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
        worker.kill()
        worker.wait()
    res = Outcome(proc.returncode, err, frozenset({66}))
    assert_ok("ingest: the scheduler dies during the run", res, not contract.is_complete(out))
    assert "rerun to resume" in res.error_lines[0]


# --- config validate / run --dry-run ------------------------------------------------------------------
SYNTH_BAD = {
    "resolution 0.0": {"resolution": 0.0},
    "years reversed": {"years": [2017, 2012]},
    "dates_per_year 0": {"dates_per_year": 0},
    "levels []": {"levels": []},
}


@pytest.mark.battery
@pytest.mark.parametrize("case", list(SYNTH_BAD))
@pytest.mark.parametrize("verb", ["config validate", "run --dry-run"])
def test_bad_synth_values(tmp_path, capsys, monkeypatch, case, verb):
    """Each bad synth value alone, and the four at once (which was a ZeroDivisionError, exit 70)."""
    monkeypatch.chdir(tmp_path)
    cfg = {"kind": "pipeline", "workdir": str(tmp_path / "work"), "synth": {**TINY_SYNTH, **SYNTH_BAD[case]}}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    argv = ["config", "validate", str(path)] if verb == "config validate" else ["run", str(path), "--dry-run"]
    res = in_process(argv, capsys)
    assert_ok(f"{verb}: synth {case}", res, not (tmp_path / "work" / "synth").exists())
    assert res.code == 2 and case.split()[0] in res.error_lines[0]


@pytest.mark.battery
def test_bad_synth_values_all_at_once(tmp_path, capsys):
    cfg = {"kind": "pipeline", "synth": {**TINY_SYNTH, **{k: v for d in SYNTH_BAD.values() for k, v in d.items()}}}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = in_process(["config", "validate", str(path)], capsys)
    assert_ok("config validate: every synth value bad", res)
    assert res.code == 2 and "resolution 0.0" in res.error_lines[0]


PIPELINE_BAD = {  # key -> (value, a word of the line)
    "forecast_from": ({"forecast_from": "not-a-date"}, "not-a-date"),
    "forecast_to": ({"forecast_from": "2017-06-01", "forecast_to": "2017-01-01"}, "before"),
    "bootstrap": ({"bootstrap": -5}, "-5"),
    "workers": ({"workers": 0}, "workers=0"),
    "train_args": ({"train_args": ["--model.lr"]}, "--model.lr"),
}


@pytest.mark.battery
@pytest.mark.parametrize("case", list(PIPELINE_BAD))
def test_pipeline_keys_the_stages_refuse(tmp_path, capsys, case):
    """`config validate` said "ok" for each; the stage refused it only after training and evaluation had run."""
    values, word = PIPELINE_BAD[case]
    cfg = {"kind": "pipeline", "workdir": str(tmp_path / "work"), "synth": TINY_SYNTH, **values}
    cfg["train"] = [str(ROOT / "configs/train/tiny_emos_t2m.yaml")]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = in_process(["config", "validate", str(path)], capsys)
    assert_ok(f"config validate: pipeline {case}", res)
    assert res.code == 2 and case in res.error_lines[0] and word in res.error_lines[0], res.error_lines


# --- checkpoints ----------------------------------------------------------------------------------------
def _resigned(src: Path, out: Path, change) -> Path:
    """A copy of checkpoint ``src`` changed by ``change(ckpt)`` and signed again (a valid checksum)."""
    ckpt = torch.load(src, map_location="cpu", weights_only=True)
    change(ckpt)
    ckpt["postcast"]["checksum"] = content_checksum(ckpt, ckpt["postcast"])
    torch.save(ckpt, out)
    return out


@pytest.mark.battery
def test_evaluate_a_checkpoint_whose_weights_are_nan(t2m_ckpt, store, tmp_path, capsys):
    """A diverged training's weights (NaN): exit 70 in the reliability binning; now 65 naming the outputs."""

    def nan_weights(ckpt):
        ckpt["state_dict"]["net.coef"] = torch.full_like(ckpt["state_dict"]["net.coef"], float("nan"))

    bad = _resigned(t2m_ckpt, tmp_path / "nan.ckpt", nan_weights)
    out = tmp_path / "eval"
    res = in_process(["evaluate", str(store), "--checkpoints", str(bad), "--out", str(out)], capsys)
    assert_ok("evaluate: a checkpoint whose weights are NaN", res, not (out / "metrics.json").exists())
    line = res.error_lines[0]
    assert res.code == 65 and str(bad) in line and "non-finite" in line and "net.coef" in line


def _family(ckpt):
    ckpt["hyper_parameters"]["distribution"] = "csg"  # 3 head outputs: a third coefficient the weights lack


def _layout(ckpt):
    for sample in (ckpt["hyper_parameters"]["sample"], ckpt["postcast"]["sample"]):
        sample["variables"] = ["t2m", "msl"]  # 2 input fields: the statistics of 2, not of every variable


@pytest.mark.battery
@pytest.mark.parametrize("what", ["family", "layout"])
def test_a_checkpoint_whose_settings_contradict_its_weights(t2m_ckpt, store, synth_zarr, tmp_path, capsys, what):
    """Settings re-signed over another model's weights: "size mismatch for norm_mean", 'Missing key(s)
    "net.extra"' (exit 70); now 65 naming the mismatch, for evaluate and forecast."""
    bad = _resigned(t2m_ckpt, tmp_path / f"{what}.ckpt", {"family": _family, "layout": _layout}[what])
    for verb, argv in {
        "evaluate": ["evaluate", str(store), "--checkpoints", str(bad)],
        "forecast": ["forecast", "--checkpoint", str(bad), "--input", str(synth_zarr), *AT],
    }.items():
        res = in_process([*argv, "--out", str(tmp_path / verb)], capsys)
        assert_ok(f"{verb}: a checkpoint whose {what} contradicts its weights", res, not any(tmp_path.rglob("*.nc")))
        line = res.error_lines[0]
        assert res.code == 65 and str(bad) in line and "weights" in line, line


# --- read-only output ---------------------------------------------------------------------------------
def _read_only_case(argv: list[str], ro: Path) -> Outcome:
    """``postcast ARGV`` in a mount namespace of its own in which ``ro`` is a read-only tmpfs."""
    script = f'mount -t tmpfs -o ro tmpfs "{ro}" && exec "$@"'
    cmd = ["unshare", "-m", "sh", "-c", script, "sh", sys.executable, "-m", "postcast", "--no-progress"]
    proc = subprocess.run(
        [*cmd, "--log-level", "ERROR", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    return Outcome(proc.returncode, proc.stderr, frozenset({74}))


@pytest.fixture
def read_only(tmp_path: Path) -> Path:
    ro = tmp_path / "ro"
    ro.mkdir()
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o ro tmpfs "{ro}"'], check=False)
    if shutil.which("unshare") is None or probe.returncode != 0:
        pytest.skip("no mount namespace here (unshare -m and mount need CAP_SYS_ADMIN)")
    return ro


@pytest.mark.battery
@pytest.mark.parametrize("verb", ["evaluate", "forecast"])
def test_out_on_a_read_only_filesystem(verb, read_only, store, synth_zarr, t2m_ckpt):
    """``--out`` on a read-only filesystem (OSError EROFS) was exit 70; now 74 naming the folder."""
    out = read_only / "out"
    argv = {
        "evaluate": ["evaluate", str(store), "--checkpoints", str(t2m_ckpt), "--bootstrap", "10"],
        "forecast": ["forecast", "--checkpoint", str(t2m_ckpt), "--input", str(synth_zarr), *AT],
    }[verb]
    res = _read_only_case([*argv, "--out", str(out)], read_only)
    assert_ok(f"{verb}: --out on a read-only filesystem", res, not out.exists())
    assert "read-only" in res.error_lines[0] and str(read_only) in res.error_lines[0]
