"""An evaluation reads each checkpoint once per process (issue 57 item 3): the verb opens it (torch.load, SHA-256,
network built) and hands the opened model and its sample spec down; a dask worker process reads it once, however
many of its tasks predict with it. Before, one checkpoint was read about 3 + dates/4 times per lead.

Reads are counted through :func:`postcast.models.module.read_checkpoint`, the one gate every use of a checkpoint
goes through, wrapped so that each call is recorded and then made as before (in this process, and installed in
each worker process of a LocalCluster the test starts)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import cloudpickle
import pytest

from postcast.datasets import contract
from postcast.models import module
from postcast.pipeline.verify.evaluate import EvalConfig, evaluate

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the spies below run in the worker processes too


def count_reads() -> list[str]:
    """Wrap this process's :func:`read_checkpoint`: every call recorded (its path), then made unchanged."""
    real: Callable[[str], dict[str, Any]] = module.read_checkpoint
    calls: list[str] = []

    def counted(path: str) -> dict[str, Any]:
        calls.append(path)
        return real(path)

    counted.calls = calls  # type: ignore[attr-defined]
    module.read_checkpoint = counted  # type: ignore[assignment]
    return calls


def reads_here() -> int:
    return len(module.read_checkpoint.calls)  # type: ignore[attr-defined]


def test_one_read_in_this_process(store, t2m_ckpt, tmp_path, monkeypatch):
    monkeypatch.setattr(module, "read_checkpoint", module.read_checkpoint)  # restored after the test
    calls = count_reads()
    dates = contract.split_rows(contract.open_store(str(store)), "test").size
    cfg = EvalConfig(str(store), (str(t2m_ckpt),), targets=("t2m",), out=str(tmp_path), bootstrap=50, workers=0)
    res = evaluate(cfg)
    assert dates > 4  # more than one task of dates: each predicted the checkpoint on its own dates
    assert len(res["targets"]["t2m"]["forecasts"]) == 3  # raw, oracle and the checkpoint were scored
    assert calls == [str(t2m_ckpt)], f"{len(calls)} reads of one checkpoint over {dates} test dates"


@pytest.mark.distributed
def test_one_read_per_worker_process(store, t2m_ckpt, tmp_path, monkeypatch):
    from dask.distributed import Client, LocalCluster

    monkeypatch.setattr(module, "read_checkpoint", module.read_checkpoint)
    calls = count_reads()
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        client.run(count_reads)
        cfg = EvalConfig(
            str(store), (str(t2m_ckpt),), out=str(tmp_path), bootstrap=50, scheduler=cluster.scheduler_address
        )
        res = evaluate(cfg)
        per_worker = client.run(reads_here)
    assert len(res["targets"]["t2m"]["forecasts"]) == 3
    assert len(calls) == 1, f"{len(calls)} reads in the driver"
    assert sum(per_worker.values()) >= 1 and max(per_worker.values()) <= 1, f"reads per worker: {per_worker}"


def test_a_checkpoint_for_a_target_not_evaluated_is_a_usage_error(cli, store, t2m_ckpt, tmp_path):
    """The check the verb made by opening each checkpoint once more is now made where evaluation opens it."""
    proc = cli("evaluate", str(store), "--checkpoints", str(t2m_ckpt), "--targets", "t850", "--out", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{t2m_ckpt}: a checkpoint for t2m, but --targets is t850; add t2m or drop it" in proc.stderr
