"""The dask.distributed cluster that ingest, evaluate and forecast run on, and the set-up of its worker processes.

* :func:`check_local_workers`: a local cluster no larger than the machine (cores, memory);
* :func:`dask_client`: a client of the scheduler at an address or named by a scheduler file (what
  ``dask scheduler --scheduler-file F``, dask-jobqueue and dask-mpi write), or of a LocalCluster;
* :func:`local_cluster`: a LocalCluster whose workers start as every stage's (and the benchmarks') do;
* :func:`client_for`: the same, or none (work in this process) when neither a scheduler nor workers are given
  (evaluate and forecast);
* :func:`in_order`: ``fn(shared, k)`` for k = 0 .. n - 1 on the cluster, yielded in order with a bounded number
  of tasks in flight (evaluate's dates and forecast's init times);
* :func:`quiet_task_failures`: a failed task is reported once, by the driver, not by every worker;
* :func:`keep_freed_memory`: glibc's allocator tuned for the few-MB temporaries of a date task;
* :func:`worker_memory_gb`: the memory the smallest worker may use (the one-pass statistics budget).

See docs/ingest.md, *Clusters, started the way clusters start* and *Memory the workers reuse*.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from postcast.datasets.core import heap
from postcast.datasets.core.errors import ConfigError, MissingInputError, PostcastError

log = logging.getLogger(__name__)
WORKERS_PER_CORE = 2  # local workers run one task each: more than this per core only queue for the CPU
MIN_WORKER_GB = 0.5  # what a worker process holds before its first task (interpreter, dask, numpy, zarr)
TASKS_AHEAD_PER_WORKER = 2  # tasks in flight per worker (in_order): results wait in the driver for those before them
T = TypeVar("T")


def check_local_workers(workers: int) -> None:
    """Refuse a local cluster larger than this machine, before anything starts (1000 workers do not
    fail: they start for minutes and exhaust the memory): at most WORKERS_PER_CORE per core of this
    process and MIN_WORKER_GB of memory each."""
    import psutil  # a dependency of dask.distributed

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    gb = psutil.virtual_memory().total / 1e9
    bound = max(1, min(WORKERS_PER_CORE * cores, int(gb / MIN_WORKER_GB)))
    if workers > bound:
        msg = (
            f"--workers {workers}: this machine has {cores} cores and {gb:.0f} GB of memory, room for 1..{bound} "
            f"local workers ({WORKERS_PER_CORE} per core, {MIN_WORKER_GB:g} GB each); pass at most {bound}, or "
            "--scheduler for a larger cluster"
        )
        raise ConfigError(msg)


@contextmanager
def dask_client(
    scheduler: str | None, workers: int, processes: bool = True, *, connect_timeout: float = 10.0
) -> Iterator[Any]:
    """A dask.distributed client: the scheduler at an address (``tcp://HOST:PORT``) or named by a
    scheduler file (the JSON that ``dask scheduler --scheduler-file F``, dask-jobqueue and dask-mpi
    write), or a LocalCluster of worker processes. A missing or unreadable scheduler file, or a
    scheduler that does not answer within ``connect_timeout`` seconds, is a MissingInputError (66)."""
    from dask.distributed import Client

    for name in ("distributed", "distributed.scheduler", "distributed.core"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
    # "Worker process still alive after 4.0 seconds, killing": a worker in the middle of a task when the
    # cluster closes (an interrupt, a failed date) is ended as it should be
    logging.getLogger("distributed.nanny").setLevel(max(logging.ERROR, logging.getLogger().level))
    if scheduler:
        with scheduler_client(scheduler, connect_timeout) as client:
            yield client
        return
    with local_cluster(workers, processes) as cluster, Client(cluster) as client:
        quiet_task_failures()  # this process (thread workers): a failed task is reported once, by the driver
        if processes:  # and our own worker processes
            client.run(quiet_task_failures)
        yield client


def local_cluster(workers: int, processes: bool = True, memory_limit: int | str = 0) -> Any:
    """A LocalCluster of ``workers`` single-threaded workers, started as ingest, evaluate and forecast start theirs
    (:func:`dask_client`; the benchmarks too, so that they time what a user runs): the workers ignore Ctrl-C, share
    one glibc arena each, and the driver's environment is left as it was. ``memory_limit``: dask's, per worker
    (0: none)."""
    from dask.distributed import LocalCluster

    with _children_ignore_interrupts(), _driver_environment_kept(), _workers_share_one_arena():
        return LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=processes,
            dashboard_address=":0",  # its HTTP server on a free port (None still tried 8787, warning when taken)
            memory_limit=memory_limit,
            silence_logs=logging.ERROR,
        )


def in_order(client: Any, fn: Callable[..., T], shared: Any, n: int) -> Iterator[T]:
    """``fn(shared, k)`` for k = 0 .. n - 1 on the cluster, yielded in order, with at most
    TASKS_AHEAD_PER_WORKER tasks per worker in flight (``shared`` is sent to each worker once), so that the
    driver holds a few results at a time however many there are."""
    shared = client.scatter(shared, broadcast=True)
    ahead = TASKS_AHEAD_PER_WORKER * max(1, len(client.scheduler_info().get("workers", {})))
    pending = collections.deque(client.submit(fn, shared, k, pure=False) for k in range(min(ahead, n)))
    submitted = len(pending)
    while pending:
        future = pending.popleft()
        result = future.result()
        future.release()
        if submitted < n:
            pending.append(client.submit(fn, shared, submitted, pure=False))
            submitted += 1
        yield result


@contextmanager
def client_for(scheduler: str | None, workers: int, processes: bool = True) -> Iterator[Any | None]:
    """A dask client of the scheduler given (an address or a scheduler file, as ingest takes them), else of a
    LocalCluster of ``workers`` (checked against this machine), else (no scheduler, 0 workers) None: work here."""
    if scheduler is None and workers == 0:
        yield None
        return
    if scheduler is None:
        check_local_workers(workers)
    with dask_client(scheduler, workers, processes) as client:
        yield client


@contextmanager
def scheduler_client(scheduler: str, connect_timeout: float) -> Iterator[Any]:
    """A client of the scheduler at ``scheduler`` (an address, or a scheduler file naming one) with a worker to
    run on (:func:`wait_for_workers`). A scheduler that does not answer within ``connect_timeout`` seconds is
    a MissingInputError (66), and so is one lost while the work runs (:func:`lost_scheduler`)."""
    from dask.distributed import Client

    address = check_address(scheduler) if is_address(scheduler) else scheduler_file_address(scheduler)
    named = address if address == scheduler else f"{address} (from {scheduler})"
    try:
        client = Client(address, timeout=connect_timeout)
    except (OSError, TimeoutError) as err:
        msg = (
            f"no dask scheduler answers at {named} within {connect_timeout:g} s: start it (dask scheduler "
            "--scheduler-file F) or pass the address of a running one with --scheduler"
        )
        raise MissingInputError(msg) from err
    try:
        wait_for_workers(client, named, address)
        with lost_scheduler(client, named):
            yield client
    finally:
        with _quiet_connection_reports():
            _close(client)


def check_address(address: str) -> str:
    """``address`` if dask.distributed speaks its protocol (``tcp://``, ``tls://``, ... or none: ``HOST:PORT``),
    else a ConfigError (2) naming the forms accepted (``http://`` was an internal error, "unknown address
    scheme")."""
    from dask.distributed import comm  # through dask[distributed], the declared dependency

    registry = comm.registry
    scheme = address.split("://", 1)[0] if "://" in address else "tcp"
    try:
        registry.get_backend(scheme)
    except ValueError as err:
        known = ", ".join(f"{name}://HOST:PORT" for name in sorted(registry.backends))
        msg = (
            f"--scheduler {address}: {scheme}:// is not a dask scheduler protocol; give {known}, HOST:PORT "
            "(tcp), or the scheduler file that `dask scheduler --scheduler-file FILE` writes"
        )
        raise ConfigError(msg) from err
    return address


WORKER_WARN_S = 10.0  # a scheduler without a worker after this long: warned about
WORKER_WAIT_S = 120.0  # ... and given up on after this long (POSTCAST_WORKER_WAIT_S overrides it)


def wait_for_workers(client: Any, named: str, address: str) -> None:
    """Return once the scheduler has a worker: a warning after WORKER_WARN_S, a MissingInputError (66) after
    WORKER_WAIT_S (or $POSTCAST_WORKER_WAIT_S) seconds (a scheduler without workers waited forever, silently)."""
    wait = float(os.environ.get("POSTCAST_WORKER_WAIT_S", WORKER_WAIT_S))
    first = min(WORKER_WARN_S, wait)
    try:
        client.wait_for_workers(1, timeout=first)
        return
    except TimeoutError:
        if wait > first:
            log.warning(
                "the dask scheduler at %s has no worker after %g s: waiting up to %g s more (start one: "
                "dask worker %s)",
                named,
                first,
                wait - first,
                address,
            )
    try:
        client.wait_for_workers(1, timeout=max(wait - first, 1e-3))
    except TimeoutError as err:
        msg = (
            f"the dask scheduler at {named} has no worker after {wait:g} s: start workers (dask worker {address}) "
            "and rerun"
        )
        raise MissingInputError(msg) from err


@contextmanager
def lost_scheduler(client: Any, named: str) -> Iterator[None]:
    """A failure of the work inside while the scheduler is gone becomes one MissingInputError (66) saying to
    rerun (an ingest resumes from the dates it finished), not an internal error with distributed's
    ``FutureCancelledError ... scheduler-connection-lost``."""
    try:
        yield
    except PostcastError:
        raise
    except Exception as err:
        with _quiet_connection_reports():
            if client.status == "running" and _answers(client):
                raise
        msg = (
            f"the dask scheduler at {named} was lost during the run ({type(err).__name__}): the work finished so "
            "far is kept; start the scheduler and its workers again and rerun to resume"
        )
        raise MissingInputError(msg) from err


@contextmanager
def _quiet_connection_reports() -> Iterator[None]:
    """distributed's ERROR records with tracebacks of a client's failed reconnections, kept off stderr."""
    quiet = [logging.getLogger(n) for n in ("distributed.client", "distributed.batched", "distributed.core")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(max(logging.CRITICAL + 1, q.level))
    try:
        yield
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)


def _answers(client: Any) -> bool:
    """Whether the scheduler still answers the client (within a few seconds)."""
    try:
        client.run_on_scheduler(os.getpid)
    except Exception:  # (a lost connection raises any of a few kinds: every one means "no")
        return False
    return True


def _close(client: Any) -> None:
    """Close ``client``; one whose scheduler is gone does not wait for it."""
    try:
        client.close(timeout=5)
    except Exception:  # (closing a lost connection fails in several ways; nothing is left to do)
        log.debug("closing the dask client of a lost scheduler", exc_info=True)


@contextmanager
def _driver_environment_kept() -> Iterator[None]:
    """This process's environment as it was, once the local workers have started: distributed's nanny sets the
    variables its workers start with (``distributed.nanny.pre-spawn-environ``: OMP_NUM_THREADS=1, the MKL and
    OpenBLAS threads, MALLOC_TRIM_THRESHOLD_) in the driver's own ``os.environ`` and leaves them there, so torch,
    first used after an ingest in the same process (``postcast run``), ran on one thread whatever the cores."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(before):
            del os.environ[key]
        os.environ.update(before)


@contextmanager
def _workers_share_one_arena() -> Iterator[None]:
    """Worker processes started inside share glibc's main arena (:data:`heap.ONE_ARENA_ENVIRON`, added to
    ``distributed.nanny.pre-spawn-environ``; a MALLOC_ARENA_MAX of the driver's environment still wins). With an
    arena per thread (the task's, zarrs' and blosc's threads) each kept what its thread freed, and an ingest
    worker's resident peak grew with the dates it had done: 0.66 -> 0.72 and 0.86 GB from 16 to 64 dates at
    0.5 deg, 0.62 -> 0.64 GB sharing one, the same CPU time (docs/scale.md)."""
    import dask

    key = "distributed.nanny.pre-spawn-environ"
    with dask.config.set({key: {**dask.config.get(key, default={}), **heap.ONE_ARENA_ENVIRON}}):
        yield


@contextmanager
def _children_ignore_interrupts() -> Iterator[None]:
    """Processes started inside inherit an ignored SIGINT: Ctrl-C, which a terminal sends to the whole process
    group, reaches the driver alone, which closes the cluster and reports one line (interrupted themselves,
    the workers printed heartbeat tracebacks and were killed after 4 s). A Ctrl-C while the local workers
    start is dropped with theirs. Only the main thread sets signal handlers: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def is_address(scheduler: str) -> bool:
    """``tcp://HOST:PORT`` (any protocol) or ``HOST:PORT`` is an address; anything else a scheduler file."""
    return "://" in scheduler or re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[\w.-]+):\d+", scheduler) is not None


def scheduler_file_address(path: str) -> str:
    """The scheduler address in a dask scheduler file (JSON with an ``address``)."""
    fix = f"start the scheduler with `dask scheduler --scheduler-file {path}` or pass its address tcp://HOST:PORT"
    try:
        text = Path(path).read_text()
    except FileNotFoundError as err:
        msg = f"scheduler file {path} not found: {fix}"
        raise MissingInputError(msg) from err
    except (OSError, UnicodeDecodeError) as err:
        msg = f"scheduler file {path} cannot be read ({err.__class__.__name__}): {fix}"
        raise MissingInputError(msg) from err
    try:
        address = json.loads(text).get("address")
    except (ValueError, AttributeError):
        address = None
    if not isinstance(address, str) or not address:
        msg = (
            f'scheduler file {path} holds no scheduler address (JSON with "address", as `dask scheduler '
            f"--scheduler-file {path}` writes it; empty while the scheduler starts): {fix}"
        )
        raise MissingInputError(msg)
    return address


class _NoTaskFailureReports(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not (
            msg.startswith(("Compute Failed", "Failed to communicate with scheduler"))
            or (msg.startswith("Async instruction for") and msg.endswith("ended with CancelledError"))
        )


def quiet_task_failures() -> None:
    """Drop three reports of distributed's in a worker: "Compute Failed ... Traceback" (the driver re-raises
    the task's error and reports it as one line), "Failed to communicate with scheduler during heartbeat ...
    Traceback" (a scheduler slow to answer on a loaded machine, or closed by the driver at an interrupt: the
    worker retries, and a scheduler lost for good ends the ingest in the driver) and "Async instruction for
    <Task cancelled ...> ended with CancelledError" (a task cut short as the worker closes: after a refused
    date, the driver closes the cluster with the other dates still running)."""
    for name in ("distributed.worker", "distributed.worker.state_machine"):
        worker_log = logging.getLogger(name)
        if not any(isinstance(f, _NoTaskFailureReports) for f in worker_log.filters):
            worker_log.addFilter(_NoTaskFailureReports())


KEEP_FREED_BYTES = 1 << 30  # free heap memory a worker keeps for the next temporaries
# blocks larger than this are mapped and unmapped: above a 0.5 deg float64 slice (2 MB), below a field's partials
MMAP_ABOVE_BYTES = 4 << 20


@functools.cache  # once per process
def keep_freed_memory() -> bool:
    """Let this process reuse freed memory for its next temporaries instead of handing it back to the
    kernel. dask starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which also freezes glibc's mmap
    threshold at 128 kB: every float64 temporary of a slice (a few MB) is then a fresh mapping whose pages
    the kernel faults in and zeroes again, a third of an ingest's CPU time on a virtual machine
    (docs/ingest.md). Blocks up to 4 MB now come from the heap, which keeps up to 1 GB free; larger
    blocks (a field's partials, which outlive the task, and a date's member array) are mapped and go back
    at once, so that they do not pin the heap between the task's temporaries (at 32 MB they did, and a
    worker's resident memory depended on its history). No-op (False) outside glibc."""
    mapped = heap.mallopt(heap.M_MMAP_THRESHOLD, MMAP_ABOVE_BYTES)
    return mapped and heap.mallopt(heap.M_TRIM_THRESHOLD, KEEP_FREED_BYTES)


def worker_memory_gb(client: Any) -> float | None:
    """The smallest memory a worker of the cluster may use (GB): its dask memory limit or, for a worker
    without one (the LocalCluster :func:`dask_client` starts), its host's RAM shared by the workers on
    that host; None when there is no worker."""
    info = client.scheduler_info().get("workers", {})
    limits = {addr: float(w.get("memory_limit") or 0) for addr, w in info.items()}
    unlimited = [addr for addr, lim in limits.items() if lim <= 0]
    if unlimited:
        ram = client.run(_host_memory, workers=unlimited)
        per_host = collections.Counter(w.get("host") for w in info.values())
        limits |= {addr: ram[addr] / per_host[info[addr].get("host")] for addr in unlimited}
    return min(limits.values()) / 1e9 if limits else None


def _host_memory() -> float:
    import psutil  # a dependency of dask.distributed

    return float(psutil.virtual_memory().total)
