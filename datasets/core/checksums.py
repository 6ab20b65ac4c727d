"""SHA-256 checksums of a file (or its first bytes) and of a directory tree (a zarr store): what ingest's
manifest, the integrity check and the forecast files' ``checkpoint_sha256`` record."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def sha256_file(path: str | os.PathLike[str], *, limit: int | None = None) -> str:
    """SHA-256 of a file (or of its first ``limit`` bytes), hex."""
    h = hashlib.sha256()
    remaining = limit
    with open(path, "rb") as f:
        while True:
            n = 1 << 22 if remaining is None else min(1 << 22, remaining)
            if n == 0:
                break
            buf = f.read(n)
            if not buf:
                break
            h.update(buf)
            if remaining is not None:
                remaining -= len(buf)
    return h.hexdigest()


def sha256_tree(path: str | os.PathLike[str]) -> str:
    """SHA-256 over a directory's relative file names and contents (e.g. a zarr store)."""
    root = Path(path)
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(str(p.relative_to(root)).encode())
        h.update(sha256_file(p).encode())
    return h.hexdigest()
