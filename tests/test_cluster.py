"""Ingest on a dask cluster started the way clusters start (issue 18): `dask scheduler --scheduler-file F`
and `dask worker --scheduler-file F` as separate processes on the loopback interface, as dask-jobqueue
and dask-mpi deploy them. The slow case SIGKILLs one of two workers half way and checks that the
store completes and equals the store ingested in one go."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from postcast.cli import main
from postcast.datasets import contract
from postcast.datasets.core.cluster import dask_client
from postcast.datasets.core.errors import MissingInputError
from postcast.datasets.ingest import run as ingest
from postcast.datasets.ingest.run import IngestConfig

DASK = shutil.which("dask", path=Path(sys.executable).parent)
START_CEILING_S = 300  # for the scheduler file and the workers: a generous ceiling on a loaded machine


class Cluster:
    """A scheduler and workers, each its own process group; every process is ended on ``close``."""

    def __init__(self, root: Path) -> None:
        self.file = root / "scheduler.json"
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []
        self.workers: list[subprocess.Popen[bytes]] = []

    def _start(self, *args: str) -> subprocess.Popen[bytes]:
        assert DASK is not None, "no `dask` command beside this Python: run scripts/setup.sh"
        log = open(self.root / f"{args[0]}-{len(self.procs)}.log", "wb")  # noqa: SIM115  (closed with the process)
        proc = subprocess.Popen(
            [str(DASK), *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.root
        )
        log.close()
        self.procs.append(proc)
        return proc

    def start(self, n_workers: int) -> Cluster:
        self._start(
            "scheduler", "--scheduler-file", str(self.file), "--host", "127.0.0.1", "--port", "0", "--no-dashboard"
        )
        _wait(lambda: self.file.exists() and bool(self.file.read_text().strip()), START_CEILING_S, "the scheduler file")
        for _ in range(n_workers):
            self.workers.append(
                self._start(
                    "worker",
                    "--scheduler-file",
                    str(self.file),
                    "--nworkers",
                    "1",
                    "--nthreads",
                    "1",
                    "--host",
                    "127.0.0.1",
                    "--no-dashboard",
                    "--memory-limit",
                    "0",
                )
            )
        from dask.distributed import Client

        with Client(scheduler_file=str(self.file), timeout=30) as client:
            client.wait_for_workers(n_workers, timeout=START_CEILING_S)
        return self

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL a process group (a worker's nanny and its worker process)."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill(proc)


def _wait(ready: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Callable[[int], Cluster]]:
    made: list[Cluster] = []

    def start(n_workers: int) -> Cluster:
        made.append(Cluster(tmp_path / f"cluster{len(made)}"))
        made[-1].root.mkdir()
        return made[-1].start(n_workers)

    try:
        yield start
    finally:
        for c in made:
            c.close()


def _assert_same_store(got: Path, want: Path) -> None:
    """Every array equal, statistics to float64 round-off (float32 per-point ones to a float32 ulp)."""
    a, b = contract.open_store(got), contract.open_store(want)
    assert set(a.data_vars) <= set(b.data_vars)  # ``got`` may hold fewer variables than ``want``
    for name in a.data_vars:
        np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=str(name))
    sa, sb = contract.open_statistics(got), contract.open_statistics(want)
    assert sa is not None and sb is not None and set(sa.data_vars) <= set(sb.data_vars)
    for name in sa.data_vars:
        g, w = sa[name].values, sb[name].values
        rtol = 1e-12 if w.dtype == np.float64 else 2.0**-23
        np.testing.assert_allclose(g, w, rtol=rtol, atol=0, err_msg=str(name))


def test_ingest_through_a_scheduler_file(cluster, synth_zarr, store, tmp_path):
    """The fast tier: a scheduler file (not an address) and one worker process, through the CLI in process."""
    c = cluster(1)
    out = tmp_path / "file.zarr"
    assert (
        main(
            [
                "--no-progress",
                "ingest",
                str(synth_zarr),
                "--out",
                str(out),
                "--scheduler",
                str(c.file),
                "--variables",
                "t,sst",
            ]
        )
        == 0
    )
    _assert_same_store(out, store)


@pytest.mark.parametrize(
    "content", [None, "", "{not json", json.dumps({"address": 5})], ids=["missing", "empty", "not-json", "no-address"]
)
def test_a_bad_scheduler_file_is_one_line_and_exit_66(content, synth_zarr, tmp_path, capsys):
    f = tmp_path / "scheduler.json"
    if content is not None:
        f.write_text(content)
    rc = main(["--no-progress", "ingest", str(synth_zarr), "--out", str(tmp_path / "s.zarr"), "--scheduler", str(f)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 66 and len(err) == 1 and "Traceback" not in err[0], err
    assert str(f) in err[0] and "dask scheduler --scheduler-file" in err[0]
    assert not (tmp_path / "s.zarr").exists()


def test_an_unreachable_scheduler_is_one_line_and_exit_66(tmp_path):
    """Nobody listens at the address (or at the one a stale scheduler file names): exit 66, like a missing
    input, as the scheduler may come up later (the CLI's one-line mapping of that error is tested above)."""
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stale = tmp_path / "scheduler.json"
    stale.write_text(json.dumps({"type": "Scheduler", "address": f"tcp://127.0.0.1:{port}"}))
    for scheduler in (f"tcp://127.0.0.1:{port}", str(stale)):
        with (
            pytest.raises(MissingInputError, match=f"no dask scheduler answers at tcp://127.0.0.1:{port}") as err,
            dask_client(scheduler, 1, connect_timeout=0.5),
        ):
            pass
        assert err.value.exit_code == 66 and "\n" not in str(err.value)


@pytest.mark.distributed
def test_a_killed_worker_and_a_rerun_give_the_store_of_one_go(cluster, synth_zarr, store, tmp_path):
    """Two worker processes, one date per task; SIGKILL one worker (nanny and all) once the first date is
    marked done; the run either finishes on the survivor or fails; a rerun completes the store, which equals
    the store ingested in one go (every array; statistics to round-off)."""
    c = cluster(2)
    out = tmp_path / "killed.zarr"
    done_dir = contract.partial_path(out) / "done"
    cfg = IngestConfig(
        source=str(synth_zarr),
        out=str(out),
        scheduler=str(c.file),
        progress=False,
        dates_per_task=1,
        checkpoint_dates=2,
    )  # the merge checkpoints run on the workers too
    failure: list[BaseException] = []

    def run() -> None:
        try:
            ingest.ingest(cfg)
        except Exception as err:  # a run may fail when its worker dies; the rerun must not
            failure.append(err)

    first = threading.Thread(target=run)
    first.start()
    try:
        _wait(
            lambda: not first.is_alive() or (done_dir.exists() and any(p.name[0] != "." for p in done_dir.iterdir())),
            600,
            "the first finished date",
        )
        assert first.is_alive(), f"ingest ended before the kill ({failure})"
        c.kill(c.workers[0])
        n_at_kill = sum(p.name[0] != "." for p in done_dir.iterdir())
        assert 0 < n_at_kill < 18
    finally:
        first.join(timeout=180)
    assert not first.is_alive()
    res = ingest.ingest(cfg)  # the rerun: completes what is left, or finds the store complete
    assert contract.is_complete(out) and not contract.partial_path(out).exists()
    assert res.skipped or res.n_written < 18
    _assert_same_store(out, store)


def test_an_interrupted_ingest_says_one_line_and_nothing_of_its_workers(synth_grib, tmp_path):
    """Issue 38 item 8: Ctrl-C reaches the whole process group, the local worker processes included; they
    printed heartbeat tracebacks and the nanny "still alive after 4.0 seconds, killing" warnings. Now the
    workers leave Ctrl-C to the driver, which shuts the cluster down: exit 130 and one line."""
    cmd = [sys.executable, "-m", "postcast", "ingest", str(synth_grib), "--out", str(tmp_path / "s.zarr")]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:  # the workers are up once the GRIB files are being indexed on them
        lines.append(line)
        if "indexing" in line:
            break
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal sends it: to every process of the group
    lines += proc.stderr.readlines()
    assert proc.wait(timeout=START_CEILING_S) == 130, "".join(lines)
    assert [ln for ln in lines if " INFO " not in ln] == ["postcast: interrupted\n"], "".join(lines)


def test_a_local_cluster_leaves_the_driver_environment_as_it_was(monkeypatch):
    """distributed's nanny sets its workers' OMP_NUM_THREADS=1 (and MKL, OpenBLAS, MALLOC_TRIM_THRESHOLD_) in
    the driver's own environment before it spawns them, and leaves them there: torch, started after an ingest
    in the same process (`postcast run`), then computed on one thread of two (tp24's EMOS fit 83 s, not 55)."""
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(key, raising=False)
    before = dict(os.environ)
    with dask_client(None, 1) as client:
        assert list(client.run(os.getenv, "OMP_NUM_THREADS").values()) == ["1"]  # the worker keeps its own
        during = dict(os.environ)
    assert during == before
    assert dict(os.environ) == before
