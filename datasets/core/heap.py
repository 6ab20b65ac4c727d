"""glibc's allocator, tuned where a stage's memory depends on it (no-op elsewhere: another C library, or no
``mallopt``): every tuning goes through :func:`mallopt`.

* ingest workers keep their few-MB temporaries (:func:`postcast.datasets.core.cluster.keep_freed_memory`);
* :func:`one_arena`: the threads a process starts from now on allocate from the arenas it has, instead of one
  new arena each. Each glibc arena keeps what its thread freed, so a fit whose threads each free large
  temporaries holds that memory once per arena (the local EMOS at 0.5 deg: 1.92-2.09 GB resident at 8 and
  32 training dates, against 1.64-1.75 GB sharing the main arena, the same fit time; docs/scale.md);
* :data:`ONE_ARENA_ENVIRON`: the same for a process yet to start, read by glibc as it starts (the local dask
  workers: :func:`postcast.datasets.core.cluster.dask_client`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
# glibc's tunable for M_ARENA_MAX: every thread of the process started with it shares the main arena
ONE_ARENA_ENVIRON = {"MALLOC_ARENA_MAX": "1"}


@functools.cache  # finding libc can run ldconfig
def _mallopt() -> Any | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


def mallopt(param: int, value: int) -> bool:
    """glibc's ``mallopt(param, value)``: whether it was set (False outside glibc)."""
    fn = _mallopt()
    return fn is not None and bool(fn(param, value))


@functools.cache  # once per process
def one_arena() -> bool:
    """No new arenas in this process: a thread started from now on shares an existing one (round robin), so
    the memory freed by the threads of one fit after another is reused rather than kept once per thread."""
    return mallopt(M_ARENA_MAX, 1)
