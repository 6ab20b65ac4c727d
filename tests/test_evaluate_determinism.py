"""Evaluation is deterministic (issue 56 item 3): the same checkpoint on the same store gives bit-identical
``metrics.json`` and ``results.nc`` in this process, on a LocalCluster of 1 or 2 worker processes and of 1 or 2
worker threads. (Issue 56 saw ``crps_weighted`` 0.7496568 with another evaluate running beside and 0.7496574
alone, on the checkpoint's 4-date batch only: its prediction, not the scoring, changed.)

The checkpoint is a pointwise MLP (1x1 convolutions): a convolution's float32 sums are split over torch's
intra-op threads (MKL's GEMM), so its outputs differ in the last bits between 1 thread (a dask worker process,
started with OMP_NUM_THREADS=1) and 2 (this process on 2 cores, or a thread worker in it); the local EMOS,
elementwise only, cannot show it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from postcast.pipeline import train
from postcast.pipeline.verify.evaluate import EvalConfig, evaluate

ROOT = Path(__file__).resolve().parents[1]

MODES = {  # name -> (workers, processes)
    "here": (0, True),
    "1 process": (1, True),
    "2 processes": (2, True),
    "1 thread": (1, False),
    "2 threads": (2, False),
}
DISTRIBUTED = pytest.mark.distributed  # worker processes: the distributed tier


def outputs(store: Path, checkpoint: Path, out: Path, workers: int, processes: bool) -> dict[str, str]:
    """SHA-256 of metrics.json and results.nc of one evaluation (the store path is the same in each)."""
    cfg = EvalConfig(
        store=str(store),
        checkpoints=(str(checkpoint),),
        out=str(out),
        bootstrap=200,
        workers=workers,
        processes=processes,
    )
    evaluate(cfg)
    return _hashes(out)


@pytest.fixture(scope="module")
def mlp_ckpt(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The T2m MLP preset (2 x 256 hidden, embedding 32) trained for 1 epoch on the session store."""
    root = tmp_path_factory.mktemp("mlp")
    args = ["fit", "-c", str(ROOT / "configs/train/mlp_t2m.yaml"), "--data.cfg.store", str(store)]
    args += ["--trainer.default_root_dir", str(root), "--trainer.max_epochs", "1", "--trainer.enable_progress_bar"]
    cli = train.run([*args, "false", "--trainer.enable_model_summary", "false"])
    assert cli.trainer.checkpoint_callback is not None
    return Path(cli.trainer.checkpoint_callback.best_model_path)


@pytest.fixture(scope="module")
def reference(store: Path, mlp_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return outputs(store, mlp_ckpt, tmp_path_factory.mktemp("here"), 0, True)


@pytest.mark.parametrize(
    "mode", [pytest.param(m, marks=[DISTRIBUTED] if MODES[m][1] else []) for m in MODES if m != "here"]
)
def test_the_same_bits_on_any_cluster(store, mlp_ckpt, tmp_path, reference, mode):
    workers, processes = MODES[mode]
    got = outputs(store, mlp_ckpt, tmp_path / "eval", workers, processes)
    assert got == reference, f"{mode}: {got} != in this process {reference}"
    metrics = json.loads((tmp_path / "eval/metrics.json").read_text())
    assert len(metrics["targets"]["t2m"]["forecasts"]) == 3  # raw, oracle and the checkpoint were scored


def _evaluate_process(store: Path, checkpoint: Path, out: Path) -> subprocess.Popen[str]:
    """``postcast evaluate`` as its own process (a small store: scored in that process, as the pipeline does)."""
    argv = ["evaluate", str(store), "--checkpoints", str(checkpoint), "--out", str(out), "--bootstrap", "200"]
    return subprocess.Popen(
        [sys.executable, "-m", "postcast", "--no-progress", "--log-level", "ERROR", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _hashes(out: Path) -> dict[str, str]:
    return {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in ("metrics.json", "results.nc")}


def test_the_same_bits_beside_a_busy_cpu_and_another_evaluate(store, mlp_ckpt, tmp_path, reference):
    """``postcast evaluate`` processes: one alone, one beside a process burning every core, two at once; each
    writes the bits of the evaluation in this process."""
    runs: dict[str, list[subprocess.Popen[str]]] = {}
    runs["alone"] = [_evaluate_process(store, mlp_ckpt, tmp_path / "alone")]
    runs["alone"][0].wait(timeout=600)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
    try:
        runs["busy"] = [_evaluate_process(store, mlp_ckpt, tmp_path / "busy")]
        runs["busy"][0].wait(timeout=600)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    runs["pair"] = [_evaluate_process(store, mlp_ckpt, tmp_path / f"pair{i}") for i in range(2)]
    for name, procs in runs.items():
        for proc in procs:
            _, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, f"{name}: {err[-2000:]}"
    for out in ("alone", "busy", "pair0", "pair1"):
        assert _hashes(tmp_path / out) == reference, out
