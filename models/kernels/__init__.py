"""Fused kernels for the hot paths, behind one dispatch: Triton on CUDA devices, PyTorch elsewhere.

=====================  ===========================================================  ==================
kernel                 shapes                                                       used by
=====================  ===========================================================  ==================
ensemble_standardise   members (B, M, *F) -> mean, std (B, *F), z (B, M, *F)         Transformer
crps_gaussian          mu, sigma, y (any, broadcast) -> CRPS (same), units of y      training loss
crps_ensemble          members (N, M), outcomes (N,) -> CRPS (N,) fair or standard   evaluation
topk_route             values, weights (B, E, H, W) -> (B, k, H, W), SMoE backward   SMoE layer
fourier_layer          coords (N, D), B (D, F), W (H, 2F), b (H) -> GELU(...) (N, H)  neural fields
=====================  ===========================================================  ==================

Backend (``POSTCAST_KERNELS`` environment variable, :func:`set_backend` or :func:`use_backend`):

- ``auto`` (default): Triton when every tensor is on a CUDA device and triton imports, else PyTorch (and
  PyTorch for the kernels in :data:`EAGER_UNDER_AUTO`, measured slower in Triton on an H100);
- ``triton``: always Triton (on CPU tensors this needs ``TRITON_INTERPRET=1``, for tests);
- ``torch``: the eager PyTorch implementations in :mod:`postcast.models.kernels.reference`;
- ``compile``: the same functions through ``torch.compile`` (fuses on CPU with a C++ compiler).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from postcast.models.kernels import dispatch, ops, reference
from postcast.models.kernels.dispatch import (
    BACKENDS,
    EAGER_UNDER_AUTO,
    get_backend,
    interpreting,
    resolve,
    set_backend,
    triton_available,
    use_backend,
)

_triton = dispatch.triton_module
__all__ = [
    "BACKENDS",
    "EAGER_UNDER_AUTO",
    "get_backend",
    "interpreting",
    "resolve",
    "set_backend",
    "triton_available",
    "use_backend",
]  # the dispatch, re-exported: where callers find it (postcast.models.kernels.dispatch)


@functools.cache
def _compiled(name: str) -> Callable[..., Any]:
    fn: Callable[..., Any] = torch.compile(getattr(reference, name), dynamic=True)
    return fn


def _impl(name: str, *tensors: torch.Tensor) -> Callable[..., Any]:
    backend = resolve(*tensors, kernel=name)
    if backend == "triton":
        fn: Callable[..., Any] = getattr(_triton(), name)
        return fn
    if backend == "compile":
        return _compiled(name)
    fn = getattr(reference, name)
    return fn


def ensemble_standardise(members: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ensemble mean, population std and standardised members z = (x - mean) / max(std, eps) in one
    pass over the members: members (B, M, *F) -> (B, *F), (B, *F), (B, M, *F). Inputs are data (no
    gradient flows through this kernel)."""
    with torch.no_grad():
        out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = _impl("ensemble_standardise", members)(members, eps)
    return out


def crps_gaussian(mu: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Closed-form CRPS of N(mu, sigma^2) at y, elementwise (units of y); differentiable in all three.
    The Triton path computes the CRPS and its gradients in one pass."""
    out: torch.Tensor = _impl("crps_gaussian", mu, sigma, y)(mu, sigma, y)
    return out


def crps_ensemble(x: torch.Tensor, y: torch.Tensor, fair: bool = True) -> torch.Tensor:
    """Ensemble CRPS of members x (N, M) at outcomes y (N,), sorted O(M log M) form; ``fair`` divides
    the spread term by M (M - 1) instead of M^2."""
    if x.dim() != 2 or y.shape != x.shape[:1]:
        msg = f"crps_ensemble: members must be (N, M) and outcomes (N,), got {tuple(x.shape)} and {tuple(y.shape)}"
        raise ValueError(msg)
    if fair and x.shape[1] < 2:
        msg = "the fair CRPS needs at least 2 members"
        raise ValueError(msg)
    out: torch.Tensor = _impl("crps_ensemble", x, y)(x, y, fair)
    return out


def topk_route(
    values: torch.Tensor,
    weights: torch.Tensor,
    k: int,
    weighted: bool = False,
    block_gate: bool = False,
    damping: float = 1.0,
    quantile: float = 0.7,
) -> torch.Tensor:
    """SMoE top-k routing: values, weights (B, E, H, W) -> selected (optionally weight-scaled) values
    (B, k, H, W), with the SMoE backward (see :class:`postcast.models.kernels.reference.TopKRouting`).
    Runs as the custom operator ``postcast::topk_route`` (:mod:`.ops`), which ``torch.compile`` keeps
    in its graph; inside it, Triton or the reference math as the backend resolves at run time."""
    if not 1 <= k <= values.shape[1] <= 255:
        msg = f"topk_route: k={k} of {values.shape[1]} experts; need 1 <= k <= experts <= 255"
        raise ValueError(msg)
    name = get_backend()
    if name == "compile":
        fn = _compiled("topk_route")
        out: torch.Tensor = fn(values, weights, k, weighted, block_gate, damping, quantile)
        return out
    return ops.route(values, weights, k, weighted, block_gate, damping, quantile, name)


def fourier_layer(coords: torch.Tensor, bmat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Neural-field decoder head: GELU(W [sin 2 pi x B, cos 2 pi x B] + b); coords (N, D), B (D, F),
    W (H, 2F), b (H) -> (N, H)."""
    out: torch.Tensor = _impl("fourier_layer", coords, bmat, weight, bias)(coords, bmat, weight, bias)
    return out
