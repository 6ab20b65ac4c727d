"""How the benchmarks measure: a child process's peak memory is its own, not its parent's."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_ingest_memory_benchmark_reports_the_childs_own_peak():
    """benchmarks/ingest_memory.py's child reports its resident high-water mark (KiB). Started by a parent that
    holds 512 MB, a child that holds a few MB reports a few MB: ru_maxrss, which Linux carries from the parent
    through fork and exec, reported the parent's 512 MB (the benchmark's ingest process at 1 deg read 792 MB
    where its resident memory peaked at 192 MB)."""
    peak_snippet = runpy.run_path(str(ROOT / "benchmarks" / "ingest_memory.py"))["PEAK"]
    held = bytearray(512 << 20)
    held[:: 1 << 12] = b"\1" * len(held[:: 1 << 12])  # every page touched: resident
    out = subprocess.run([sys.executable, "-c", peak_snippet], capture_output=True, text=True, check=True)
    child_mb = int(out.stdout.split()[-1]) / 1024
    assert 1 < child_mb < 128, child_mb
    del held
