"""glibc's arenas (postcast.datasets.core.heap): after :func:`one_arena` the threads a process starts share
the arenas it has; without it each thread gets one of its own, which keeps what that thread freed. Counted from
glibc's own report (``malloc_stats``, one "Arena i:" block per arena) in a fresh interpreter, and in the worker
processes of the LocalCluster that ingest, evaluate and forecast start."""

import ctypes.util
import os
import platform
import subprocess
import sys
import tempfile

import pytest

from postcast.datasets.core.cluster import dask_client

# 4 threads allocate and free: each takes an arena of its own unless told otherwise
THREADS_ALLOCATE = """
import threading
def work():
    for _ in range(50):
        blocks = [bytearray(200_000) for _ in range(4)]  # above pymalloc's 512 bytes: from malloc, in this thread
        del blocks
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""
PROBE = f"""
import ctypes, ctypes.util, sys
tuned = False
if sys.argv[1] == "one":
    from postcast.datasets.core import heap
    tuned = heap.one_arena()
{THREADS_ALLOCATE}
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


def _threads_then_arenas() -> int:
    """In the process that runs it: 4 threads allocate and free, then glibc's arena count (``malloc_stats``
    writes to file descriptor 2, read back through a file)."""
    exec(THREADS_ALLOCATE, {})  # the probe's own threads, here
    with tempfile.TemporaryFile() as report:
        saved = os.dup(2)
        os.dup2(report.fileno(), 2)
        try:
            ctypes.CDLL(ctypes.util.find_library("c")).malloc_stats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        report.seek(0)
        return report.read().decode().count("Arena ")


@glibc
def test_a_local_clusters_workers_share_one_arena():
    """Ingest's workers kept what each thread freed in an arena of its own, so a worker's resident peak grew with
    the dates it had ingested (the scale benchmark, 0.5 deg: 0.66 -> 0.72 and 0.86 GB from 16 to 64 dates;
    0.62 -> 0.64 GB with one arena). Workers now start with glibc's arenas capped at one."""
    with dask_client(None, 1) as client:
        (count,) = client.run(_threads_then_arenas).values()
    assert count == 1, count
