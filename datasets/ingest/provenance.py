"""What a finished store records about how it was made: the checksums of its sources (computed on the
workers), the chunk checksums the date tasks left in their done-markers, the code version, and the store's
attributes (format, plan, splits, targets, the ingest options and their fingerprint). ``run._finalise`` writes
them when it marks the store complete; ``postcast inspect --verify`` checks the chunks against them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from postcast.datasets import contract, schema, sources
from postcast.datasets.core import checksums
from postcast.datasets.core.version import __version__
from postcast.datasets.ingest import merge as ingest_merge


def source_checksums(client: Any, plan: sources.Plan, found: sources.Discovered) -> tuple[list[str], list[Any]]:
    """(source paths, futures of their checksums), computed on the workers of ``client`` (a dask.distributed
    Client) after the date tasks."""
    files = list(plan.files)
    if found.truth is not None:
        files += list(found.truth.paths)
    if found.oracle is not None:
        files += list(found.oracle.paths)
    files = [str(f) for f in files]
    return files, client.map(_checksum, files, pure=False, priority=-ingest_merge.MERGE_PRIORITY)


def written_chunks(done_dir: Path) -> dict[str, dict[str, Any]]:
    """The chunk checksums the date tasks left in their done-markers (written atomically as JSON)."""
    out: dict[str, dict[str, Any]] = {}
    for marker in done_dir.iterdir():
        if marker.name.startswith("."):
            continue
        try:
            out.update(json.loads(marker.read_text()).get("chunks", {}))
        except (ValueError, AttributeError):  # unreadable: that date's chunks are hashed at the end instead
            continue
    return out


def attributes(
    plan: sources.Plan,
    found: sources.Discovered,
    truth_vars: list[str],
    splits: schema.Splits,
    options: dict[str, Any],
    fingerprint: str,
    sums: dict[str, str],
) -> dict[str, Any]:
    """A complete store's attributes: format version and completeness, where it came from (the source kind,
    ``sums``: each source path's checksum), the code version, the plan, the splits, the targets with truth,
    the ingest ``options`` and their resume ``fingerprint``."""
    attrs = {
        contract.VERSION_ATTR: contract.FORMAT_VERSION,
        contract.COMPLETE_ATTR: True,
        "title": "postcast training store (ENS-10 schema)",
        "Conventions": "CF-1.10",
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "code_version": code_version(),
        "source_kind": found.forecast.kind,
        "sources": sums,
        "plan": {k: v for k, v in plan.to_dict().items() if k not in ("init_times", "files")},
        **plan.regridding,
        "n_init_times": len(plan.init_times),
        "splits": splits.as_dict(),
        "targets": [t for t in schema.TARGETS if contract.truth_name(t) in truth_vars],  # those with truth
        "truth_missing_at_48h": found.truth.coverage(plan) if found.truth is not None else {},
        "ingest_config": options,
        "ingest_fingerprint": fingerprint,
    }
    if found.oracle is not None:
        attrs["has_oracle"] = True
    return attrs


def code_version() -> str:
    """postcast's version, with the git commit of this checkout when there is one."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{__version__}+g{sha}" if sha else __version__


def _checksum(path: str) -> str:
    """A source's checksum: SHA-256 of a file; of a zarr store's metadata and chunk sizes."""
    p = Path(path)
    if p.is_dir():  # zarr store: hash the metadata and chunk sizes (cheap, detects changes)
        h = hashlib.sha256()
        for q in sorted(p.rglob("*")):
            if q.is_file():
                h.update(f"{q.relative_to(p)}:{q.stat().st_size}".encode())
                if q.name == "zarr.json":
                    h.update(q.read_bytes())
        return "tree-sha256:" + h.hexdigest()
    return "sha256:" + checksums.sha256_file(p)
