"""The SMoE routing as PyTorch custom operators (``torch.library.custom_op``): ``postcast::topk_route`` and
its backward ``postcast::topk_route_backward``, each with a fake (shape-only) implementation and the
autograd formula registered, so ``torch.compile`` keeps a U-Net + SMoE in one graph with the routing an
opaque call (dynamo never traces into the ``autograd.Function`` and the Triton launches inside it).

Inside, the Triton kernels (:mod:`.triton_impl`) or the reference math (:mod:`.reference`), whichever
the ``backend`` argument resolves to for the tensors at run time (see :func:`postcast.models.kernels.resolve`).
No ``from __future__ import annotations`` here: the operator schema is read from the annotations."""

from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from postcast.models.kernels import dispatch, reference


def _module(backend: str, *tensors: Tensor) -> ModuleType:
    with dispatch.use_backend(backend):
        chosen = dispatch.resolve(*tensors, kernel="topk_route")
    return dispatch.triton_module() if chosen == "triton" else reference


@torch.library.custom_op("postcast::topk_route", mutates_args=())
def topk_route(
    values: Tensor,
    weights: Tensor,
    k: int,
    weighted: bool,
    block_gate: bool,
    damping: float,
    quantile: float,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """values, weights (B, E, H, W) -> y (B, k, H, W), idx (B, k, H, W) uint8 and the selected values and
    weights (B, k, H, W) when ``weighted`` (else empty); block_gate, damping and quantile are the backward's."""
    impl = _module(backend, values, weights)
    out: tuple[Tensor, Tensor, Tensor, Tensor] = impl.route_forward(values, weights, k, weighted)
    return out


@topk_route.register_fake
def _topk_route_fake(
    values: Tensor,
    weights: Tensor,
    k: int,
    weighted: bool,
    block_gate: bool,
    damping: float,
    quantile: float,
    backend: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    shape = (values.shape[0], k, *values.shape[2:])
    saved = shape if weighted else (0,)
    return (
        values.new_empty(shape),
        values.new_empty(shape, dtype=torch.uint8),
        values.new_empty(saved),
        weights.new_empty(saved),
    )


@torch.library.custom_op("postcast::topk_route_backward", mutates_args=())
def topk_route_backward(
    grad: Tensor,
    idx: Tensor,
    sel_v: Tensor,
    sel_w: Tensor,
    experts: int,
    weighted: bool,
    block_gate: bool,
    damping: float,
    quantile: float,
    backend: str,
) -> tuple[Tensor, Tensor]:
    """The output gradient (B, k, H, W) -> the values' and the weights' gradients (B, E, H, W); the
    weights' is empty when ``block_gate``."""
    fn = _module(backend, grad).route_backward
    cfg = (experts, weighted, block_gate, damping, quantile)
    out: tuple[Tensor, Tensor] = fn(grad.contiguous(), idx, sel_v, sel_w, *cfg)
    return out


@topk_route_backward.register_fake
def _topk_route_backward_fake(
    grad: Tensor,
    idx: Tensor,
    sel_v: Tensor,
    sel_w: Tensor,
    experts: int,
    weighted: bool,
    block_gate: bool,
    damping: float,
    quantile: float,
    backend: str,
) -> tuple[Tensor, Tensor]:
    shape = (grad.shape[0], experts, *grad.shape[2:])
    return grad.new_empty(shape), grad.new_empty((0,) if block_gate else shape)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    values, _, _, weighted, block_gate, damping, quantile, backend = inputs
    _, idx, sel_v, sel_w = output
    ctx.save_for_backward(idx, sel_v, sel_w)
    ctx.cfg = (values.shape[1], weighted, block_gate, damping, quantile, backend)


def _backward(ctx: Any, grad_y: Tensor, *_: Any) -> tuple[Tensor | None, ...]:
    idx, sel_v, sel_w = ctx.saved_tensors
    grad_values, grad_weights = topk_route_backward(grad_y, idx, sel_v, sel_w, *ctx.cfg)
    block_gate = ctx.cfg[2]
    return grad_values, None if block_gate else grad_weights, None, None, None, None, None, None


topk_route.register_autograd(_backward, setup_context=_setup_context)


def route(
    values: Tensor,
    weights: Tensor,
    k: int,
    weighted: bool,
    block_gate: bool,
    damping: float,
    quantile: float,
    backend: str,
) -> Tensor:
    """The routed output y (B, k, H, W) of :func:`topk_route` (what the SMoE layer uses)."""
    return topk_route(values, weights, k, weighted, block_gate, damping, quantile, backend)[0]
