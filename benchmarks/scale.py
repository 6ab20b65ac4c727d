"""ENS-10 at its real grid: memory and time of every stage at N and 4N init dates, projected to the benchmark.

At 0.5 deg (361 x 720), a synthetic world with one forecast field (T at 850 hPa, 10 members, steps
0/24/48 h) and the T850 truth, years 2014-2017 split train 2014-2015, val 2016, test 2017, the script
runs each stage as users run it, as its own ``postcast`` process:

    synth -> ingest (LocalCluster, 2 workers) -> train fit (T850 pointwise MLP, 1 epoch, every sample
          cache of the process capped at 64 MB, less than the smallest store) -> emos (the T850 local
          EMOS's per-point fit) -> evaluate (the MLP on the test split) -> forecast (every test date)

twice: with N and with 4N init dates (N/4 and N dates a year). N must give full batches and full
evaluate tasks (4 test dates each): with N = 16 the small run has 8 training and 4 test dates. For each
stage it reads, every 0.2 s, the resident high-water mark (VmHWM, which the kernel keeps per process, so a
peak between samples counts) of every process of the stage's tree (dask workers and loader workers
included; psutil finds them) and keeps each process's own peak: the largest is the process peak. The stage's
memory is the driver's peak plus every descendant at the largest descendant's peak: the tree once every worker
is as busy as the busiest, as at ENS-10's size (with 2 workers, N = 16 gives evaluate one task and leaves a
worker idle, which the plain sum of peaks counted as growth at 4N); the sum of peaks (an upper bound of the
tree's at any one instant, for the workers the run kept busy) and the largest sum of resident memory seen at
one sample (a lower bound) are kept beside it; wall time; and the CPU time of the tree
(``RUSAGE_CHILDREN``: every descendant that was waited for). Until 2026-11-27 it kept the sampled
resident memory alone, which misses peaks shorter than the interval and so caught more of them in the
longer 4N run (a training's true peak 2.82 and 2.84 GB read 2.25 and 2.70 GB).

Projection to ENS-10 (2,100 init dates of which about 1,680 train, 210 validation, 210 test): memory
is fitted as a + b x dates through the two sizes (test dates for evaluate and forecast, all dates for
the others) and evaluated there; the largest projected stage and process give ``ens10_peak_rss_GB``.
``ens10_evaluate_core_hours`` is evaluate's CPU time per test date (the slope between the sizes)
times 210. Both project *this* stage set (one field); docs/scale.md says what the full width adds.
``ens10_peak_rss_GB`` includes the EMOS fit (fitted a latitude band of points at a time, its memory does
not grow with the training dates).

    python benchmarks/scale.py              # N=16: about 30 min on 2 cores, 6 GB of disk
    python benchmarks/scale.py --dates 4    # N=4: a quick look (partial batches and tasks: not flat)
    python benchmarks/scale.py --stages emos --out benchmarks/results/scale_emos.json   # synth, ingest, emos

Prints a table, writes JSON (``--out``) and ends with
``RESULT ingest_rss_growth=.. train_rss_growth=.. evaluate_rss_growth=.. forecast_rss_growth=..
emos_rss_growth=.. ens10_peak_rss_GB=.. ens10_evaluate_core_hours=..`` (growth: the stage's memory, every
worker busy, 4N over N; the sum of peaks' growth is in the JSON as ``*_tree_sum_growth``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "configs" / "train" / "mlp_t850.yaml"  # batch_size 4
# the ENS-10 baseline MLP (the preset's defaults before 2026-11-27), so that the figures compare with earlier runs
BASELINE_MLP = ("--model.net", "{hidden: 128, layers: 1, embedding: 0}")
EMOS = ROOT / "configs" / "train" / "emos_t850.yaml"
CACHE_BYTES = 64 * 2**20
YEARS = (2014, 2017)
SPLITS = ("--train-years", "2014:2015", "--val-years", "2016:2016", "--test-years", "2017:2017")
ENS10_DATES = {"synth": 2100, "ingest": 2100, "train": 2100, "emos": 2100, "evaluate": 210, "forecast": 210}
GB = 2**30
# multiprocessing's own helper processes: small, one per tree, counted at their own peak like any process that is
# not a worker (a `git` the driver runs, say)
HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
STAGES = ("train", "emos", "evaluate", "forecast")  # after synth and ingest, which every run needs


@dataclass
class Stage:
    stage: str
    dates: int  # the dates the stage's memory is fitted against (test dates for evaluate and forecast)
    wall_s: float
    cpu_s: float
    tree_peak_GB: float  # the sum of every process's own peak: an upper bound of the tree's at any instant
    process_peak_GB: float  # the largest process's own peak
    processes: int  # the most processes seen at once in the tree
    driver_peak_GB: float = 0.0  # the postcast process itself
    worker_peak_GB: float = 0.0  # the largest worker's (dask workers, loader workers: :func:`_role`)
    tree_sampled_GB: float = 0.0  # the largest sum of the tree's RSS seen at one sample (a lower bound)
    busy_bound_GB: float = 0.0  # driver + every worker at the largest one's peak + the others': every worker busy
    workers: int = 0  # the most workers seen at once


def _hwm(p: psutil.Process) -> int:
    """The process's resident high-water mark (VmHWM, bytes): the kernel keeps it per address space, so a peak
    between two samples is not missed (a training step's activations last less than the 0.2 s interval)."""
    with open(f"/proc/{p.pid}/status") as f:
        kib = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    return int(kib) << 10


def _role(p: psutil.Process, root: psutil.Process) -> str:
    """``worker`` for a process multiprocessing started as a worker (spawned: dask's workers; forked: the root's
    own command line, a fork-started loader worker), ``other`` for anything else (its helpers, a `git`)."""
    cmd = p.cmdline()
    if any(h in " ".join(cmd) for h in HELPERS):
        return "other"
    return "worker" if any("spawn_main" in c for c in cmd) or cmd == root.cmdline() else "other"


def _sample(
    pid: int,
    peaks: dict[tuple[int, float], int],
    roles: dict[tuple[int, float], str],
    seen: dict[str, int],
    halt: threading.Event,
) -> None:
    """Every 0.2 s until ``halt``: each process's own peak into ``peaks`` and its role into ``roles`` (by pid and
    start time: the root is the ``driver``), the largest sum of the tree's RSS at one sample and the most processes
    and workers at once into ``seen``."""
    root = psutil.Process(pid)
    while not halt.wait(0.2):
        with contextlib.suppress(psutil.Error):
            rss, now = [], []
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error, OSError, StopIteration):
                    rss.append(p.memory_info().rss)
                    key = (p.pid, p.create_time())
                    peaks[key] = max(peaks.get(key, 0), rss[-1], _hwm(p))
                    if key not in roles:
                        roles[key] = "driver" if p.pid == pid else _role(p, root)
                    now.append(key)
            seen["tree"] = max(seen.get("tree", 0), sum(rss))
            seen["processes"] = max(seen.get("processes", 0), len(rss))
            seen["workers"] = max(seen.get("workers", 0), sum(roles[k] == "worker" for k in now))


def _cpu_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def postcast(*args: str) -> list[str]:
    return [sys.executable, "-m", "postcast", "--no-progress", *args]


def run_stage(name: str, dates: int, cmd: list[str], log: Path) -> Stage:
    """Run ``cmd`` as a process, sampling its tree; a failure ends the benchmark with its log."""
    cpu0, t0 = _cpu_children(), time.perf_counter()
    peaks: dict[tuple[int, float], int] = {}
    roles: dict[tuple[int, float], str] = {}
    seen: dict[str, int] = {}
    halt = threading.Event()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        sampler = threading.Thread(target=_sample, args=(proc.pid, peaks, roles, seen, halt), daemon=True)
        sampler.start()
        rc = proc.wait()
    halt.set()
    sampler.join()
    wall, cpu = time.perf_counter() - t0, _cpu_children() - cpu0
    if rc != 0:
        raise SystemExit(f"{name} ({dates} dates) failed with exit {rc}: {' '.join(cmd)}\n{log.read_text()[-3000:]}")
    driver = sum(v for k, v in peaks.items() if roles.get(k) == "driver")
    worker = max((v for k, v in peaks.items() if roles.get(k) == "worker"), default=0)
    others = sum(v for k, v in peaks.items() if roles.get(k) == "other")
    busy = driver + others + seen.get("workers", 0) * worker
    return Stage(
        *(name, dates, round(wall, 1), round(cpu, 1), sum(peaks.values()) / GB, max(peaks.values(), default=0) / GB),
        *(seen.get("processes", 0), driver / GB, worker / GB, seen.get("tree", 0) / GB, busy / GB),
        seen.get("workers", 0),
    )


def _best_checkpoint(root: Path) -> Path:
    found = sorted(root.glob("lightning_logs/version_*/checkpoints/best*.ckpt"))
    if not found:
        raise SystemExit(f"no best checkpoint under {root}")
    return found[-1]


def one_size(work: Path, per_year: int, workers: int, stages: tuple[str, ...] = STAGES) -> list[Stage]:
    """Synth, ingest and ``stages`` at ``per_year`` dates a year over YEARS, in ``work``."""
    raw, store = work / "raw", work / "store.zarr"
    synth_cfg = work / "synth.yaml"
    synth_cfg.write_text(
        "kind: synth\nseed: 0\nresolution: 0.5\n"
        f"years: [{YEARS[0]}, {YEARS[1]}]\ndates_per_year: {per_year}\n"
        "levels: [850]\nvariables: [t]\ntargets: [t850]\n"
    )
    total, test = per_year * (YEARS[1] - YEARS[0] + 1), per_year
    rows = [run_stage("synth", total, postcast("synth", "-c", str(synth_cfg), "--out", str(raw)), work / "synth.log")]
    ingest = ["ingest", str(raw), "--out", str(store), *SPLITS, "--workers", str(workers)]
    rows.append(run_stage("ingest", total, postcast(*ingest), work / "ingest.log"))
    for stage, preset in (("train", MLP), ("emos", EMOS)):
        if stage not in stages and not (stage == "train" and {"evaluate", "forecast"} & set(stages)):
            continue
        train = [
            *("train", "fit", "-c", str(preset), "--data.cfg.store", str(store)),
            *("--data.cfg.sample.variables", "[t]", "--trainer.max_epochs", "1"),
            *("--data.cfg.cache_bytes", str(CACHE_BYTES), "--trainer.enable_progress_bar", "false"),
            *("--trainer.default_root_dir", str(work / stage)),
            *(BASELINE_MLP if preset == MLP else ()),
        ]
        rows.append(run_stage(stage, total, postcast(*train), work / f"{stage}.log"))
    if not {"evaluate", "forecast"} & set(stages):
        return rows
    ckpt = str(_best_checkpoint(work / "train"))
    evaluate = ["evaluate", str(store), "--checkpoints", ckpt, "--out", str(work / "eval"), "--bootstrap", "200"]
    rows.append(run_stage("evaluate", test, postcast(*evaluate, "--workers", str(workers)), work / "evaluate.log"))
    forecast = [
        *("forecast", "--checkpoint", ckpt, "--input", str(raw / "forecast.zarr")),
        *("--init-time", f"{YEARS[1]}-01-01", "--end", f"{YEARS[1]}-12-31", "--out", str(work / "forecasts")),
        *("--workers", str(workers)),
    ]
    rows.append(run_stage("forecast", test, postcast(*forecast), work / "forecast.log"))
    return rows


def _project(a: Stage, b: Stage, key: str) -> float:
    """``key`` fitted as c + slope x dates through the two sizes, at ENS-10's count for the stage (never
    below the larger measured value)."""
    va, vb = getattr(a, key), getattr(b, key)
    slope = (vb - va) / (b.dates - a.dates)
    return max(vb, vb + slope * (ENS10_DATES[a.stage] - b.dates))


def summarise(small: list[Stage], large: list[Stage]) -> dict[str, float]:
    pairs = {a.stage: (a, b) for a, b in zip(small, large, strict=True)}
    growth = {f"{s}_rss_growth": round(b.busy_bound_GB / a.busy_bound_GB, 3) for s, (a, b) in pairs.items()}
    growth |= {f"{s}_tree_sum_growth": round(b.tree_peak_GB / a.tree_peak_GB, 3) for s, (a, b) in pairs.items()}
    for role in ("driver", "worker"):  # per process: the postcast process, its largest descendant
        key = f"{role}_peak_GB"
        growth |= {
            f"{s}_{role}_rss_growth": round(getattr(b, key) / getattr(a, key), 3)
            for s, (a, b) in pairs.items()
            if getattr(a, key) > 0
        }
    tree = {s: _project(a, b, "busy_bound_GB") for s, (a, b) in pairs.items()}
    proc = {s: _project(a, b, "process_peak_GB") for s, (a, b) in pairs.items()}
    hours = {}
    if "evaluate" in pairs:
        ea, eb = pairs["evaluate"]
        per_test_date = max((eb.cpu_s - ea.cpu_s) / (eb.dates - ea.dates), 0.0)
        hours["ens10_evaluate_core_hours"] = round((eb.cpu_s + per_test_date * (210 - eb.dates)) / 3600, 2)
    return {
        **{k: v for k, v in growth.items() if not k.startswith("synth")},
        "ens10_peak_rss_GB": round(max(tree[s] for s in tree if s != "synth"), 2),
        "ens10_peak_process_rss_GB": round(max(proc[s] for s in proc if s != "synth"), 2),
        **hours,
        **{f"ens10_{s}_tree_GB": round(v, 2) for s, v in tree.items()},
        **{f"ens10_{s}_process_GB": round(v, 2) for s, v in proc.items()},
    }


def _table(rows: list[Stage]) -> None:
    head = f"{'stage':<9} {'dates':>5} {'wall_s':>7} {'cpu_s':>7} {'tree_GB':>8} {'process_GB':>10} {'procs':>5}"
    print(f"{head} {'driver_GB':>9} {'worker_GB':>9} {'busy_GB':>8}")
    for r in rows:
        print(
            f"{r.stage:<9} {r.dates:>5} {r.wall_s:>7.1f} {r.cpu_s:>7.1f} {r.tree_peak_GB:>8.2f} "
            f"{r.process_peak_GB:>10.2f} {r.processes:>5} {r.driver_peak_GB:>9.2f} {r.worker_peak_GB:>9.2f} "
            f"{r.busy_bound_GB:>8.2f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dates", type=int, default=16, help="N, a multiple of 4: the runs use N and 4N init dates")
    ap.add_argument("--workers", type=int, default=2, help="dask worker processes of ingest, evaluate, forecast")
    ap.add_argument("--work", help="working folder (default: a temporary one, removed at the end)")
    ap.add_argument("--out", default="benchmarks/results/scale.json", help="JSON results path")
    stages_help = f"comma-separated, among {','.join(STAGES)} (synth and ingest always run)"
    ap.add_argument("--stages", default=",".join(STAGES), help=stages_help)
    args = ap.parse_args()
    stages = tuple(args.stages.split(","))
    if set(stages) - set(STAGES):
        ap.error(f"--stages {args.stages}: choose among {','.join(STAGES)}")
    if args.dates < 4 or args.dates % 4:
        ap.error(f"--dates {args.dates}: give a multiple of 4 (one date a year per 4, over {YEARS[0]}-{YEARS[1]})")
    with contextlib.ExitStack() as stack:
        work = Path(args.work) if args.work else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        sizes = []
        for per_year in (args.dates // 4, args.dates):
            (work / f"n{per_year}").mkdir(parents=True, exist_ok=True)
            sizes.append(one_size(work / f"n{per_year}", per_year, args.workers, stages))
            _table(sizes[-1])
    small, large = sizes
    result = summarise(small, large)
    print("\nprojected to ENS-10 (2,100 dates, 210 test dates), this stage set (one field, T850):")
    for key, value in result.items():
        print(f"  {key} = {value}")
    machine = {"cpus": psutil.cpu_count(), "ram_GB": round(psutil.virtual_memory().total / GB, 1)}
    payload = {
        "machine": {**machine, "python": platform.python_version()},
        "dates": args.dates,
        "workers": args.workers,
        "stages": ["synth", "ingest", *stages],
        "rows": [asdict(r) for r in small + large],
        "result": result,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=1))
    growth = ("ingest", "train", "evaluate", "forecast", "emos")  # the four, then the EMOS fit
    keys = [f"{s}_rss_growth" for s in growth] + ["ens10_peak_rss_GB", "ens10_evaluate_core_hours"]
    keys = [k for k in keys if k in result]  # a run of some stages reports theirs
    print("RESULT " + " ".join(f"{k}={result[k]}" for k in keys))


if __name__ == "__main__":
    main()
