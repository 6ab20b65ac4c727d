"""Public testing API of the training plugins: a multi-process harness and the rank programs that
check the plugins' invariants on real gloo process groups.

* :func:`launch` starts ``world`` spawned processes, each with a gloo process group over a fresh
  FileStore (no ports) and a timeout on every collective, runs ``fn(rank, world, *args)`` on each and
  returns the results by rank; a rank that fails or hangs past ``timeout_s`` gets every process
  killed and its error raised. Use it for any distributed check of your own (``fn`` must be a
  module-level function of an importable module).
* The ``prog_*`` functions run on every rank and return plain data; ``tests/test_plugins.py`` asserts
  on it (``prog_two_ranks`` and ``prog_four_ranks`` bundle the checks for 2 and 4 ranks).

This module lives in the package, not under ``tests/``, on purpose: spawned processes import
``fn`` by its module name, and ``postcast.models.plugins.testing`` is importable from any process,
whereas the test modules (collected with ``--import-mode=importlib``, not on ``sys.path``) are not.
"""

from __future__ import annotations

import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from postcast.models.plugins import eager_sgd, lion, topk, wagma
from postcast.models.plugins.ddp import CommDDPStrategy

COLLECTIVE_TIMEOUT_S = 60.0


def _entry(fn: Callable[..., Any], rank: int, world: int, store: str, out: Any, args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    try:
        out.put((rank, "ok", fn(rank, world, *args)))
    except BaseException:
        out.put((rank, "error", traceback.format_exc()))
        raise
    finally:
        dist.destroy_process_group()


def launch(fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 120.0) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` gloo ranks; the per-rank results, by rank."""
    ctx = mp.get_context("spawn")
    results: dict[int, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "store")
        out = ctx.Queue()
        procs = [ctx.Process(target=_entry, args=(fn, r, world, store, out, args), daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        try:
            while len(results) < world:
                try:
                    rank, status, value = out.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
                except queue.Empty:
                    dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                    if dead or time.monotonic() > deadline:
                        msg = f"ranks did not finish (exit codes {[p.exitcode for p in procs]}, timeout {timeout_s} s)"
                        raise RuntimeError(msg) from None
                    continue
                if status == "error":
                    msg = f"rank {rank} failed:\n{value}"
                    raise RuntimeError(msg)
                results[rank] = value
            for p in procs:
                p.join(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(5)
    return [results[r] for r in range(world)]


def _dyadic(n: int, gen: torch.Generator) -> torch.Tensor:
    """(n,) multiples of 1/8 in [-8, 8): sums and halvings are exact in float32, whatever the order."""
    return torch.randint(-64, 64, (n,), generator=gen).float() / 8


def _gathered(x: torch.Tensor) -> list[torch.Tensor]:
    every = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(every, x)
    return every


def prog_sparse(rank: int, world: int, n: int = 400, steps: int = 12) -> dict[str, Any]:
    """Top-k and Ok-Topk: k = n equals the dense all-reduce; conservation; Ok-Topk band and invariant."""
    gen = torch.Generator().manual_seed(100 + rank)
    res: dict[str, Any] = {}
    x = _dyadic(n, gen)
    dense = x.clone()
    dist.all_reduce(dense)
    dense /= world
    mean, residual = topk.topk_allreduce(x.clone(), n)
    res["topk_k_eq_n"] = bool(torch.equal(mean, dense)) and not bool(residual.any())
    st = topk.OkTopkBucket(residual=torch.zeros(n))
    mean, residual = topk.oktopk_allreduce(x.clone(), n, st)
    res["oktopk_density1"] = bool(torch.equal(mean, dense)) and not bool(residual.any())
    # error feedback over several steps: applied sums + what is left = what was computed
    k = n // 20
    for method in ("topk", "oktopk"):
        residual, applied, raw = torch.zeros(n), torch.zeros(n), torch.zeros(n)
        st = topk.OkTopkBucket(residual=torch.zeros(n))
        nnz, invariant = [], True
        for _ in range(steps):
            g = torch.randn(n, generator=gen)  # no ties: the Ok-Topk band is exact on exact steps
            raw += g
            acc = g + residual
            if method == "topk":
                mean, residual = topk.topk_allreduce(acc, k)
            else:
                mean, residual = topk.oktopk_allreduce(acc, k, st, recompute_every=4, repartition_every=8)
                nnz.append(st.last_nnz)
                sent = acc - residual  # entries this rank sent that were kept globally
                dist.all_reduce(sent)
                invariant &= bool(torch.allclose(sent, mean * world, atol=1e-5))
                assert st.global_thr is not None
                kept = mean != 0
                invariant &= bool((mean[kept].abs() * world >= st.global_thr - 1e-5).all())
            applied += mean
        left, computed = residual.clone(), raw.clone()
        dist.all_reduce(left)
        dist.all_reduce(computed)
        res[f"{method}_conservation_err"] = float((applied * world + left - computed).abs().max())
        if method == "oktopk":
            res["oktopk_nnz"], res["oktopk_k"], res["oktopk_invariant"] = nnz, k, invariant
    return res


def prog_lion(rank: int, world: int) -> dict[str, Any]:
    """Votes equal sign(sum of signs) (8-bit and 1-bit); Lion Cub keeps replicas identical."""
    gen = torch.Generator().manual_seed(7 + rank)
    u = torch.randint(-1, 2, (203,), generator=gen).float()  # (203,) in {-1, 0, 1}
    want = torch.sign(torch.stack(_gathered(u)).sum(0))
    u1 = torch.where(u == 0, torch.ones_like(u), u)  # 1-bit votes carry no zeros
    want1 = torch.sign(torch.stack(_gathered(u1)).sum(0))
    res: dict[str, Any] = {
        "vote8": bool(torch.equal(lion.vote(u, bits=8), want)),
        "vote1": bool(torch.equal(lion.vote(u1, bits=1), want1)),
    }
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    opt = lion.LionCub(model.parameters(), lr=0.01, bits=8, momentum_sync_every=2)
    for _ in range(5):
        x = torch.randn(16, 5, generator=gen)  # different data per rank
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    res["lion_replicas_equal"] = all(torch.equal(flat, other) for other in _gathered(flat))
    res["lion_bytes_per_step"] = opt.counter.bytes_sent / 5
    return res


def prog_eager(rank: int, world: int, delay_s: float = 0.05, steps: int = 8) -> dict[str, Any]:
    """eager-SGD with rank ``world - 1`` delayed: blocked time, staleness, conservation, initiators."""
    store = dist.distributed_c10d._get_default_store()
    slow = world - 1
    n = 64
    out: dict[str, Any] = {}
    for label, mode, tau in (
        ("solo", "solo", 1000),
        ("sync", "sync", 1000),
        ("bounded", "solo", 3),
        ("majority", "majority", 1000),
    ):
        gen = torch.Generator().manual_seed(rank)
        comm = eager_sgd.PartialAllreduce(
            n, store=store, name=f"test/{label}", mode=mode, staleness_bound=tau, seed=5, timeout_s=COLLECTIVE_TIMEOUT_S
        )
        raw = torch.zeros(n)
        for t in range(steps):
            if rank == slow:
                time.sleep(delay_s)  # the artificially delayed rank
            g = _dyadic(n, gen)
            raw += g
            comm.submit(t, g)
            comm.result(t)
        dist.barrier()
        comm.close()
        log = comm.log
        assert log.sent_sum is not None
        pending = comm.pending()
        dist.all_reduce(pending)
        dist.all_reduce(raw)
        out[label] = {
            "blocked_mean_s": sum(log.blocked_s) / len(log.blocked_s),
            "max_staleness": max(log.staleness),
            "contributors": log.contributors,
            "conservation_err": float((log.sent_sum + pending - raw).abs().max()),
            "initiators": [eager_sgd.initiator(5, t, world) for t in range(steps)],
        }
    return out


class TinyRegression(L.LightningModule):
    """y = x w + noise, 64 samples; small enough for multi-process Lightning tests."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.lr = lr

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return (self.net(x) - y).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(64, 8, generator=gen)
        y = x @ torch.randn(8, 1, generator=gen) + 0.1 * torch.randn(64, 1, generator=gen)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def _fit_tiny(rank: int, world: int, strategy: CommDDPStrategy) -> tuple[TinyRegression, L.Trainer]:
    os.environ.update(
        {
            "LOCAL_RANK": str(rank),
            "RANK": str(rank),
            "NODE_RANK": "0",
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "1",
        }
    )  # group exists: no rendezvous
    L.seed_everything(0, verbose=False)
    model = TinyRegression()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=strategy,
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    return model, trainer


def _loss(model: TinyRegression) -> float:
    x, y = next(iter(torch.utils.data.DataLoader(model.train_dataloader().dataset, batch_size=64)))
    with torch.no_grad():
        return float((model.net(x) - y).pow(2).mean())


def prog_lightning_hook(rank: int, world: int) -> dict[str, Any]:
    """Real Lightning Trainers on the already initialised group: the strategy's hook runs on CPU (a
    counting all-reduce), and PowerSGD (rank 2, compressing the 16 x 8 weight from step 2) lands
    near it."""
    out: dict[str, Any] = {}
    for comm in ("allreduce", "powersgd"):
        strategy = CommDDPStrategy(comm=comm, powersgd_rank=2, start_iter=2, timeout_s=COLLECTIVE_TIMEOUT_S)
        model, trainer = _fit_tiny(rank, world, strategy)
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        counter = strategy.counter
        assert counter is not None
        out[comm] = {
            "hook_calls": counter.calls,
            "steps": trainer.global_step,
            "loss": _loss(model),
            "bytes": counter.bytes_sent,
            "replicas_equal": all(torch.equal(flat, o) for o in _gathered(flat)),
        }
    return out


def prog_wagma(rank: int, world: int) -> dict[str, Any]:
    """lr = 0: after log2(P) group rounds every replica holds the global mean; global rounds: equal."""
    gen = torch.Generator().manual_seed(rank)
    params = [torch.randn(6, 5, generator=gen), torch.randn(7, generator=gen)]
    mean = [torch.stack(_gathered(p)).mean(0) for p in params]
    avg = wagma.GroupAverager(group_size=2, global_every=3, timeout_s=COLLECTIVE_TIMEOUT_S)
    kinds = [avg.step(params), avg.step(params)]
    consensus = all(torch.allclose(p, m, atol=1e-6) for p, m in zip(params, mean, strict=True))
    params = [p + torch.randn(p.shape, generator=gen) for p in params]  # replicas drift apart again
    kinds.append(avg.step(params))  # round 3 (t = 2) is global
    flat = torch.cat([p.reshape(-1) for p in params])
    return {
        "kinds": kinds,
        "consensus": consensus,
        "global_equal": all(torch.equal(flat, o) for o in _gathered(flat)),
        "groups": avg.phases,
    }


def prog_two_ranks(rank: int, world: int) -> dict[str, Any]:
    """Everything the 2-rank tests check, in one launch (process start-up dominates on 2 cores)."""
    return {
        "sparse": prog_sparse(rank, world),
        "lion": prog_lion(rank, world),
        "eager": prog_eager(rank, world),
        "lightning": prog_lightning_hook(rank, world),
    }


def prog_four_ranks(rank: int, world: int) -> dict[str, Any]:
    """Everything the 4-rank tests check, in one launch."""
    return {"wagma": prog_wagma(rank, world), "sparse": prog_sparse(rank, world, steps=6)}
