"""Issue 37 item 5: the engines started the way users start them, on the loopback interface.

* dask: `dask scheduler --scheduler-file F` and two `dask worker --scheduler-file F` processes (the form
  dask-jobqueue and dask-mpi deploy), the workers awaited with the client's ``wait_for_workers``, then
  `postcast ingest`, `evaluate` and `forecast --scheduler F`, each as its own process; both workers run
  date tasks, the store equals the one ingested on a LocalCluster, scores and forecasts those made here.
* torchrun: `torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT`
  twice (one per "node", ``--node-rank`` 0 and 1; gloo), training the tiny MLP with one date per rank; its
  weights equal those of the one-process DDP run (torchrun, one node) with the same seed and the same
  global batch of two dates, to float32 round-off (the gradient of a global batch is averaged across
  ranks instead of within one)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import xarray as xr
from test_cluster import Cluster, _assert_same_store

from postcast.models.module import read_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = shutil.which("torchrun", path=Path(sys.executable).parent)
CEILING_S = 600  # a generous ceiling for one launch on the shared 2-core machine


def _postcast(*args: str) -> None:
    """The ``postcast`` command as its own process (as a user runs it on a login node)."""
    cmd = [sys.executable, "-m", "postcast", "--no-progress", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CEILING_S, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.distributed
def test_ingest_evaluate_and_forecast_through_a_scheduler_file(synth_zarr, store, t2m_ckpt, cli, tmp_path):
    """Ingest, evaluate and forecast, each given ``--scheduler F``, on the same two worker processes: the
    store equals the LocalCluster one, the scores and the forecasts equal those computed in this process."""
    from dask.distributed import Client

    (tmp_path / "cluster").mkdir()
    cluster = Cluster(tmp_path / "cluster").start(2)
    sched = ("--scheduler", str(cluster.file))
    out, ev, fc = tmp_path / "s.zarr", tmp_path / "eval", tmp_path / "fc"
    try:
        _postcast("ingest", str(synth_zarr), "--out", str(out), *sched, "--variables", "t,sst")
        with Client(scheduler_file=str(cluster.file), timeout=30) as client:
            done = client.run(lambda dask_worker: dask_worker.state.executed_count)
        assert len(done) == 2 and min(done.values()) > 0, done  # both workers ran tasks
        _postcast("evaluate", str(store), "--targets", "t850", "--bootstrap", "50", "--out", str(ev), *sched)
        window = ("--init-time", "2017-01-01", "--end", "2017-12-31")
        _postcast(
            "forecast", "--checkpoint", str(t2m_ckpt), "--input", str(synth_zarr), *window, "--out", str(fc), *sched
        )
    finally:
        cluster.close()
    _assert_same_store(out, store)
    here = tmp_path / "here"
    cli(
        "evaluate",
        str(store),
        "--targets",
        "t850",
        "--bootstrap",
        "50",
        "--out",
        str(here / "eval"),
        "--workers",
        "0",
        check=True,
    )
    xr.testing.assert_identical(xr.open_dataset(ev / "results.nc"), xr.open_dataset(here / "eval" / "results.nc"))
    cli(
        "forecast",
        "--checkpoint",
        str(t2m_ckpt),
        "--input",
        str(synth_zarr),
        *window,
        "--out",
        str(here / "fc"),
        "--workers",
        "0",
        check=True,
    )
    written = sorted(p.relative_to(fc) for p in fc.rglob("*.nc"))
    assert written and written == sorted(p.relative_to(here / "fc") for p in (here / "fc").rglob("*.nc"))
    for rel in written:
        xr.testing.assert_equal(xr.open_dataset(fc / rel), xr.open_dataset(here / "fc" / rel))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(nnodes: int, node_rank: int, port: int, root: Path, store: Path, batch: int) -> subprocess.Popen[str]:
    """One torchrun "node": a postcast training of the tiny MLP (2 epochs), DDP on gloo."""
    assert TORCHRUN is not None, "no `torchrun` beside this Python: run scripts/setup.sh"
    launch = (
        f"--nnodes {nnodes} --nproc-per-node 1 --node-rank {node_rank} --rdzv-backend c10d "
        f"--rdzv-endpoint 127.0.0.1:{port} --rdzv-conf is_host={int(node_rank == 0)} --max-restarts 0"
    )
    fit = (
        f"-m postcast --no-progress train fit -c {ROOT / 'configs/train/mlp_t850.yaml'} --data.cfg.store {store} "
        f"--data.cfg.batch_size {batch} --trainer.max_epochs 2 --trainer.num_nodes {nnodes} --trainer.devices 1 "
        f"--trainer.strategy ddp --trainer.default_root_dir {root} --trainer.enable_progress_bar false "
        "--seed_everything 7"
    )
    args = [TORCHRUN, *launch.split(), *fit.split()]  # the test's paths hold no spaces
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "GLOO_SOCKET_IFNAME": "lo"}
    log = root / f"node{node_rank}.log"
    root.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        return subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, text=True, env=env, cwd=root)


def _weights(root: Path) -> dict[str, torch.Tensor]:
    """The float tensors of the last checkpoint; 2 epochs of 3 global batches (6 training dates, 2 a batch):
    two nodes that did not form one world would each take 6 steps an epoch."""
    (last,) = root.rglob("last.ckpt")
    ck = read_checkpoint(str(last))  # the verified reader: weights_only, checksum
    assert ck["epoch"] == 1 and ck["global_step"] == 6, (ck["epoch"], ck["global_step"])
    return {k: v for k, v in ck["state_dict"].items() if v.is_floating_point()}


def _wait(procs: list[subprocess.Popen[str]], root: Path) -> None:
    for p in procs:
        rc = p.wait(timeout=CEILING_S)
        logs = "\n".join(f.read_text()[-3000:] for f in sorted(root.glob("node*.log")))
        assert rc == 0, logs


@pytest.mark.distributed
def test_torchrun_on_two_nodes_gives_the_weights_of_one_process(store, tmp_path):
    two, one = tmp_path / "two", tmp_path / "one"
    port = _free_port()
    _wait([_torchrun(2, r, port, two, store, batch=1) for r in (0, 1)], two)
    _wait([_torchrun(1, 0, _free_port(), one, store, batch=2)], one)
    a, b = _weights(two), _weights(one)
    assert a.keys() == b.keys() and a
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
