"""Which backend runs a kernel (the dispatch of :mod:`postcast.models.kernels`, whose docstring lists the
backends): the process's choice (``POSTCAST_KERNELS``, :func:`set_backend`, :func:`use_backend`) resolved for
the tensors at hand (:func:`resolve`), and the Triton implementations, imported on first use. Its own module so
that the custom operators (:mod:`postcast.models.kernels.ops`) resolve a backend without importing the package
that registers them."""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import torch

from postcast.datasets.core.errors import ConfigError

BACKENDS = ("auto", "triton", "torch", "compile")
_state = {"backend": os.environ.get("POSTCAST_KERNELS", "auto")}
# kernels that ``auto`` leaves to PyTorch on CUDA: slower in Triton than eager on an H100 (benchmarks/gpu.py,
# 2026-11-27: the Fourier layer, 259,920 points, 80 features, width 512: 12.8 ms in Triton, 1.7 ms eager)
EAGER_UNDER_AUTO = frozenset({"fourier_layer"})


def _check(name: str) -> str:
    if name not in BACKENDS:
        msg = f"kernel backend {name!r}: use one of {BACKENDS} (POSTCAST_KERNELS or set_backend)"
        raise ConfigError(msg)
    return name


def set_backend(name: str) -> None:
    """Choose the kernel backend for the whole process (see the module docstring)."""
    _state["backend"] = _check(name)


def get_backend() -> str:
    return _check(_state["backend"])


@contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Temporarily choose the kernel backend: ``with use_backend("torch"): ...``."""
    old = _state["backend"]
    _state["backend"] = _check(name)
    try:
        yield
    finally:
        _state["backend"] = old


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.cache
def triton_module() -> ModuleType:
    from postcast.models.kernels import triton_impl  # triton is optional: imported on first use

    return triton_impl


def resolve(*tensors: torch.Tensor, kernel: str = "") -> str:
    """The backend that will run ``kernel`` for these tensors: "triton", "torch" or "compile"."""
    name = get_backend()
    on_gpu = all(t.is_cuda for t in tensors)
    if name == "auto":
        return "triton" if on_gpu and triton_available() and kernel not in EAGER_UNDER_AUTO else "torch"
    if name == "triton":
        if not triton_available():
            msg = "POSTCAST_KERNELS=triton but triton is not installed: pip install triton, or use 'torch'"
            raise RuntimeError(msg)
        if not on_gpu and not interpreting():
            msg = "the Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 to run on the CPU (slow, for tests)"
            raise RuntimeError(msg)
    return name
