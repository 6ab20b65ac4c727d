"""Ingest memory per process against the number of dates: the two-pass statistics reduce on the workers
(a tree per field), so neither the ingest process nor a worker should grow from N to 4N dates.

For N and 4N training init dates (every ENS-10 variable, the 11 levels: 88 member fields; 10 members,
3 steps) at ``--resolution`` degrees, the script writes the synthetic source (not measured), then runs
`ingest` with ``statistics="two-pass"`` in a child process on a LocalCluster of ``--workers``
single-threaded worker processes, sampling the resident memory of the ingest process and of each worker
(psutil, every 0.2 s; the kernel's high-water mark of the ingest process too, VmHWM). Prints a table, writes JSON
(``--out``) and ends with ``RESULT main_MB_N=.. main_MB_4N=.. worker_MB_N=.. worker_MB_4N=..``.

    python benchmarks/ingest_memory.py --resolution 2.5 --dates 1   # ~5 min on the shared 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

# The child's own high-water mark, VmHWM (KiB): per address space, so it starts again at exec. Not ru_maxrss:
# Linux carries that over from the parent at fork, through exec, so the child reported this script's size
# after writing the synthetic source (792 MB at 1 deg for an ingest process whose resident memory peaked
# at 192 MB; tests/test_benchmark_measures.py).
PEAK = """
import re
print(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
"""
CHILD = (
    """
import sys
from postcast.datasets.ingest.run import IngestConfig, ingest
cfg = IngestConfig(source=sys.argv[1], out=sys.argv[2], workers=int(sys.argv[3]), progress=False, statistics="two-pass")
ingest(cfg)
"""
    + PEAK
)


def _sample(proc: subprocess.Popen[str], peak: dict[str, int], halt: threading.Event) -> None:
    """Peak RSS of ``proc`` ("main") and of the largest of its descendants ("worker")."""
    import psutil

    me = psutil.Process(proc.pid)
    while not halt.wait(0.2):
        with contextlib.suppress(psutil.Error):
            peak["main"] = max(peak.get("main", 0), me.memory_info().rss)
            for p in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    peak["worker"] = max(peak.get("worker", 0), p.memory_info().rss)


def measure(root: Path, resolution: float, dates: int, workers: int) -> dict[str, Any]:
    from postcast.datasets import schema
    from postcast.datasets.synth import synthfiles
    from postcast.datasets.synth.synthetic import SynthConfig

    raw, out = root / f"raw{dates}", root / f"store{dates}.zarr"
    cfg = SynthConfig(seed=1, resolution=resolution, years=(2012, 2012), dates_per_year=dates, levels=schema.LEVELS)
    synthfiles.write_synthetic(cfg, raw, progress=False)
    peak: dict[str, int] = {}
    halt = threading.Event()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(raw), str(out), str(workers)], stdout=subprocess.PIPE, text=True
    )
    sampler = threading.Thread(target=_sample, args=(proc, peak, halt), daemon=True)
    sampler.start()
    stdout, _ = proc.communicate()
    halt.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"ingest of {dates} dates failed ({proc.returncode})")
    return {
        "dates": dates,
        "fields": len(schema.PL_VARIABLES) * len(schema.LEVELS) + len(schema.SFC_VARIABLES),
        "main_MB": round(max(peak.get("main", 0), int(stdout.split()[-1]) * 1024) / 2**20),
        "worker_MB": round(peak.get("worker", 0) / 2**20),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--resolution", type=float, default=2.5, help="grid spacing in degrees (0.5: ENS-10's)")
    ap.add_argument("--dates", type=int, default=1, help="N: the runs ingest N and 4N training dates")
    ap.add_argument("--workers", type=int, default=1, help="LocalCluster worker processes")
    ap.add_argument("--out", default="benchmarks/results/ingest_memory.json", help="JSON results path")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(Path(tmp), args.resolution, n, args.workers) for n in (args.dates, 4 * args.dates)]
    print(f"{'dates':>6} {'fields':>6} {'main_MB':>8} {'worker_MB':>9}   ({args.resolution} deg, two-pass statistics)")
    for r in rows:
        print(f"{r['dates']:>6} {r['fields']:>6} {r['main_MB']:>8} {r['worker_MB']:>9}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"resolution": args.resolution, "workers": args.workers, "rows": rows}))
    a, b = rows
    print(
        f"RESULT main_MB_N={a['main_MB']} main_MB_4N={b['main_MB']} "
        f"worker_MB_N={a['worker_MB']} worker_MB_4N={b['worker_MB']}"
    )


if __name__ == "__main__":
    main()
