"""eager-SGD (Li et al., PPoPP'20): partial all-reduce of gradients with bounded staleness.

A communicator thread per rank owns a dedicated gloo group and runs rounds t = 0, 1, 2, ... in order;
every rank takes part in every round (collectives stay matched), only the content differs:

* **activation** through the c10d Store (never by polling a gloo receive): when a rank's gradient for
  step t is ready it adds to the counter ``act/t``. *solo*: round t starts as soon as any rank is
  ready; *majority*: as soon as the round's initiator, ``Random(seed + t) % P`` (same on every rank,
  no communication), is ready; every ``staleness_bound``-th round is *synchronous* (all ranks ready).
* **payload**: the rank's accumulator: every gradient submitted and not yet sent (late gradients go
  into the next round, nothing is lost), else zeros; plus a contributed flag. All-reduce (SUM),
  divided by P (as the reference: missing contributors shrink the step) or by the contributor count.
* each rank applies round t's result at its step t, so all replicas apply the same updates in the
  same order (they stay identical); a slow rank's gradients arrive at most ``staleness_bound - 1``
  rounds late, because a synchronous round waits for everyone's step-t gradient.

In Lightning the :class:`EagerSGD` callback submits the flattened gradients in
``on_before_optimizer_step`` and writes round t's result back into ``.grad``; the strategy runs
``comm: noop`` so DDP does not all-reduce as well.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

from postcast.datasets.core.errors import ConfigError
from postcast.models.plugins import comm as C
from postcast.models.plugins.comm import DEFAULT_TIMEOUT_S, ByteCounter, timeout, world_of
from postcast.models.plugins.wagma import require_noop

MODES = ("solo", "majority", "sync")


@dataclass
class RoundLog:
    """What each round did (for tests and logging)."""

    contributors: list[list[int]] = field(default_factory=list)  # ranks that contributed, per round
    staleness: list[int] = field(default_factory=list)  # per round: max (round - step) of this rank's payload
    blocked_s: list[float] = field(default_factory=list)  # per step: time this rank waited for its round
    sent_sum: torch.Tensor | None = None  # sum of the un-normalised round results (conservation checks)


def initiator(seed: int, t: int, world: int) -> int:
    """The majority initiator of round t: the same on every rank, without communication."""
    return random.Random(seed * 1_000_003 + t).randrange(world)


class PartialAllreduce:
    """The communicator of one rank: ``submit(step, grad)`` then ``result(step)``; ``close()`` at the end.

    ``store`` is a c10d Store every rank shares (``dist.distributed_c10d._get_default_store()`` in a
    Lightning run); ``name`` must be equal on all ranks and unique per run (key prefix).
    """

    def __init__(
        self,
        numel: int,
        *,
        store: dist.Store,
        name: str,
        mode: str = "solo",
        staleness_bound: int = 8,
        seed: int = 0,
        normalise: str = "world",
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if mode not in MODES:
            msg = f"mode={mode!r}: choose one of {MODES}"
            raise ConfigError(msg)
        if staleness_bound < 1:
            msg = f"staleness_bound={staleness_bound}: use >= 1 (1 = every round synchronous)"
            raise ConfigError(msg)
        if normalise not in ("world", "contributors"):
            msg = f"normalise={normalise!r}: choose 'world' or 'contributors'"
            raise ConfigError(msg)
        self.rank, self.world = world_of(None)
        self.mode, self.tau, self.seed, self.normalise = mode, staleness_bound, seed, normalise
        self.store, self.name, self.timeout_s = store, name, timeout_s
        self.group = dist.new_group(backend="gloo", timeout=timeout(timeout_s)) if self.world > 1 else None
        self.acc = torch.zeros(numel)  # (N,) submitted, not yet sent
        self.acc_steps: list[int] = []
        self.results: dict[int, torch.Tensor] = {}
        self.log = RoundLog(sent_sum=torch.zeros(numel))
        self.counter = ByteCounter()
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"eager-sgd-{name}", daemon=True)
        self._thread.start()

    def is_sync(self, t: int) -> bool:
        return self.mode == "sync" or (t + 1) % self.tau == 0

    def _key(self, t: int) -> str:
        return f"{self.name}/act/{t}"

    def submit(self, step: int, grad: torch.Tensor) -> None:
        """Hand over this rank's gradient (N,) for ``step`` and activate round ``step`` if allowed to."""
        with self._cond:
            self.acc += grad.detach().reshape(-1).float()
            self.acc_steps.append(step)
        if self.world == 1:
            return
        is_init = (
            self.mode == "majority" and not self.is_sync(step) and initiator(self.seed, step, self.world) == self.rank
        )
        self.store.add(self._key(step), self.world if is_init else 1)

    def result(self, step: int) -> torch.Tensor:
        """Round ``step``'s averaged gradient (N,); blocks until that round has run."""
        start = time.perf_counter()
        if self.world == 1:
            with self._cond:
                out = self.acc.clone()
                self.acc.zero_()
                self.acc_steps.clear()
            self.log.blocked_s.append(0.0)
            return out
        with self._cond:
            ok = self._cond.wait_for(lambda: step in self.results or self.error is not None, timeout=self.timeout_s)
            if self.error is not None:
                msg = f"eager-SGD communicator failed in an earlier round: {self.error}"
                raise RuntimeError(msg) from self.error
            if not ok:
                msg = f"eager-SGD round {step} did not complete within timeout_s={self.timeout_s} s"
                raise TimeoutError(msg)
            out = self.results.pop(step)
        self.log.blocked_s.append(time.perf_counter() - start)
        return out

    def _wait_activation(self, t: int) -> bool:
        need = self.world if self.is_sync(t) else (self.world if self.mode == "majority" else 1)
        deadline = time.monotonic() + self.timeout_s
        while not self._closed:
            if self.store.add(self._key(t), 0) >= need:
                return True
            if time.monotonic() > deadline:
                msg = f"eager-SGD round {t}: not activated within timeout_s={self.timeout_s} s"
                raise TimeoutError(msg)
            time.sleep(0.0005)
        return False

    def _loop(self) -> None:
        t = 0
        try:
            while self._wait_activation(t):
                with self._cond:
                    payload = torch.cat([self.acc, torch.tensor([1.0 if self.acc_steps else 0.0])])  # (N + 1,)
                    steps = list(self.acc_steps)
                    self.acc.zero_()
                    self.acc_steps.clear()
                flags = torch.zeros(self.world)
                flags[self.rank] = payload[-1]
                buf = torch.cat([payload[:-1], flags])  # (N + P,): gradient sum, who contributed
                dist.all_reduce(buf, group=self.group)
                self.counter.allreduce(buf.numel() * 4, self.world)
                self.counter.calls += 1
                total, who = buf[: -self.world], buf[-self.world :]
                n_contrib = int(who.sum())
                who_ranks = [r for r in range(self.world) if who[r] > 0]
                denom = self.world if self.normalise == "world" else max(1, n_contrib)
                with self._cond:
                    assert self.log.sent_sum is not None
                    self.log.sent_sum += total
                    self.log.contributors.append(who_ranks)
                    self.log.staleness.append(max((t - s for s in steps), default=0))
                    self.results[t] = total / denom
                    self._cond.notify_all()
                t += 1
        except BaseException as err:  # surfaced to the training thread by result()
            with self._cond:
                self.error = err
                self._cond.notify_all()

    def pending(self) -> torch.Tensor:
        """This rank's gradients submitted but not yet sent (N,)."""
        with self._cond:
            return self.acc.clone()

    def close(self) -> None:
        self._closed = True
        self._thread.join(timeout=self.timeout_s)


class EagerSGD(L.Callback):
    """eager-SGD in Lightning (needs ``CommDDPStrategy(comm="noop")``).

    Args:
        mode: ``solo`` (the first ready rank starts a round), ``majority`` (a seeded initiator starts
            it) or ``sync`` (every round waits for all ranks; equals DDP's averaging).
        staleness_bound: every ``staleness_bound``-th round is synchronous (tau in the paper).
        normalise: divide the round's sum by ``world`` (the reference) or by the ``contributors``.
        seed: seed of the majority initiator sequence.
        delay_rank: the rank that sleeps ``delay_s`` before each optimizer step (-1: none), to study imbalance.
        delay_s: that injected delay (seconds per step).
        timeout_s: timeout of every round (seconds).
    """

    def __init__(
        self,
        mode: str = "solo",
        staleness_bound: int = 8,
        normalise: str = "world",
        seed: int = 0,
        delay_rank: int = -1,
        delay_s: float = 0.0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if mode not in MODES:
            msg = f"mode={mode!r}: choose one of {MODES}"
            raise ConfigError(msg)
        self.mode, self.staleness_bound, self.normalise, self.seed = mode, staleness_bound, normalise, seed
        self.delay_rank, self.delay_s, self.timeout_s = delay_rank, delay_s, timeout_s
        self.comm: PartialAllreduce | None = None
        self.step = 0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        require_noop(trainer, "EagerSGD")
        if trainer.world_size == 1:
            return
        name = [uuid.uuid4().hex if trainer.global_rank == 0 else ""]
        dist.broadcast_object_list(name, src=0)
        store = dist.distributed_c10d._get_default_store()
        numel = sum(p.numel() for p in pl_module.parameters())
        self.comm = PartialAllreduce(
            numel,
            store=store,
            name=f"eager/{name[0]}",
            mode=self.mode,
            staleness_bound=self.staleness_bound,
            seed=self.seed,
            normalise=self.normalise,
            timeout_s=self.timeout_s,
        )

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if self.comm is None:
            return
        if trainer.global_rank == self.delay_rank and self.delay_s > 0:
            time.sleep(self.delay_s)
        params = list(pl_module.parameters())
        self.comm.submit(self.step, C.flat_grads(params))
        C.write_flat_grads(params, self.comm.result(self.step))
        self.step += 1

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.comm is not None:
            self.comm.close()

    @property
    def counter(self) -> ByteCounter | None:
        return self.comm.counter if self.comm is not None else None
