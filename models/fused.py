"""Several copies of one network trained as one fused array (Horizontally Fused Training Array, Wang et al.,
MLSys 2021): the seeds of a preset, or a small sweep of learning rates, as one stacked model.

:class:`FusedArray` stacks the members' parameters and buffers (``torch.func.stack_module_state``: each
tensor gains a leading member axis S) and runs them with ``vmap`` over that axis, so one call computes every
member's output on the same batch, (S, ...) per output. The members' parameters stay independent: the sum of
their losses has, for each member, the gradient of its own loss. :class:`FusedAdam` steps every member with
its own learning rate (Adam is elementwise, so this is each member's own Adam). ``FusedArray.active`` (S,)
freezes the members whose own early stopping has ended their run: their parameters, Adam moments and buffers
(BatchNorm's running statistics) stay as they were while the others train.
:meth:`FusedArray.member` gives a member back as a plain module.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from postcast.datasets.core.errors import ConfigError


class FusedArray(nn.Module):
    """S copies of one architecture (``members``: modules of identical structure) run as one: forward(*args)
    returns what a member returns with a leading member axis S on every tensor (the arguments are shared)."""

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        layouts = {tuple((n, tuple(t.shape)) for n, t in m.state_dict().items()) for m in members}
        if len(layouts) != 1:
            msg = "a fused array needs one or more members of the same architecture"
            raise ConfigError(msg)
        params, buffers = stack_module_state(list(members))  # name -> (S, ...)
        self.names = list(params)
        self.stacked = nn.ParameterList([nn.Parameter(params[n].detach().clone()) for n in self.names])
        self.buffer_names = list(buffers)
        for i, n in enumerate(self.buffer_names):
            self.register_buffer(f"buffer{i}", buffers[n].clone())
        self.template = copy.deepcopy(members[0]).to("meta")
        self.size = len(members)
        self.active = torch.ones(self.size, dtype=torch.bool)  # (S,): members still training

    def _state(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        params = dict(zip(self.names, self.stacked, strict=True))
        buffers = {n: getattr(self, f"buffer{i}") for i, n in enumerate(self.buffer_names)}
        return params, buffers

    def forward(self, *args: Any) -> Any:
        self.template.train(self.training)
        params, buffers = self._state()
        before = {n: t.clone() for n, t in buffers.items()} if self.training and not self.active.all() else {}

        def one(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> Any:
            return functional_call(self.template, (p, b), args)

        out = vmap(one, randomness="different")(params, buffers)
        for i, n in enumerate(self.buffer_names):  # a stopped member's running statistics stay as they were
            if n in before:  # new tensors: the updated ones may be saved for the backward
                keep = self.active.to(before[n].device).view((-1,) + (1,) * (before[n].dim() - 1))
                setattr(self, f"buffer{i}", torch.where(keep, buffers[n], before[n]))
        return out

    def member(self, s: int, like: nn.Module) -> nn.Module:
        """Member ``s`` as a plain module (a copy of ``like``, an instance of the same architecture)."""
        out = copy.deepcopy(like)
        params, buffers = self._state()
        out.load_state_dict({n: t[s].detach().clone() for n, t in {**params, **buffers}.items()})
        return out


class FusedAdam:
    """Adam (torch.optim.Adam's update, no weight decay) on a fused array's stacked parameters, member s with
    learning rate ``lr[s]``; ``step`` updates only the array's ``active`` members."""

    def __init__(self, array: FusedArray, lr: Sequence[float], betas: tuple[float, float] = (0.9, 0.999)):
        if len(lr) != array.size:
            msg = f"{len(lr)} learning rates for a fused array of {array.size} members: give one per member"
            raise ConfigError(msg)
        self.array, self.params = array, list(array.stacked)
        self.lr = torch.tensor(lr, dtype=self.params[0].dtype, device=self.params[0].device)  # (S,)
        self.betas, self.eps = betas, 1e-8
        self.steps = torch.zeros(array.size, dtype=torch.long)  # each member's own step count
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        active = self.array.active.cpu()  # (S,)
        self.steps += active.long()
        b1, b2 = self.betas
        t = self.steps.clamp_min(1).to(self.lr.dtype).to(self.lr.device)  # (S,)
        scale = self.lr / (1.0 - b1**t)  # (S,)
        root = torch.sqrt(1.0 - b2**t)  # (S,)
        on = active.to(self.lr.device)
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is None:
                continue
            shape = (-1,) + (1,) * (p.dim() - 1)  # broadcast (S,) over a member's tensor
            keep = on.view(shape)
            m.copy_(torch.where(keep, m * b1 + p.grad * (1.0 - b1), m))
            v.copy_(torch.where(keep, v * b2 + p.grad.square() * (1.0 - b2), v))
            update = scale.view(shape) * m / (v.sqrt() / root.view(shape) + self.eps)
            p.copy_(torch.where(keep, p - update, p))
