"""Chunk checksums of a training store: recorded at the end of ingest, checked by ``postcast inspect --verify``.

zarr 3 does not write a chunk that holds only the fill value, and reads an absent chunk as the fill
value (NaN): a deleted chunk file is indistinguishable from missing data, and nothing notices until a
model trains to ``val_crps=nan``. So ingest records, in :data:`MANIFEST` at the store's root, the
size and SHA-256 of every chunk file it wrote; :func:`verify` reads every chunk file back, compares
it with the record, decodes with zarr any chunk the record does not vouch for (a truncated chunk is
reported, not raised as a codec error), and lists what is missing, damaged or undecodable.
"""

from __future__ import annotations

import itertools
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from postcast.datasets import io
from postcast.datasets.core import checksums
from postcast.datasets.core.errors import BadInputError

MANIFEST = "postcast-chunks.json"  # {"version": 1, "chunks": {"<array>/c/i/j/k": {"size": n, "sha256": hex}}}
MANIFEST_VERSION = 1


def _chunk_files(root: Path) -> list[Path]:
    """Every chunk file of every array in the store (zarr 3's default key encoding: ``ARRAY/c/i/j/k``)."""
    return sorted(p for p in root.rglob("*") if p.is_file() and "c" in p.relative_to(root).parts[:-1])


def chunk_record(root: Path, path: Path) -> tuple[str, dict[str, Any]]:
    """(key relative to the store root, {"size", "sha256"}) of one chunk file."""
    return path.relative_to(root).as_posix(), {"size": path.stat().st_size, "sha256": checksums.sha256_file(path)}


def date_chunks(store_path: str | os.PathLike[str], arrays: list[str], index: int) -> dict[str, dict[str, Any]]:
    """The records of the chunk files of init date ``index`` (the chunk row ``ARRAY/c/index/...``) of
    ``arrays``, arrays chunked one init date per chunk along their first axis: what an ingest task hashes
    right after writing them, while they are in the page cache."""
    root = Path(store_path)
    out: dict[str, dict[str, Any]] = {}
    for name in arrays:
        row = root / name / "c" / str(index)
        files = [row] if row.is_file() else sorted(p for p in row.rglob("*") if p.is_file())
        out.update(chunk_record(root, p) for p in files)
    return out


def record(store_path: str | os.PathLike[str], known: dict[str, dict[str, Any]] | None = None) -> int:
    """Write the chunk manifest of a freshly written store; returns the number of chunks recorded. ``known``
    holds records made when the chunks were written (:func:`date_chunks`); a chunk file of the same size is
    taken from it, every other one is hashed here."""
    root = Path(store_path)
    known = known or {}
    files = _chunk_files(root)
    keys = [p.relative_to(root).as_posix() for p in files]
    chunks: dict[str, dict[str, Any]] = {}
    for key, p in zip(keys, files, strict=True):
        rec = known.get(key)
        if rec is not None and rec["size"] == p.stat().st_size:
            chunks[key] = rec
    todo = [p for key, p in zip(keys, files, strict=True) if key not in chunks]
    # hashlib releases the GIL: the chunks nobody hashed yet (the statistics group's) use every core
    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
        chunks.update(pool.map(lambda p: chunk_record(root, p), todo))
    chunks = {key: chunks[key] for key in keys}
    io.write_json(root / MANIFEST, {"version": MANIFEST_VERSION, "chunks": chunks})
    return len(chunks)


@dataclass
class Report:
    """What :func:`verify` found. ``ok`` only when every recorded chunk is present, intact and decodable."""

    store: str
    checked: int = 0
    recorded: bool = False
    missing: list[str] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)
    undecodable: list[str] = field(default_factory=list)
    infinite: dict[str, int] = field(default_factory=dict)  # array -> its +-Inf values (a store older than the check)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.damaged or self.undecodable or self.infinite)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "chunks_checked": self.checked,
            "checksums_recorded": self.recorded,
            "missing": self.missing,
            "damaged": self.damaged,
            "undecodable": self.undecodable,
            "infinite": self.infinite,
        }

    def problem(self) -> str:
        """One line naming the first few bad chunks and the fix ('' when ok)."""
        if self.ok:
            return ""
        if not (self.missing or self.damaged or self.undecodable):
            counts = ", ".join(f"{name} {n} infinite values" for name, n in self.infinite.items())
            return (
                f"{self.store}: {counts} (written before ingest refused non-finite values); rebuild the store "
                "from a finite source with `postcast ingest --overwrite`"
            )
        parts = [
            f"{len(v)} {k}"
            for k, v in (("missing", self.missing), ("damaged", self.damaged), ("undecodable", self.undecodable))
            if v
        ]
        first = (self.missing + self.damaged + self.undecodable)[:3]
        return (
            f"{self.store}: {', '.join(parts)} chunk(s) of {self.checked} (first: {', '.join(first)}); "
            "rebuild the store with `postcast ingest --overwrite`"
        )


def verify(store_path: str | os.PathLike[str]) -> Report:
    """Read every chunk of the store: against the manifest (when ingest recorded one) and through zarr."""
    root = Path(store_path)
    rep = Report(str(root))
    manifest = root / MANIFEST
    recorded = _read_manifest(manifest) if manifest.is_file() else {}
    rep.recorded = manifest.is_file()
    for key, want in sorted(recorded.items()):
        path = root / key
        if not path.is_file():
            rep.missing.append(key)
        elif path.stat().st_size != want["size"] or checksums.sha256_file(path) != want["sha256"]:
            rep.damaged.append(key)
    intact = set(recorded) - set(rep.missing) - set(rep.damaged)
    decoded, rep.undecodable = _decode_all(root, skip=intact | set(rep.damaged))
    rep.checked = len(intact) + len(rep.damaged) + decoded
    if not (rep.missing or rep.damaged or rep.undecodable):
        rep.infinite = _infinities(root)
    return rep


def _infinities(root: Path) -> dict[str, int]:
    """The number of +-Inf values of each floating-point array holding any, read a chunk at a time (ingest
    refuses them now; an older store may hold them, and every statistic over them is NaN or Inf)."""
    group = zarr.open_group(root, mode="r", zarr_format=3)
    out = {}
    for name, arr in group.members(max_depth=None):
        if isinstance(arr, zarr.Array) and np.issubdtype(arr.dtype, np.floating):
            n = sum(int(np.isinf(arr.blocks[idx]).sum()) for idx in itertools.product(*map(range, arr.cdata_shape)))
            if n:
                out[name] = n
    return out


def _read_manifest(path: Path) -> dict[str, dict[str, Any]]:
    try:
        chunks = json.loads(path.read_text())["chunks"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        msg = f"{path}: unreadable chunk manifest ({err}); rebuild the store with `postcast ingest --overwrite`"
        raise BadInputError(msg) from err
    return chunks if isinstance(chunks, dict) else {}


def _decode_all(root: Path, skip: set[str]) -> tuple[int, list[str]]:
    """Decode through zarr every chunk file present that ``skip`` does not name (chunks whose bytes
    match the checksum recorded when zarr wrote them need no decoding); (chunks read, keys that failed)."""
    group = zarr.open_group(root, mode="r", zarr_format=3)
    n, bad = 0, []
    for name, arr in group.members(max_depth=None):
        if not isinstance(arr, zarr.Array):
            continue
        grid = [range(k) for k in arr.cdata_shape]
        for idx in itertools.product(*grid):
            key = "/".join([name, "c", *map(str, idx)])
            if key in skip or not (root / key).is_file():
                continue
            n += 1
            try:
                arr.blocks[idx]
            except Exception:  # (any codec error means the chunk cannot be read)
                bad.append(key)
    return n, bad
