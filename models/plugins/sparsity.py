"""Weight sparsity as Lightning callbacks: magnitude pruning (one-shot or gradual, cubic schedule) and
N:M structured masks (2:4), with masks that persist across optimizer steps and checkpoints.

Masks are computed with PyTorch's own methods (``torch.nn.utils.prune``: ``L1Unstructured``,
``LnStructured`` per output channel; ``torch.ao.pruning.WeightNormSparsifier`` for N:M) and kept by
the callback as boolean tensors, one per pruned weight (Conv2d / Linear). They are enforced by
zeroing the masked gradients before every optimizer step (optimizer moments stay zero there) and
the masked weights after it, so pruned entries are exact zeros in every checkpoint's ``state_dict``
(the model loads anywhere, e.g. ``postcast.models.module.load_checkpoint``) and the masks
themselves travel in the checkpoint as the callback's state (``--ckpt_path`` resumes with them).

Gradual pruning follows Zhu & Gupta (2017): s_t = s_f + (s_0 - s_f) (1 - (t - t_0) / (t_1 - t_0))^3
for t_0 <= t <= t_1, masks recomputed every ``every`` steps (the schedule of ``torch.ao.pruning``'s
``CubicSL``).

The 2:4 inference path (``semi_structured=True``) converts the masked Linear weights with torchao
(``sparsify_(model, semi_sparse_weight())``) or ``torch.sparse.to_sparse_semi_structured``, at test
and predict start. It needs a CUDA GPU with compute capability >= 8.0 and fp16/bf16 weights; on CPU
it raises. Convolutions (the U-Net) keep dense kernels with zeros.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.nn.utils import prune

from postcast.datasets.core.errors import ConfigError

SCHEDULES = ("oneshot", "cubic")


def prunable(model: nn.Module, min_numel: int = 64, exclude: tuple[str, ...] = ()) -> dict[str, nn.Parameter]:
    """Weights of Conv2d / Linear layers with at least ``min_numel`` entries, by parameter name."""
    out = {}
    for name, mod in model.named_modules():
        big = isinstance(mod, (nn.Conv2d, nn.Linear)) and mod.weight.numel() >= min_numel
        if big and not any(x in name for x in exclude):
            out[f"{name}.weight"] = mod.weight
    return out


def magnitude_mask(weight: torch.Tensor, sparsity: float, structured: bool = False) -> torch.Tensor:
    """Keep-mask (weight.shape, bool) zeroing round(sparsity * n) smallest |w| (or, ``structured``,
    that fraction of output channels with the smallest L1 norm)."""
    if not 0.0 <= sparsity < 1.0:
        msg = f"sparsity={sparsity}: the fraction of zeroed weights must be in [0, 1)"
        raise ConfigError(msg)
    ones = torch.ones_like(weight)
    method: prune.BasePruningMethod = (
        prune.LnStructured(sparsity, n=1, dim=0) if structured else prune.L1Unstructured(sparsity)
    )
    return method.compute_mask(weight.detach(), default_mask=ones).bool()


def nm_mask(weight: torch.Tensor, n: int = 2, m: int = 4) -> torch.Tensor:
    """N:M keep-mask (weight.shape, bool): in each block of m consecutive entries along the flattened
    input dimension (a row of (out, in * kh * kw)) the n largest |w| are kept. Uses
    ``torch.ao.pruning.WeightNormSparsifier`` (block (1, m), m - n zeros per block)."""
    from torch.ao.pruning import WeightNormSparsifier

    if not 0 < n < m:
        msg = f"N:M = {n}:{m}: need 0 < n < m (2:4 for semi-structured sparsity)"
        raise ConfigError(msg)
    w2 = weight.detach().reshape(weight.shape[0], -1)  # (out, in * kh * kw)
    if w2.shape[1] % m:
        msg = f"weight {tuple(weight.shape)}: row length {w2.shape[1]} is not a multiple of m={m}"
        raise ConfigError(msg)
    lin = nn.Linear(w2.shape[1], w2.shape[0], bias=False)
    holder = nn.Sequential(lin)
    with torch.no_grad():
        lin.weight.copy_(w2)
    sp = WeightNormSparsifier(sparsity_level=1.0, sparse_block_shape=(1, m), zeros_per_block=m - n)
    sp.prepare(holder, config=[{"tensor_fqn": "0.weight"}])
    sp.step()
    parametrizations: Any = getattr(lin, "parametrizations")  # noqa: B009 (added by prepare())
    mask = parametrizations.weight[0].mask.detach().clone().bool()  # (out, in * kh * kw)
    sp.squash_mask()
    return mask.reshape(weight.shape)


def cubic_sparsity(step: int, final: float, start_step: int, end_step: int, initial: float = 0.0) -> float:
    """Zhu & Gupta's cubic schedule: ``initial`` before ``start_step``, ``final`` from ``end_step``."""
    if step <= start_step:
        return initial
    if step >= end_step:
        return final
    frac = (step - start_step) / (end_step - start_step)
    return final + (initial - final) * (1.0 - frac) ** 3


class _MaskedTraining(L.Callback, ABC):
    """Keeps masks (by parameter name) applied across optimizer steps; checkpoints them."""

    def __init__(self, min_numel: int = 64, exclude: list[str] | None = None, semi_structured: bool = False) -> None:
        self.min_numel = min_numel
        self.exclude = tuple(exclude or ())
        self.semi_structured = semi_structured
        self.masks: dict[str, torch.Tensor] = {}
        self.step = 0

    def targets(self, pl_module: nn.Module) -> dict[str, nn.Parameter]:
        return prunable(pl_module, self.min_numel, self.exclude)

    @abstractmethod
    def update_masks(self, pl_module: nn.Module) -> None:
        """Recompute ``self.masks`` from the current weights."""

    @abstractmethod
    def due(self) -> bool:
        """Recompute the masks at this step?"""

    def apply(self, pl_module: nn.Module) -> None:
        params = dict(pl_module.named_parameters())
        with torch.no_grad():
            for name, mask in self.masks.items():
                params[name].mul_(mask.to(params[name].device, params[name].dtype))

    def sparsity(self) -> float:
        """Achieved fraction of zeroed weights over the masked tensors."""
        total = sum(m.numel() for m in self.masks.values())
        return 1.0 - sum(int(m.sum()) for m in self.masks.values()) / total if total else 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.due():
            self.update_masks(pl_module)
        self.apply(pl_module)  # also after a resume: the restored masks hold from the first step

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        params = dict(pl_module.named_parameters())
        for name, mask in self.masks.items():
            grad = params[name].grad
            if grad is not None:
                grad.mul_(mask.to(grad.device, grad.dtype))

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.step += 1
        if self.due():
            self.update_masks(pl_module)
        self.apply(pl_module)
        pl_module.log("sparsity", self.sparsity(), batch_size=1)

    def state_dict(self) -> dict[str, Any]:
        return {"masks": {k: v.cpu() for k, v in self.masks.items()}, "step": self.step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.masks = {k: v.bool() for k, v in state_dict["masks"].items()}
        self.step = int(state_dict["step"])

    def _semi_structured(self, pl_module: L.LightningModule) -> None:
        if self.semi_structured:
            to_semi_structured(pl_module)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._semi_structured(pl_module)

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._semi_structured(pl_module)


class MagnitudePruning(_MaskedTraining):
    """Magnitude pruning of Conv2d / Linear weights, per tensor.

    Args:
        sparsity: final fraction of zeroed weights per tensor, in [0, 1).
        schedule: ``oneshot`` (prune at ``start_step``) or ``cubic`` (gradual, Zhu & Gupta).
        start_step, end_step: the cubic ramp (optimizer steps); ``oneshot`` uses ``start_step`` only.
        every: recompute the masks every this many steps during the ramp.
        structured: prune whole output channels by L1 norm (``LnStructured(dim=0)``) instead of entries.
        min_numel: skip tensors smaller than this. exclude: skip parameters whose name contains one of these.
    """

    def __init__(
        self,
        sparsity: float = 0.5,
        schedule: str = "oneshot",
        start_step: int = 0,
        end_step: int = 100,
        every: int = 10,
        structured: bool = False,
        min_numel: int = 64,
        exclude: list[str] | None = None,
    ) -> None:
        super().__init__(min_numel, exclude)
        if schedule not in SCHEDULES:
            msg = f"schedule={schedule!r}: choose one of {SCHEDULES}"
            raise ConfigError(msg)
        if schedule == "cubic" and (end_step <= start_step or every < 1):
            msg = f"cubic schedule: need end_step ({end_step}) > start_step ({start_step}) and every ({every}) >= 1"
            raise ConfigError(msg)
        magnitude_mask(torch.ones(1), sparsity)  # validates the value
        self.target, self.schedule = sparsity, schedule
        self.start_step, self.end_step, self.every, self.structured = start_step, end_step, every, structured
        self.level = 0.0

    def due(self) -> bool:
        t = self.step
        if self.schedule == "oneshot":
            return t == self.start_step and not self.masks
        on_grid = (t - self.start_step) % self.every == 0 or t == self.end_step
        return self.start_step <= t <= self.end_step and on_grid

    def current_level(self) -> float:
        if self.schedule == "oneshot":
            return self.target if self.step >= self.start_step else 0.0
        return cubic_sparsity(self.step, self.target, self.start_step, self.end_step)

    def update_masks(self, pl_module: nn.Module) -> None:
        self.level = self.current_level()
        for name, w in self.targets(pl_module).items():
            self.masks[name] = magnitude_mask(w, self.level, self.structured).cpu()


class NMSparsity(_MaskedTraining):
    """N:M structured sparsity (2:4 by default) of Conv2d / Linear weights from ``start_step`` on.

    Tensors whose flattened input dimension is not a multiple of m stay dense (listed in ``skipped``).

    Args:
        n, m: keep n of every m consecutive weights along the (flattened) input dimension.
        start_step: optimizer step at which the masks are computed (0 = before training).
        semi_structured: at test/predict start, convert masked Linear weights to 2:4 semi-structured
            tensors for GPU inference (torchao or torch.sparse; CUDA, compute capability >= 8.0).
        min_numel, exclude: as in :class:`MagnitudePruning`.
    """

    def __init__(
        self,
        n: int = 2,
        m: int = 4,
        start_step: int = 0,
        semi_structured: bool = False,
        min_numel: int = 64,
        exclude: list[str] | None = None,
    ) -> None:
        super().__init__(min_numel, exclude, semi_structured)
        if not 0 < n < m:
            msg = f"N:M = {n}:{m}: need 0 < n < m (2:4 for semi-structured sparsity)"
            raise ConfigError(msg)
        self.n, self.m, self.start_step = n, m, start_step
        self.skipped: list[str] = []

    def due(self) -> bool:
        return self.step == self.start_step and not self.masks

    def update_masks(self, pl_module: nn.Module) -> None:
        self.skipped = []
        for name, w in self.targets(pl_module).items():
            if (w.numel() // w.shape[0]) % self.m:
                self.skipped.append(name)
                continue
            self.masks[name] = nm_mask(w, self.n, self.m).cpu()


def to_semi_structured(model: nn.Module) -> nn.Module:
    """Convert 2:4-masked Linear weights to semi-structured sparse tensors (GPU inference, in place)."""
    weights = [p for p in model.parameters()]
    if not weights or weights[0].device.type != "cuda" or not torch.cuda.is_available():
        msg = (
            "semi_structured=True: 2:4 semi-structured kernels need the model on a CUDA GPU "
            "(compute capability >= 8.0); run on a GPU or set semi_structured: false"
        )
        raise ConfigError(msg)
    try:
        from torchao.sparsity import semi_sparse_weight, sparsify_

        sparsify_(model, semi_sparse_weight(), lambda mod, _fqn: isinstance(mod, nn.Linear))
        return model
    except ImportError:
        pass
    from torch.sparse import to_sparse_semi_structured

    for mod in model.modules():
        if isinstance(mod, nn.Linear):
            mod.weight = nn.Parameter(to_sparse_semi_structured(mod.weight.detach()), requires_grad=False)
    return model
