"""One ingest per store at a time: ``OUT.lock`` beside the store, held (``flock``) for the whole run.

A second ingest into the same ``--out`` while one runs is refused at once, naming the process that
holds the lock (ConfigError, exit 2): two runs would write the same partial store and markers. The
kernel releases the lock when its process ends, however it ends, so the lock file a killed run
leaves behind is stale: the next run takes it over. A run that ends (done or failed) removes the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from postcast.datasets.core.errors import ConfigError, OutputError

log = logging.getLogger(__name__)


def lock_path(out: str | os.PathLike[str]) -> Path:
    """The lock of the store ``out`` (``OUT.lock``)."""
    p = Path(out)
    return p.with_name(p.name + ".lock")


@contextlib.contextmanager
def hold(out: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the lock of ``out`` for the block; a ConfigError when another live process holds it, an
    OutputError (exit 74) when the lock cannot be made (a read-only folder, --out under a regular file)."""
    path = lock_path(out)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = _acquire(path, out)
    except OSError as err:  # read-only, under a regular file, the lock a folder: nowhere to write
        fix = f"remove the folder {path} (the lock goes there)" if path.is_dir() else "choose a writable folder"
        msg = f"{out}: cannot create the store's lock {path} ({err.strerror or err}); {fix}"
        raise OutputError(msg) from err
    try:
        holder = os.read(fd, 200).decode(errors="replace").strip()
        if holder:
            log.info("taking over the lock %s of a process that no longer runs (%s)", path, holder)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        path.unlink(missing_ok=True)  # while held: no other run has it open as its lock
        os.close(fd)  # releases the lock


def _acquire(path: Path, out: str | os.PathLike[str]) -> int:
    """A descriptor of ``path`` holding its exclusive lock. A file another run removed between our open and
    our lock is not the lock any more: open the one now at ``path`` instead."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            msg = (
                f"{out}: another ingest ({holder}) is writing this store now; wait for it to finish or "
                f"choose another --out (the lock {path} is released when that process ends)"
            )
            raise ConfigError(msg) from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
