"""SHA-256 checksums of a file (or its first bytes) and of a directory tree (a zarr store): what ingest's
manifest, the integrity check and the forecast files' ``checkpoint_sha256`` record."""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

BLOCK_BYTES = 1 << 20  # read size: one buffer, reused (a new bytes object per block would be fresh memory each time)


def sha256_file(path: str | os.PathLike[str], *, limit: int | None = None) -> str:
    """SHA-256 of a file (or of its first ``limit`` bytes), hex. The file is read into one reused buffer: blocks
    read as new bytes objects were each a fresh mapping the kernel faulted in (tests/test_checksums.py)."""
    h = hashlib.sha256()
    buf = bytearray(BLOCK_BYTES)
    view = memoryview(buf)
    remaining = math.inf if limit is None else limit
    with open(path, "rb", buffering=0) as f:
        while remaining > 0:
            n = f.readinto(view[: int(min(BLOCK_BYTES, remaining))])
            if not n:
                break
            h.update(view[:n])
            remaining -= n
    return h.hexdigest()


def sha256_tree(path: str | os.PathLike[str]) -> str:
    """SHA-256 over a directory's relative file names and contents (e.g. a zarr store)."""
    root = Path(path)
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(str(p.relative_to(root)).encode())
        h.update(sha256_file(p).encode())
    return h.hexdigest()
