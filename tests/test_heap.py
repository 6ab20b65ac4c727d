"""glibc's arenas (postcast.datasets.core.heap): after :func:`one_arena` the threads a process starts share
the arenas it has; without it each thread gets one of its own, which keeps what that thread freed. Counted from
glibc's own report (``malloc_stats``, one "Arena i:" block per arena) in a fresh interpreter."""

import ctypes.util
import platform
import subprocess
import sys

import pytest

PROBE = """
import ctypes, ctypes.util, sys, threading
tuned = False
if sys.argv[1] == "one":
    from postcast.datasets.core import heap
    tuned = heap.one_arena()
def work():
    for _ in range(50):
        blocks = [bytearray(200_000) for _ in range(4)]  # above pymalloc's 512 bytes: from malloc, in this thread
        del blocks
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(tuned, flush=True)
ctypes.CDLL(ctypes.util.find_library("c")).malloc_stats()  # to stderr
"""

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or not ctypes.util.find_library("c"),
    reason="glibc's arenas",
)


def arenas(mode: str) -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, timeout=120)
    return done.stdout.strip(), done.stderr.count("Arena ")


@glibc
def test_threads_started_after_one_arena_share_the_processs_arena():
    tuned, count = arenas("one")
    assert tuned == "True" and count == 1, (tuned, count)


@glibc
def test_threads_get_arenas_of_their_own_by_default():
    """The control: what :func:`one_arena` changes (4 threads, up to 5 arenas)."""
    _, count = arenas("default")
    assert count > 1, count
