"""The random streams a training checkpoint carries (torch, CUDA, numpy, Python), so that a resumed fit draws
what the uninterrupted one would have drawn (:class:`postcast.models.module.PostProcessor` saves and restores
them)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def states() -> dict[str, Any]:
    """This process's random streams (torch, CUDA, numpy, Python) as tensors and plain containers, so that a
    checkpoint holding them still loads with ``weights_only=True``. The plain loader's shuffle draws from
    torch's stream at each epoch: a resume restores it to where the saved epoch left it."""
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    assert isinstance(keys, np.ndarray)  # (624,) uint32: the legacy Mersenne Twister's key
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_states(states: dict[str, Any]) -> None:
    """Undo :func:`states` (a CUDA state is restored only where CUDA is)."""
    torch.set_rng_state(states["torch"])
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
