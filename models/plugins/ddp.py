"""``CommDDPStrategy``: DDP whose gradient communication hook is chosen by name, also on CPU.

Lightning 2.6 registers ``ddp_comm_hook`` only when the root device is CUDA and says nothing when it
skips it (a 2-rank gloo run called the hook 0 times). This strategy overrides
``_register_ddp_hooks`` and calls ``DistributedDataParallel.register_comm_hook`` unconditionally.

Hooks (``comm``):

* ``allreduce``: dense mean, the same as DDP's built-in communication, but counted (the baseline);
* ``topk`` / ``oktopk``: sparse all-reduce with error feedback (:mod:`postcast.models.plugins.topk`);
* ``powersgd``: torch's built-in PowerSGD hook (rank ``powersgd_rank``, error feedback, warm start);
* ``noop``: no gradient communication, for plugins that communicate themselves (eager-SGD, WAGMA,
  Lion Cub): DDP must not also all-reduce behind their back.

YAML (``trainer.strategy``)::

    strategy:
      class_path: postcast.models.plugins.CommDDPStrategy
      init_args: {comm: topk, density: 0.01}
"""

# no "from __future__ import annotations": DDP checks the hook annotations at run time

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from postcast.datasets.core.errors import ConfigError
from postcast.models.plugins.comm import DEFAULT_TIMEOUT_S, ByteCounter, timeout, world_of
from postcast.models.plugins.topk import SparseHookState, sparse_hook

COMMS = ("allreduce", "topk", "oktopk", "powersgd", "noop")


class CountingState:
    """State of the counting dense all-reduce hook (and of the no-op hook)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.counter = ByteCounter()


def allreduce_hook(state: CountingState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Dense mean of the bucket (N,) over ranks; counts the modelled ring all-reduce bytes."""
    _, world = world_of(state.group)
    buf = bucket.buffer()
    state.counter.allreduce(buf.numel() * buf.element_size(), world)
    state.counter.calls += 1
    work = dist.all_reduce(buf.div_(world), group=state.group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def noop_hook(state: CountingState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """No communication (the gradients stay local); counts the calls."""
    state.counter.calls += 1
    return debugging_hooks.noop_hook(None, bucket)


class PowerSGDCounting(powerSGD_hook.PowerSGDState):
    """torch's ``PowerSGDState`` plus a byte counter following the hook's own compress/skip rules."""

    counter: ByteCounter

    def bucket_bytes(self, bucket: dist.GradBucket) -> float:
        """Bytes all-reduced for this bucket: P and Q factors of the compressed matrices, the rest dense."""
        if self.iter < self.start_powerSGD_iter:
            return float(bucket.buffer().numel() * 4)
        total = 0
        for g in bucket.gradients():
            if g.ndim <= 1:
                total += g.numel()
                continue
            n, m = g.shape[0], g.numel() // g.shape[0]
            r = min(n, m, self.matrix_approximation_rank)
            compressed = (n + m) * r * self.min_compression_rate < n * m
            total += (n + m) * r if compressed else n * m
        return float(total * 4)


def powersgd_counting_hook(state: PowerSGDCounting, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    _, world = world_of(state.process_group)
    state.counter.allreduce(state.bucket_bytes(bucket), world)
    state.counter.calls += 1
    return powerSGD_hook.powerSGD_hook(state, bucket)


def make_hook(
    comm: str,
    *,
    density: float = 0.01,
    powersgd_rank: int = 1,
    start_iter: int = 2,
    group: dist.ProcessGroup | None = None,
) -> tuple[Any, Callable[..., Any]]:
    """(state, hook) for a communication name in :data:`COMMS`; the state has a ``counter``."""
    if comm == "allreduce":
        return CountingState(group), allreduce_hook
    if comm == "noop":
        return CountingState(group), noop_hook
    if comm in ("topk", "oktopk"):
        return SparseHookState(method=comm, density=density, warmup_steps=start_iter, group=group), sparse_hook
    if comm == "powersgd":
        # torch requires start_powerSGD_iter > 1 with error feedback (DDP rebuilds buckets after step 1)
        ps = PowerSGDCounting(
            process_group=group,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=max(2, start_iter),
            use_error_feedback=True,
            warm_start=True,
        )
        ps.counter = ByteCounter()
        return ps, powersgd_counting_hook
    msg = f"comm={comm!r}: choose one of {COMMS}"
    raise ConfigError(msg)


class CommDDPStrategy(DDPStrategy):
    """DDP with a named gradient communication hook, registered on CPU (gloo) and GPU (NCCL) alike.

    Args:
        comm: one of ``allreduce`` (dense, counted), ``topk``, ``oktopk``, ``powersgd``, ``noop``.
        density: fraction of each bucket's entries sent by ``topk`` / ``oktopk`` (0, 1].
        powersgd_rank: rank of the PowerSGD low-rank approximation.
        start_iter: dense all-reduce steps before compression starts (``topk``, ``oktopk``, ``powersgd``).
        timeout_s: timeout of every collective on the process group (seconds).
        process_group_backend: ``gloo`` or ``nccl``; default: nccl on GPU, gloo on CPU.
        find_unused_parameters: passed to ``DistributedDataParallel``.
        broadcast_buffers: DDP's broadcast of buffers (BatchNorm statistics) from rank 0 before every
            forward; default: off for ``noop`` (that broadcast would make every rank wait for the
            slowest each step, defeating eager-SGD; WAGMA averages buffers itself), on otherwise.
    """

    def __init__(
        self,
        comm: str = "allreduce",
        density: float = 0.01,
        powersgd_rank: int = 1,
        start_iter: int = 2,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        process_group_backend: str | None = None,
        find_unused_parameters: bool = False,
        broadcast_buffers: bool | None = None,
    ) -> None:
        if comm not in COMMS:
            msg = f"comm={comm!r}: choose one of {COMMS}"
            raise ConfigError(msg)
        if comm in ("topk", "oktopk") and not 0.0 < density <= 1.0:
            msg = f"density={density}: the fraction of gradient entries sent must be in (0, 1]"
            raise ConfigError(msg)
        super().__init__(
            process_group_backend=process_group_backend,
            timeout=timeout(timeout_s),
            find_unused_parameters=find_unused_parameters,
            broadcast_buffers=comm != "noop" if broadcast_buffers is None else broadcast_buffers,
        )
        self.comm = comm
        self.density = density
        self.powersgd_rank = powersgd_rank
        self.start_iter = start_iter
        self.comm_state: Any = None

    def _register_ddp_hooks(self) -> None:
        # Lightning skips hooks unless root_device is CUDA; register them on every device type
        if not isinstance(self.model, DistributedDataParallel):
            msg = f"CommDDPStrategy needs a DistributedDataParallel model, got {type(self.model).__name__}"
            raise TypeError(msg)
        self.comm_state, hook = make_hook(
            self.comm, density=self.density, powersgd_rank=self.powersgd_rank, start_iter=self.start_iter
        )
        self.model.register_comm_hook(self.comm_state, hook)

    @property
    def counter(self) -> ByteCounter | None:
        return getattr(self.comm_state, "counter", None)
