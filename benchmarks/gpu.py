"""The GPU figures in one prepared run (issue 41, second pass issue 59): the fused kernels at the sizes they
serve, the training step's throughput and model-FLOP utilisation, and the neural field against SZ3 at
compression ratios 200-2,000, in under 8 minutes on one NVIDIA H100/H200, every figure as JSON.

    python benchmarks/gpu.py --out $OUT        # on the GPU machine (its Python: torch + CUDA, triton, xarray)
    python benchmarks/gpu.py --dry-run         # anywhere: tiny sizes on the CPU, a few minutes
    python benchmarks/gpu.py --prepare-sz3     # CPU machine with pysz: rewrites benchmarks/gpu_sz3_reference.json

Nothing is installed on the GPU machine: each part makes ``postcast.*`` importable from this checkout
(a temporary folder of links laid out as installed, first on ``sys.path``) and marks zarr, dask,
netCDF4, eccodes, cfgrib, numcodecs and pysz absent, so a module that needs them fails here as it
would there (the dry run proves the parts import none). Each part runs in its own process with its
own time budget inside one global deadline; a part that fails, crashes or runs out of time is recorded
(error and traceback text) and the next one runs; inside a part, one kernel, size or config that fails
is recorded and the next runs. Files in ``--out`` (default ``$OUT``, else ``runs/gpu``): ``gpu.json``
(everything), ``<part>.json`` (written as each part goes) and ``<part>.stderr.txt``.

Parts and figures:

* **kernels**: every kernel of ``models/kernels`` (docs/kernels.md) at the shapes its callers pass for
  1, 4, 16 and 32 samples of the 0.5 deg field (training batches of B x 10 members x 361 x 720; an
  evaluate task's points x members), for eager PyTorch (``torch``), ``torch.compile`` (``compile``) and
  Triton (``triton``), median of CUDA-event timings after warm-up; bandwidth = compulsory bytes (inputs
  read once, outputs written once, forward and backward together where the kernel trains) / time, as a
  fraction of the measured large device-to-device copy bandwidth, and beside it of a copy of the same
  bytes measured at that size; max abs difference from eager, forward and backward.
  ``min_bandwidth_fraction_streaming``: the smallest Triton fraction over the streaming kernels
  (standardise, Gaussian CRPS, ensemble CRPS) at the largest batch; ``min_speedup_vs_eager``: the smallest
  eager time / Triton time there over the kernels ``auto`` runs in Triton; ``auto``: per kernel, the
  batches where Triton beats both eager and compile, against the dispatch's choice. On the GPU each path
  is also timed by the device alone (its kernels' durations, torch.profiler): a call's CUDA-event time
  also holds the gaps where the device waits for the host, which set a small call's time (the Gaussian
  CRPS took 0.4-0.7 ms at every batch from 1 to 32 in the first H200 run);
  ``min_kernel_bandwidth_fraction_streaming`` is ``min_bandwidth_fraction_streaming`` on that time.
* **training**: the U-Net and U-Net + SMoE T850 presets (configs/train/) at 361 x 720 on random batches of
  the sample layout (datasets/sample.py), the PostProcessor's training step (normalise, network, Gaussian
  CRPS, SMoE routing loss) and AdamW with the fused kernels (``auto``), fp32 and bf16-mixed (autocast),
  eager and ``torch.compile``d (the SMoE routing is a custom operator the compiler keeps in its graph):
  samples/s over timed optimizer steps after warm-up at the preset's batch, peak memory, and the
  model-FLOP utilisation (FLOPs of one step by ``FlopCounterMode`` x steps/s over the device's dense peak
  for the precision: 989 TFLOP/s bf16, 67 fp32); the compiled bf16 U-Net also at doubled batches while
  they fit and gain (the best batch). ``unet_samples_per_s_bf16``: the better of eager and compiled at the
  preset's batch; ``unet_mfu_bf16``: the best MFU of the bf16 U-Net; ``smoe_compiled_samples_per_s_bf16``.
* **compression**: neural fields (compression/field.py, 6 residual blocks, the width sized for a target
  ratio of 200, 500 and 2,000 at q6 per row + lzma) each fitted for a fixed time to a synthetic T850-like
  field with a realistic spectrum (k^-3 to k^-5/3 out to the grid's resolution: :func:`synthetic_field`),
  64 daily 0.5 deg fields; ratio (raw float32 bytes / artefact bytes) and cos-latitude weighted RMSE after
  the cast, and SZ3's ratio at that same weighted RMSE, interpolated (log-log) from the table that
  ``--prepare-sz3`` computed with pysz on the CPU machine on the identical field.
  ``neural_over_sz3_at_ratio_500``: the network sized for 500, its ratio over SZ3's at its error.

Last line: ``RESULT device=<cuda|cpu> min_bandwidth_fraction_streaming=<x> min_speedup_vs_eager=<x>
unet_samples_per_s_bf16=<x> unet_mfu_bf16=<x> smoe_compiled_samples_per_s_bf16=<x>
neural_over_sz3_at_ratio_500=<x> min_kernel_bandwidth_fraction_streaming=<x>`` (nan for a figure whose
part failed). The script exits 0 once it has
written gpu.json. ``--fail-part NAME`` makes that part raise at its start (the test that a failing part is
recorded and the rest still runs); ``--parts`` runs a subset.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import copy
import dataclasses
import functools
import gc
import json
import lzma
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import typing
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("datasets", "models", "compression", "pipeline", "serve")  # postcast.<layer> folders (setup.py)
ABSENT = ("zarr", "zarrs", "dask", "distributed", "netCDF4", "eccodes", "gribapi", "cfgrib", "numcodecs", "pysz")
PARTS = ("kernels", "training", "compression")
REFERENCE = ROOT / "benchmarks" / "gpu_sz3_reference.json"
PRESETS = {"unet": ROOT / "configs/train/unet_t850.yaml", "unet_smoe": ROOT / "configs/train/unet_smoe_t850.yaml"}
N_FEATURES = 5  # location sin(lat), cos(lat) sin(lon), cos(lat) cos(lon) and season sin/cos (datasets/sample.py)
T850_VARIABLE = "t"  # T850 is t at 850 hPa: its ensemble mean/std are the fields channels 2i, 2i + 1
F32 = 4  # bytes
H100_PEAK_TFLOPS = {"bf16-mixed": 989.0, "32-true": 67.0}  # dense, SXM; the H200 has the same compute
LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]  # compression/artefact.py's
ARTEFACT_PREFIX = 4 + 2 + 4 + 4 + 1  # magic, version, header length, crc32, codec byte (artefact format 3)
SZ3_BOUNDS = tuple(float(x) for x in np.logspace(-3, 0.5, 15))  # absolute bounds, fractions of the field's std
RESULT_KEYS = (
    ("kernels", "min_bandwidth_fraction_streaming"),
    ("kernels", "min_speedup_vs_eager"),
    ("training", "unet_samples_per_s_bf16"),
    ("training", "unet_mfu_bf16"),
    ("training", "smoe_compiled_samples_per_s_bf16"),
    ("compression", "neural_over_sz3_at_ratio_500"),
    ("kernels", "min_kernel_bandwidth_fraction_streaming"),
)


@dataclass(frozen=True)
class FieldSpec:
    """The synthetic T850-like field (K) with a realistic power spectrum, generated from the seed with numpy
    alone (:func:`synthetic_field`)."""

    key: str  # its entry in the SZ3 reference
    n_times: int  # daily dates
    n_lat: int  # -90..90 inclusive
    n_lon: int  # 0..360 exclusive
    anomaly_std: float = 4.0  # K, the daily anomaly's spread about the zonal climatology
    k_large: float = 4.0  # wavenumber below which the spectrum flattens (planetary scales)
    k_meso: float = 80.0  # the k^-3 -> k^-5/3 transition (wavelength ~500 km, Nastrom and Gage 1985)
    seed: int = 59


@dataclass(frozen=True)
class Sizes:
    """Everything that differs between the GPU run and the dry run."""

    grid: tuple[int, int]  # (H, W)
    budgets: dict[str, float]  # seconds kept for each part (a part may also use what earlier ones left)
    deadline_s: float  # the whole run
    grace_s: float  # a part stops starting work this long before it is killed
    copy_floats: int  # the copy-bandwidth buffer
    kernel_points: int  # points of one field in the kernel cases (the GPU: the 0.5 deg grid's)
    kernel_batches: tuple[int, ...]  # samples per call (training batches; evaluate: fields per task)
    kernel_reps: int
    kernel_warmup: int  # calls after the first (which compiles) before timing
    kernel_seconds: float  # timing budget per kernel and path
    batch: int | None  # training batch (None: the preset's)
    warmup_steps: int
    timed_steps: int
    timed_seconds: float
    batch_cap: int  # the batch sweep stops doubling here
    sweep_seconds: float  # the batch sweep starts no new batch after this
    simulated_max_batch: int | None  # dry run: batches above this "do not fit" (exercises the sweep's end)
    peak_tflops: dict[str, float] | None  # per precision; None: the device's (H100/H200 table)
    compile_backend: str  # torch.compile's backend (the dry run: AOT autograd without inductor's C++ codegen)
    compile_reserve_s: float  # a compiled training config starts only with this much of the part left
    threads: int | None  # torch CPU threads (the dry run: 1; two spinning threads on a loaded 2-core box crawl)
    net_override: dict[str, Any]  # preset network options replaced (the dry run: narrower U-Nets)
    field: FieldSpec
    target_ratios: tuple[float, ...]  # the neural field's sizes: raw bytes / target ratio (q6 + lzma)
    depth: int  # residual blocks (the width follows from the target size)
    bytes_per_parameter: float  # q6 per row + lzma, measured: 0.74 at width 512 (the first GPU run)
    batch_points: int
    lr: float
    fit_seconds: float  # each network's fit


GPU = Sizes(
    grid=(361, 720),
    budgets={"kernels": 120, "training": 200, "compression": 140},
    deadline_s=470,
    grace_s=8,
    copy_floats=64 * 2**20,
    kernel_points=361 * 720,
    kernel_batches=(1, 4, 16, 32),
    kernel_reps=20,
    kernel_warmup=2,
    kernel_seconds=2.0,
    batch=None,
    warmup_steps=3,
    timed_steps=20,
    timed_seconds=5.0,
    batch_cap=256,
    sweep_seconds=45,
    simulated_max_batch=None,
    peak_tflops=None,
    compile_backend="inductor",
    compile_reserve_s=60,
    threads=None,
    net_override={},
    field=FieldSpec("gpu", 64, 361, 720),
    target_ratios=(200.0, 500.0, 2000.0),
    depth=6,
    bytes_per_parameter=0.74,
    batch_points=32768,
    lr=1e-3,
    fit_seconds=36,
)
DRY = Sizes(
    grid=(16, 32),
    budgets={"kernels": 150, "training": 150, "compression": 100},
    deadline_s=400,
    grace_s=3,
    copy_floats=2**20,
    kernel_points=64,
    kernel_batches=(1, 2),
    kernel_reps=1,
    kernel_warmup=0,
    kernel_seconds=0.5,
    batch=2,
    warmup_steps=1,
    timed_steps=2,
    timed_seconds=5.0,
    batch_cap=8,
    sweep_seconds=60,
    simulated_max_batch=5,
    peak_tflops={"bf16-mixed": 0.05, "32-true": 0.05},  # nominal: exercises the MFU arithmetic on the CPU
    compile_backend="aot_eager",
    compile_reserve_s=10,
    threads=1,
    net_override={"base_filters": 8},
    field=FieldSpec("dry", 8, 91, 180, k_meso=20.0),
    target_ratios=(200.0, 500.0, 2000.0),
    depth=1,
    bytes_per_parameter=0.74,
    batch_points=1024,
    lr=5e-3,
    fit_seconds=1.5,
)


# --- the run: one process per part ----------------------------------------------------------------------
def orchestrate(args: argparse.Namespace) -> int:
    sizes = DRY if args.dry_run else GPU
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    summary: dict[str, Any] = {
        "script": "benchmarks/gpu.py",
        "mode": "dry-run" if args.dry_run else "gpu",
        "argv": sys.argv[1:],
        "deadline_s": sizes.deadline_s,
        "parts": {},
    }
    for part in args.parts:
        summary["parts"][part] = run_child(args, part, sizes, start + sizes.deadline_s)
        summary["seconds"] = time.time() - start
        write_json(out / "gpu.json", summary)
    summary["device"] = next(
        (p["device"] for p in summary["parts"].values() if p.get("device")), "cpu" if args.dry_run else "cuda"
    )
    summary["result"] = {key: figure(summary, part, key) for part, key in RESULT_KEYS}
    summary["seconds"] = time.time() - start
    write_json(out / "gpu.json", summary)
    print_summary(summary)
    print("RESULT device=" + summary["device"] + "".join(f" {k}={fmt(v)}" for k, v in summary["result"].items()))
    return 0


def run_child(args: argparse.Namespace, part: str, sizes: Sizes, end: float) -> dict[str, Any]:
    """Run one part in its own process within its budget (the time to the deadline less what the later
    parts keep); its JSON, or what went wrong."""
    out = Path(args.out)
    later = args.parts[args.parts.index(part) + 1 :]
    budget = end - time.time() - sum(sizes.budgets[p] for p in later)  # what the later parts keep is theirs
    if budget < 2 * sizes.grace_s:
        return {"status": "skipped", "error": f"the run's deadline ({sizes.deadline_s} s) left {budget:.0f} s"}
    path, log = out / f"{part}.json", out / f"{part}.stderr.txt"
    path.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--part",
        part,
        "--out",
        str(out),
        "--deadline",
        f"{time.time() + budget - sizes.grace_s:.3f}",
        *(["--dry-run"] if args.dry_run else []),
        *(["--fail-part", args.fail_part] if args.fail_part else []),
    ]
    env = {**os.environ, **({"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"} if args.dry_run else {})}
    t0 = time.time()
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stderr=err, env=env, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the part and its compile workers (its own session)
            proc.wait()
            rc = None
    result: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    result.update(budget_s=round(budget, 1), wall_s=round(time.time() - t0, 1), exit_code=rc)
    if rc != 0:
        tail = log.read_text(errors="replace")[-4000:]
        result["status"] = "error"
        result.setdefault("error", f"killed at its {budget:.0f} s budget" if rc is None else f"exit code {rc}")
        result.setdefault("traceback", tail)
        result["stderr_tail"] = tail
    return result


def figure(summary: dict[str, Any], part: str, key: str) -> float | None:
    value = summary["parts"].get(part, {}).get("figures", {}).get(key)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def fmt(value: float | None) -> str:
    return "nan" if value is None else f"{value:.4g}"


def print_summary(summary: dict[str, Any]) -> None:
    print(f"\n{'part':12} {'status':8} {'seconds':>8}  error")
    for part, res in summary["parts"].items():
        err = str(res.get("error") or "").splitlines()[:1]
        print(f"{part:12} {res.get('status', '?'):8} {res.get('wall_s', 0):>8.1f}  {err[0] if err else ''}")
    print(f"total {summary['seconds']:.1f} s; figures in gpu.json")


def write_json(path: Path, obj: Any) -> None:
    """Atomically, with non-finite floats as null (plain JSON)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(_plain(obj), indent=1, default=str) + "\n")
    tmp.replace(path)


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, float | np.floating):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


# --- inside a part ----------------------------------------------------------------------------------------
def bootstrap(block: bool = True) -> Path:
    """Make ``postcast.*`` importable from this checkout without installing it: a temporary folder with
    ``postcast/`` laid out as installed (cli/'s files, then one link per layer folder; setup.py's mapping),
    first on ``sys.path``. ``block`` marks the modules the GPU machine lacks as absent (``import zarr``
    then fails as it would there)."""
    tmp = Path(tempfile.mkdtemp(prefix="postcast-gpu-"))
    atexit.register(shutil.rmtree, tmp, True)  # removes the links, never what they point to
    pkg = tmp / "postcast"
    pkg.mkdir()
    for entry in (ROOT / "cli").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for layer in LAYERS:
        (pkg / layer).symlink_to(ROOT / layer, target_is_directory=True)
    sys.path.insert(0, str(tmp))
    if block:
        for name in ABSENT:
            sys.modules.setdefault(name, None)  # type: ignore[assignment]
    return pkg


class Part:
    """One part's process: its device, deadline, figures and errors, saved to ``<out>/<part>.json``."""

    def __init__(self, name: str, out: Path, sizes: Sizes, deadline: float):
        self.name, self.path, self.sizes, self.deadline = name, out / f"{name}.json", sizes, deadline
        self.t0 = time.time()
        self.res: dict[str, Any] = {"part": name, "status": "running", "figures": {}, "errors": []}
        self.dev: Any = None

    def left(self) -> float:
        return self.deadline - time.time()

    def setup(self, dry: bool) -> None:
        import torch

        if not dry and not torch.cuda.is_available():
            raise RuntimeError("no CUDA device: this run needs a GPU (use --dry-run for the CPU check)")
        self.dev = torch.device("cuda" if torch.cuda.is_available() and not dry else "cpu")
        import postcast.models

        self.res.update(device=self.dev.type, env=environment(self.dev), postcast_from=postcast.models.__path__[0])
        self.save()

    def sync(self) -> None:
        import torch

        if self.dev.type == "cuda":
            torch.cuda.synchronize()

    def error(self, where: str, err: BaseException) -> None:
        """An error inside the part (one kernel, one config): recorded, the part goes on."""
        self.res["errors"].append(
            {"where": where, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        )
        print(f"[{self.name}] {where}: {type(err).__name__}: {str(err)[:300]}", flush=True)
        self.save()

    def skip(self, where: str) -> dict[str, Any]:
        return {"skipped": f"{self.left():.0f} s of the part's budget left: {where} not started"}

    def save(self, **items: Any) -> None:
        self.res.update(items, seconds=round(time.time() - self.t0, 2))
        write_json(self.path, self.res)

    def finish(self) -> None:
        self.save(status="ok" if not self.res["errors"] else "partial", imported=third_party())

    def fail(self, err: BaseException) -> None:
        self.save(
            status="error",
            error=f"{type(err).__name__}: {err}",
            traceback=traceback.format_exc(),
            imported=third_party(),
        )


def third_party() -> list[str]:
    """Top-level packages this process imported beyond the standard library (what the GPU machine needs)."""
    names = {m.split(".")[0] for m, mod in list(sys.modules.items()) if mod is not None}
    return sorted(n for n in names if n not in sys.stdlib_module_names and not n.startswith("_"))


def environment(dev: Any) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"),
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
    }
    with contextlib.suppress(ImportError):
        import triton

        env["triton"] = triton.__version__
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        env.update(
            device_name=props.name,
            memory_gb=props.total_memory / 1e9,
            cuda=torch.version.cuda,
            capability=f"{props.major}.{props.minor}",
        )
    return env


def run_part(args: argparse.Namespace) -> int:
    sizes = DRY if args.dry_run else GPU
    part = Part(args.part, Path(args.out), sizes, args.deadline)
    try:
        if args.dry_run:
            os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
        bootstrap()
        if sizes.threads:
            import torch

            torch.set_num_threads(sizes.threads)
        part.setup(args.dry_run)
        if args.fail_part == args.part:
            raise RuntimeError(f"deliberate failure of the {args.part} part (--fail-part)")
        {"kernels": part_kernels, "training": part_training, "compression": part_compression}[args.part](part)
        part.finish()
        return 0
    except Exception as err:
        part.fail(err)
        traceback.print_exc()
        return 1


def timed(part: Part, fn: Callable[[], Any], reps: int, seconds: float, warmup: int = 2) -> float:
    """Median seconds of ``fn`` (CUDA events on a GPU, wall clock on the CPU) over up to ``reps`` calls
    within ``seconds``, after ``warmup`` calls (compilation, caches, autotuning)."""
    import torch

    for _ in range(warmup):
        fn()
    part.sync()
    times: list[float] = []
    end = time.perf_counter() + seconds
    while len(times) < reps and (not times or time.perf_counter() < end):
        if part.dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


# --- part 1: kernels -------------------------------------------------------------------------------------
Outputs = tuple[list[Any], list[Any]]  # a kernel's outputs and its inputs' gradients (tensors)


@dataclass(frozen=True)
class Case:
    """One kernel: ``run(path)`` (timed), its compulsory bytes, what is timed, and for a kernel whose
    timed run has no backward but which has one, ``backward(path)`` -> gradients (checked, not timed)."""

    run: Callable[[str], Outputs]
    nbytes: float
    timed: str
    shape: list[int]  # of the main input
    backward: Callable[[str], list[Any]] | None = None


STREAMING = ("ensemble_standardise", "crps_gaussian", "crps_ensemble")  # memory-bound: the 70 % goal


def part_kernels(part: Part) -> None:
    """Every kernel at each batch size on the three paths, each size's copy bandwidth beside it; then the
    figures at the largest batch and the data of ``auto``'s choice."""
    use_compile_backend(part.sizes.compile_backend)
    bw = copy_bandwidth(part, part.sizes.copy_floats)
    part.save(copy_bandwidth_GBps=bw / 1e9)
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for paths in (("torch", "triton"), ("compile",)):  # the figures first; torch.compile's compilations last
        for batch in part.sizes.kernel_batches:
            if part.left() < 5:
                break
            try:
                cases = kernel_cases(part, batch)
            except Exception as err:  # out of memory at this batch: recorded, the next one runs
                part.error(f"kernel inputs at batch {batch}", err)
                continue
            for name, case in cases.items():
                if (name, batch) not in rows:
                    rows[name, batch] = kernel_row(part, name, batch, case)
                row = rows[name, batch]
                if part.left() < 5:
                    row.update({f"{p}_skipped": part.skip(f"{name} / {p}")["skipped"] for p in paths})
                else:
                    kernel_paths(part, row, case, paths, bw)
                part.save(rows=list(rows.values()), figures=kernel_figures(list(rows.values()), bw))
            del cases
            release(part)
    print_kernels(part, list(rows.values()), bw)


def kernel_row(part: Part, name: str, batch: int, case: Case) -> dict[str, Any]:
    """A kernel's row at one batch: its shape, bytes and the copy bandwidth of a copy that moves as many
    bytes (read + write), measured now."""
    same = copy_bandwidth(part, max(1, int(case.nbytes / (2 * F32))))
    return {
        "kernel": name,
        "batch": batch,
        "shape": case.shape,
        "bytes": case.nbytes,
        "timed": case.timed,
        "copy_same_bytes_GBps": same / 1e9,
    }


def kernel_figures(rows: list[dict[str, Any]], bw: float) -> dict[str, Any]:
    """The part's figures over the rows timed so far (a part killed at its budget keeps them): at each
    kernel's largest timed batch, the smallest Triton fraction of copy bandwidth over the streaming kernels
    and the smallest speed-up over eager of the kernels ``auto`` runs in Triton; ``auto``'s choice per
    kernel against the timings at every size."""
    from postcast.models import kernels

    done = [r for r in rows if isinstance(r.get("triton_ms"), float) and isinstance(r.get("torch_ms"), float)]
    largest = {}
    for r in done:
        if r["batch"] >= largest.get(r["kernel"], {}).get("batch", 0):
            largest[r["kernel"]] = r
    auto = {name: auto_decision(name, [r for r in done if r["kernel"] == name]) for name in largest}
    kernel_fractions = [r.get("triton_kernel_bw_fraction") for k, r in largest.items() if k in STREAMING] or [None]
    return {
        "min_bandwidth_fraction_streaming": min(
            (r["triton_bw_fraction"] for k, r in largest.items() if k in STREAMING), default=None
        ),
        "min_kernel_bandwidth_fraction_streaming": min(kernel_fractions) if None not in kernel_fractions else None,
        "min_speedup_vs_eager": min(
            (r["triton_speedup"] for k, r in largest.items() if k not in kernels.EAGER_UNDER_AUTO), default=None
        ),
        "at_largest_batch": {
            k: {
                key: r.get(key)
                for key in (
                    "batch",
                    "triton_bw_fraction",
                    "triton_kernel_bw_fraction",
                    "triton_speedup",
                    "triton_vs_compile",
                )
            }
            for k, r in largest.items()
        },
        "auto": auto,
        "auto_disagrees_with_timings": sorted(k for k, v in auto.items() if not v["agrees"]),
        "copy_bandwidth_GBps": bw / 1e9,
        "rows_timed": len(done),
    }


def auto_decision(name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether Triton beats both eager and torch.compile (where timed) at some size, and whether ``auto``
    (kernels.EAGER_UNDER_AUTO) runs it in Triton: a kernel slower at every size belongs to eager."""
    from postcast.models import kernels

    def wins(r: dict[str, Any]) -> bool:
        rivals = [r[k] for k in ("torch_ms", "compile_ms") if isinstance(r.get(k), float)]
        return r["triton_ms"] < min(rivals)

    faster = [r["batch"] for r in rows if wins(r)]
    uses = name not in kernels.EAGER_UNDER_AUTO
    return {"triton_fastest_at_batches": faster, "auto_uses_triton": uses, "agrees": uses == bool(faster)}


def use_compile_backend(backend: str) -> None:
    """The kernels' ``compile`` path through ``torch.compile(backend=...)``: inductor (untouched) on the GPU;
    in the dry run ``aot_eager`` (dynamo's tracing and AOT autograd without inductor's C++ codegen, which
    costs 15-25 s a kernel on a loaded 2-core CPU). The dispatch looks ``_compiled`` up at each call,
    so this swaps its backend."""
    if backend == "inductor":
        return
    import torch

    from postcast.models import kernels
    from postcast.models.kernels import reference

    @functools.cache
    def compiled(name: str) -> Callable[..., Any]:
        return torch.compile(getattr(reference, name), dynamic=True, backend=backend)  # type: ignore[no-any-return]

    kernels._compiled = compiled  # type: ignore[assignment]


def copy_bandwidth(part: Part, floats: int) -> float:
    """Measured device copy bandwidth, bytes/s: read + write of a buffer of ``floats`` float32."""
    import torch

    x = torch.empty(floats, dtype=torch.float32, device=part.dev).uniform_()
    y = torch.empty_like(x)
    t = timed(part, lambda: y.copy_(x), 20, 1.0)
    return 2 * x.numel() * F32 / t


def kernel_cases(part: Part, batch: int) -> dict[str, Case]:
    """kernel -> Case at the shapes its callers pass for ``batch`` samples of the 0.5 deg field (P points):
    standardise members (B, M, P); the Gaussian CRPS of a training batch (B, P), forward and backward of the
    mean; the fair ensemble CRPS of an evaluate task's points x members (B P, M); the SMoE routing of the
    preset (2 head outputs x E experts, k 1, unweighted, gate gradient blocked by the RC loss) forward and
    backward; the Fourier layer (decode of one field) at the smallest batch only."""
    import torch

    from postcast.models import kernels

    dev, pts, m, e = part.dev, part.sizes.kernel_points, 10, 3
    g = torch.Generator(device=dev).manual_seed(batch)

    def rnd(*shape: int, grad: bool = False) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=dev).requires_grad_(grad)

    def fresh(*ts: torch.Tensor) -> None:
        for t in ts:
            t.grad = None

    members = rnd(batch, m, pts)

    def standardise(path: str) -> Outputs:
        with kernels.use_backend(path):
            return list(kernels.ensemble_standardise(members)), []

    mu, y = rnd(batch, pts, grad=True), rnd(batch, pts)
    sigma = (torch.rand(batch, pts, generator=g, device=dev) + 0.5).requires_grad_()

    def crps_gauss(path: str) -> Outputs:
        fresh(mu, sigma)
        with kernels.use_backend(path):
            out = kernels.crps_gaussian(mu, sigma, y)
            out.mean().backward()
        return [out.detach()], [mu.grad, sigma.grad]

    ens, obs = rnd(batch * pts, m), rnd(batch * pts)

    def crps_ens(path: str) -> Outputs:
        with kernels.use_backend(path):
            return [kernels.crps_ensemble(ens, obs, True)], []

    values, weights = rnd(2 * batch, e, pts, grad=True), rnd(2 * batch, e, pts, grad=True)

    def topk(path: str) -> Outputs:
        fresh(values, weights)
        with kernels.use_backend(path):
            out = kernels.topk_route(values, weights, 1, weighted=False, block_gate=True)
            out.sum().backward()
        return [out.detach()], [values.grad, weights.grad]

    n = batch * pts
    cases = {
        "ensemble_standardise": Case(standardise, F32 * n * (2 * m + 2), "fwd", [batch, m, pts]),
        "crps_gaussian": Case(crps_gauss, F32 * n * 6, "fwd+bwd", [batch, pts]),  # read 3; write crps, 2 grads
        "crps_ensemble": Case(crps_ens, F32 * n * (m + 2), "fwd", [n, m]),
        "topk_route": Case(topk, F32 * 2 * n * (3 * e + 2), "fwd+bwd", [2 * batch, e, pts]),  # 2E + k + k + E
    }
    if batch == part.sizes.kernel_batches[0]:
        cases["fourier_layer"] = fourier_case(part, rnd)
    return cases


def fourier_case(part: Part, rnd: Callable[..., Any]) -> Case:
    """The neural-field decoder's first layer on one field's points (forward timed, backward checked)."""
    import torch

    from postcast.models import kernels

    pts = part.sizes.kernel_points
    coords, bmat = (rnd(pts, 4) * 0.5 + 0.5).detach(), rnd(4, 64)  # (N, D), (D, F)
    weight, bias = (rnd(128, 128) / 8).requires_grad_(), rnd(128, grad=True)  # (H, 2F), (H,)

    def fourier(path: str) -> Outputs:
        with kernels.use_backend(path), torch.no_grad():  # decoding: forward only (timed)
            return [kernels.fourier_layer(coords, bmat, weight, bias)], []

    def fourier_bwd(path: str) -> list[Any]:  # checked, not timed: the backward is PyTorch's recompute
        weight.grad = bias.grad = None
        with kernels.use_backend(path):
            kernels.fourier_layer(coords, bmat, weight, bias).square().sum().backward()
        return [weight.grad, bias.grad]

    return Case(fourier, F32 * pts * (4 + 128), "fwd", [pts, 4], fourier_bwd)


def max_diff(got: list[Any], want: list[Any]) -> float | None:
    """Largest |got - want| over matching tensors (None when there is nothing to compare)."""
    pairs = [(a, b) for a, b in zip(got, want, strict=True) if a is not None and b is not None]
    return max((float((a.float() - b.float()).abs().max()) for a, b in pairs), default=None)


def kernel_paths(part: Part, row: dict[str, Any], case: Case, paths: tuple[str, ...], bw: float) -> None:
    """One kernel on some paths, into ``row``: first-call seconds (compile / JIT), median time, bandwidth
    and its fraction of the copy bandwidth, max abs differences from eager (forward, backward), speedup."""
    want_out, want_grad = case.run("torch")
    want_grad = case.backward("torch") if case.backward else want_grad
    for path in paths:
        try:
            t0 = time.perf_counter()
            out, grad = case.run(path)
            part.sync()
            row[f"{path}_first_call_s"] = time.perf_counter() - t0
            if path != "torch":
                row[f"{path}_max_abs_diff_fwd"] = max_diff(out, want_out)
                row[f"{path}_max_abs_diff_bwd"] = max_diff(case.backward(path) if case.backward else grad, want_grad)
            t = timed(
                part,
                lambda path=path: case.run(path),
                part.sizes.kernel_reps,
                part.sizes.kernel_seconds,
                part.sizes.kernel_warmup,
            )
            row.update(
                {
                    f"{path}_ms": 1e3 * t,
                    f"{path}_GBps": case.nbytes / t / 1e9,
                    f"{path}_bw_fraction": case.nbytes / t / bw,
                }
            )
            row[f"{path}_bw_fraction_same_bytes_copy"] = case.nbytes / t / (1e9 * row["copy_same_bytes_GBps"])
            kernel_time(part, row, path, case, bw)
            if path != "torch" and "torch_ms" in row:
                row[f"{path}_speedup"] = row["torch_ms"] / row[f"{path}_ms"]
            if "triton_ms" in row and "compile_ms" in row:
                row["triton_vs_compile"] = row["compile_ms"] / row["triton_ms"]
        except Exception as err:
            part.error(f"{row['kernel']} / {path}", err)


def kernel_time(part: Part, row: dict[str, Any], path: str, case: Case, bw: float) -> None:
    """The device's own time of one call, without the host's: the durations of the kernels it ran (CUPTI,
    through torch.profiler) summed over ``kernel_reps`` calls, per call, and its fraction of the copy
    bandwidth ``bw`` (``{path}_kernel_ms``, ``{path}_kernel_bw_fraction``). The call's time (CUDA events round
    it) also counts the gaps where the device waits for the host: Python, the autograd engine, launches.
    On the CPU, where the host is the device, the call's time. An error is recorded and the row keeps its
    other figures."""
    if part.dev.type != "cuda":
        t = row[f"{path}_ms"] / 1e3
        row.update({f"{path}_kernel_ms": 1e3 * t, f"{path}_kernel_bw_fraction": case.nbytes / t / bw})
        return
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(part.sizes.kernel_reps):
                case.run(path)
            part.sync()
        us = sum(e.device_time_total for e in prof.events() if e.device_type == DeviceType.CUDA)
        t = us / 1e6 / part.sizes.kernel_reps
        row.update({f"{path}_kernel_ms": 1e3 * t, f"{path}_kernel_bw_fraction": case.nbytes / t / bw if t else None})
        torch.cuda.synchronize()
    except Exception as err:
        part.error(f"{row['kernel']} / {path} kernel time", err)


def print_kernels(part: Part, rows: list[dict[str, Any]], bw: float) -> None:
    pts = part.sizes.kernel_points
    print(f"\nkernels on {part.dev.type}, large-copy bandwidth {bw / 1e9:.1f} GB/s, {pts} points a field")
    print(
        f"{'kernel':22} {'B':>3} {'timed':8} {'MB':>8} {'copy GB/s':>10}"
        + "".join(f" {p + ' ms':>11} {p + ' %bw':>11}" for p in ("torch", "compile", "triton"))
        + f" {'kernel %bw':>10} {'x eager':>8} {'x compile':>9} {'maxdiff':>9}"
    )
    for r in rows:
        line = f"{r['kernel']:22} {r['batch']:>3} {r['timed']:8} {r['bytes'] / 1e6:>8.1f}"
        line += f" {r['copy_same_bytes_GBps']:>10.1f}"
        for p in ("torch", "compile", "triton"):
            ms, frac = r.get(f"{p}_ms"), r.get(f"{p}_bw_fraction")
            line += f" {ms:>11.3f} {100 * frac:>10.1f}%" if ms is not None else f" {'-':>11} {'-':>11}"
        kernel = r.get("triton_kernel_bw_fraction")
        line += f" {100 * kernel:>9.1f}%" if kernel is not None else f" {'-':>10}"
        diffs = [d for d in (r.get("triton_max_abs_diff_fwd"), r.get("triton_max_abs_diff_bwd")) if d is not None]
        line += f" {fmt(r.get('triton_speedup')):>8} {fmt(r.get('triton_vs_compile')):>9}"
        line += f" {max(diffs):>9.1e}" if diffs else f" {'-':>9}"
        print(line, flush=True)


# --- part 2: training throughput ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Preset:
    """What the training benchmark reads from a configs/train preset."""

    family: str
    net: dict[str, Any]
    lr: float
    batch: int
    variables: tuple[str, ...]

    @property
    def in_channels(self) -> int:
        """Channels the network sees: ensemble mean and std of each input, then the features."""
        return 2 * len(self.variables) + N_FEATURES


def read_preset(path: Path, override: dict[str, Any] | None = None) -> Preset:
    import yaml

    cfg = yaml.safe_load(path.read_text())
    model, data = cfg["model"], cfg["data"]["cfg"]
    return Preset(
        model["family"],
        {**(model.get("net") or {}), **(override or {})},
        float(model.get("lr", 1e-3)),
        int(data.get("batch_size", 1)),
        tuple(data["sample"]["variables"]),
    )


def build_net(preset: Preset, grid: tuple[int, int]) -> Any:
    """The preset's network: its registered config dataclass (found by its registered name, so renames of
    the classes do not matter) from the preset's options, then ``build(NetIO)`` with a Gaussian head.
    registry.make would import every model module, models/module.py among them, which needs zarr."""
    from postcast.models.registry import NetIO

    io = NetIO(
        in_channels=preset.in_channels,
        grid=grid,
        n_members=10,
        n_variables=len(preset.variables),
        target_variable=preset.variables.index(T850_VARIABLE),
        outputs=2,
    )
    return from_options(registered(preset.family), preset.net).build(io)


def registered(name: str) -> type:
    """The config dataclass registered as ``name`` in the modules of the U-Nets (the decorator sets ``name``)."""
    from postcast.models import convnets, smoe

    for module in (convnets, smoe):
        for obj in vars(module).values():
            if isinstance(obj, type) and obj.__dict__.get("name") == name and hasattr(obj, "build"):
                return obj
    raise ValueError(f"training benchmark: no network registered as {name!r} in models/convnets.py, models/smoe.py")


def from_options(cls: type, options: dict[str, Any]) -> Any:
    """A config dataclass from plain options, nested dataclass fields (``smoe: {...}``) built from theirs."""
    hints = typing.get_type_hints(cls)
    return cls(
        **{
            k: from_options(hints[k], v) if isinstance(v, dict) and dataclasses.is_dataclass(hints.get(k)) else v
            for k, v in options.items()
        }
    )


def random_batch(preset: Preset, batch: int, grid: tuple[int, int], dev: Any, seed: int = 0) -> dict[str, Any]:
    """A batch of samples in physical units with the store loader's keys and shapes (datasets/sample.py):
    fields (B, 2V, H, W), features (B, 5, H, W), m, s, y (B, H, W); plus the model's normalisation
    statistics norm_mean, norm_std (2V, H, W)."""
    import torch

    g = torch.Generator(device=dev).manual_seed(seed)
    h, w = grid
    v2 = 2 * len(preset.variables)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=dev)

    mean, std = 250 + 10 * rnd(v2, h, w), 1 + rnd(v2, h, w).abs()
    m = 273 + 10 * rnd(batch, h, w)  # K
    s = 0.5 + rnd(batch, h, w).abs()
    return {
        "fields": mean + std * rnd(batch, v2, h, w),
        "features": rnd(batch, N_FEATURES, h, w).clamp(-1, 1),
        "m": m,
        "s": s,
        "y": m + s * rnd(batch, h, w),
        "norm_mean": mean,
        "norm_std": std,
    }


def train_loss(net: Any, batch: dict[str, Any]) -> Any:
    """PostProcessor.training_step's loss (models/module.py) for a Gaussian model: normalise the fields,
    run the network and the head, the finiteness check (one sync per statistic), the mean CRPS where the
    truth is finite, plus the SMoE routing-classification loss (and expert shares) when the net has one."""
    import torch

    from postcast.models import losses

    x = torch.nan_to_num((batch["fields"] - batch["norm_mean"]) / batch["norm_std"])  # (B, 2V, H, W)
    view = {"x": torch.cat([x, batch["features"]], dim=1), "m": batch["m"], "s": batch["s"]}
    out = net(view)  # K x (B, H, W)
    dist = losses.distribution_head(out, view["m"], view["s"], "gaussian")  # postprocessors.predict's
    ok = torch.isfinite(batch["y"])  # (B, H, W)
    bad = {k: int((~torch.isfinite(batch[k][ok])).sum()) for k in ("m", "s")}
    if any(bad.values()):
        raise ValueError(f"non-finite raw ensemble statistics in the batch: {bad}")
    loss = dist.select(ok).crps(batch["y"][ok]).mean()
    layer = getattr(net, "smoe", None)
    if layer is not None and layer.cfg.rc_loss:
        rc = rc_loss(layer, loss, out)
        layer.expert_share()
        loss = loss + layer.cfg.rc_weight * rc
    return loss


def rc_loss(layer: Any, task_loss: Any, out: tuple[Any, ...]) -> Any:
    """models/smoe.py's ``SMoEHead.rc_loss`` with the task loss's gradient at the SMoE output taken through
    the network's outputs (views of that output, so the same gradient) instead of the output the layer
    keeps: under ``torch.compile`` (AOT autograd) the kept tensor is not the one the outputs derive from,
    and differentiating it fails ("appears to not have been used in the graph")."""
    import torch
    import torch.nn.functional as F

    from postcast.models.smoe import rc_labels, routing_correct

    weights, idx = layer.last["weights"], layer.last["idx"]  # (B K, E, H, W), (B K, k, H, W)
    grads = torch.autograd.grad(task_loss, out, retain_graph=True)  # K x (B, H, W)
    e = torch.stack(grads, 1).reshape(idx.shape)  # the SMoE output's layout (B K, k, H, W)
    labels = rc_labels(idx, routing_correct(e, layer.cfg.quantile), layer.cfg.experts)
    return F.binary_cross_entropy_with_logits(weights, labels)


def optimizer_step(model: Any, opt: Any, batch: dict[str, Any], precision: str) -> Any:
    """One step as Lightning runs it: training step (autocast for bf16-mixed), backward, step, zero_grad."""
    import torch

    dev = batch["m"].device.type
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        loss = train_loss(model, batch)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def release(part: Part) -> None:
    import torch

    gc.collect()
    if part.dev.type == "cuda":
        torch.cuda.empty_cache()


def step_flops(part: Part, preset: Preset) -> float:
    """FLOPs per sample of one training step (forward and backward of the loss; the optimizer's elementwise
    update is not counted), by ``torch.utils.flop_counter.FlopCounterMode`` on the eager network in fp32
    at the preset's batch (convolutions and matmuls; the count is the same in bf16)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    net = build_net(preset, part.sizes.grid).to(part.dev).train()
    b = part.sizes.batch or preset.batch
    batch = random_batch(preset, b, part.sizes.grid, part.dev)
    counter = FlopCounterMode(display=False)
    with counter:
        train_loss(net, batch).backward()
    return float(counter.get_total_flops()) / b


def peak_flops(part: Part, precision: str) -> float | None:
    """The device's dense peak FLOP/s for this precision (H100/H200 SXM: bf16 989 TFLOP/s, fp32 67), the
    dry run's nominal figure, or None for another device (no MFU then)."""
    import torch

    table = part.sizes.peak_tflops
    if table is None and part.dev.type == "cuda":
        name = torch.cuda.get_device_name(part.dev)
        table = H100_PEAK_TFLOPS if any(g in name for g in ("H100", "H200")) else None
    return 1e12 * table[precision] if table else None


def measure(part: Part, model: Any, opt: Any, preset: Preset, b: int, precision: str) -> dict[str, Any]:
    """samples/s over timed optimizer steps after warm-up at batch ``b``; peak memory (GPU)."""
    import torch

    sim = part.sizes.simulated_max_batch
    if sim is not None and b > sim:
        raise torch.cuda.OutOfMemoryError(f"simulated: the dry run's limit is batch {sim}")
    batch = random_batch(preset, b, part.sizes.grid, part.dev)
    if part.dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(part.sizes.warmup_steps):
        optimizer_step(model, opt, batch, precision)
    part.sync()
    warm = time.perf_counter() - t0
    steps, t0 = 0, time.perf_counter()
    while steps < part.sizes.timed_steps and (steps < 2 or time.perf_counter() - t0 < part.sizes.timed_seconds):
        loss = optimizer_step(model, opt, batch, precision)
        steps += 1
    part.sync()
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 1e9 if part.dev.type == "cuda" else None
    return {
        "batch": b,
        "warmup_steps": part.sizes.warmup_steps,
        "warmup_s": warm,
        "timed_steps": steps,
        "step_ms": 1e3 * dt / steps,
        "samples_per_s": b * steps / dt,
        "peak_memory_gb": peak,
        "final_loss": float(loss),
    }


def throughput(
    part: Part, preset: Preset, precision: str, compiled: bool, sweep: bool, flops: float | None
) -> dict[str, Any]:
    """One config at the preset's batch and, when ``sweep``, at doubled batches while they fit, gain and the
    sweep's time lasts: samples/s, peak memory and MFU (``flops`` per sample x samples/s over the peak)
    at each; the best batch (most samples/s)."""
    import torch

    torch.manual_seed(0)
    net = build_net(preset, part.sizes.grid).to(part.dev).train()
    model = torch.compile(net, backend=part.sizes.compile_backend) if compiled else net
    opt = torch.optim.AdamW(net.parameters(), lr=preset.lr)
    peak = peak_flops(part, precision)
    first = part.sizes.batch or preset.batch
    end = time.time() + (part.sizes.sweep_seconds if sweep else math.inf)
    runs: list[dict[str, Any]] = []
    b = first
    while b <= (part.sizes.batch_cap if sweep else first) and (b == first or time.time() < end):
        try:
            r = measure(part, model, opt, preset, b, precision)
        except torch.cuda.OutOfMemoryError as err:
            if b == first:
                raise
            runs.append({"batch": b, "fits": False, "why": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"})
            break
        finally:
            opt.zero_grad(set_to_none=True)
            release(part)
        r["mfu"] = flops * r["samples_per_s"] / peak if flops and peak else None
        runs.append(r)
        fitted = [x for x in runs if "samples_per_s" in x]
        if len(fitted) > 2 and r["samples_per_s"] < 0.97 * max(x["samples_per_s"] for x in fitted):
            break  # past the best
        b *= 2
    fitted = [x for x in runs if "samples_per_s" in x]
    best = max(fitted, key=lambda x: x["samples_per_s"])
    return {**fitted[0], "sweep": runs if sweep else None, "best": best, "peak_flops": peak, "flops_per_sample": flops}


def training_plan() -> list[tuple[str, str, bool, bool]]:
    """(family, precision, compiled, sweep) in priority order: the headline figures first (bf16 compiled, with
    the batch sweep for the MFU at the best batch), then eager, then fp32."""
    return [
        ("unet", "bf16-mixed", True, True),
        ("unet_smoe", "bf16-mixed", True, False),
        ("unet", "bf16-mixed", False, False),
        ("unet_smoe", "bf16-mixed", False, False),
        ("unet", "32-true", True, False),
        ("unet", "32-true", False, False),
        ("unet_smoe", "32-true", False, False),
        ("unet_smoe", "32-true", True, False),
        ("unet_smoe", "bf16-mixed", True, True),
    ]


def part_training(part: Part) -> None:
    from postcast.models import kernels

    presets = {name: read_preset(path, part.sizes.net_override) for name, path in PRESETS.items()}
    kernels.set_backend(fused_or_eager(part))
    part.save(presets={k: asdict(v) for k, v in presets.items()}, grid=part.sizes.grid, kernels=kernels.get_backend())
    flops: dict[str, float | None] = {}
    for family, preset in presets.items():
        try:
            flops[family] = step_flops(part, preset)
        except Exception as err:
            part.error(f"{family} FLOP count", err)
            flops[family] = None
        release(part)
    part.save(flops_per_sample=flops)
    runs: dict[str, Any] = {}
    for family, precision, compiled, sweep in training_plan():
        name = f"{family} {precision} {'compiled' if compiled else 'eager'}" + (" sweep" if sweep else "")
        runs[name] = training_item(
            part,
            name,
            compiled,
            lambda f=family, p=precision, c=compiled, w=sweep: throughput(part, presets[f], p, c, w, flops[f]),
        )
        part.save(runs=runs, figures=training_figures(part, presets, runs))
        print(f"[training] {name}: {summary_line(runs[name])}", flush=True)
    print_training(runs)


def fused_or_eager(part: Part) -> str:
    """``auto`` (the fused kernels) when the loss's and the routing's kernels run on a small input here, else
    ``torch`` with the error recorded: a kernel that fails must not cost the training figures."""
    import torch

    from postcast.models import kernels

    x = torch.rand(2, 3, 5, 7, device=part.dev, requires_grad=True)
    try:
        with kernels.use_backend("auto"):
            loss = kernels.crps_gaussian(x, x + 1, x.detach()).mean()
            loss = loss + kernels.topk_route(x, x * 2, 1, block_gate=True).sum()
            loss.backward()
        part.sync()
        return "auto"
    except Exception as err:
        part.error("the fused kernels' check (training falls back to eager PyTorch)", err)
        return "torch"


def training_figures(part: Part, presets: dict[str, Preset], runs: dict[str, Any]) -> dict[str, Any]:
    """The headline figures from the configs done so far (None where a config failed or did not run)."""

    def get(name: str, key: str) -> Any:
        r = runs.get(name) or {}
        return r.get(key) if key != "best" else (r.get("best") or {})

    unet = [get(f"unet bf16-mixed {c}", "samples_per_s") for c in ("compiled sweep", "eager")]
    smoe = get("unet_smoe bf16-mixed compiled", "samples_per_s")
    unet_c = get("unet bf16-mixed compiled sweep", "samples_per_s")
    best = get("unet bf16-mixed compiled sweep", "best")
    mfus = [x.get("mfu") for n, r in runs.items() if n.startswith("unet bf16") for x in [r, r.get("best") or {}]]
    return {
        "unet_samples_per_s_bf16": max((x for x in unet if x), default=None),
        "unet_mfu_bf16": max((x for x in mfus if x), default=None),
        "unet_best_batch_bf16": best.get("batch"),
        "unet_samples_per_s_bf16_best_batch": best.get("samples_per_s"),
        "smoe_compiled_samples_per_s_bf16": smoe,
        "smoe_compiled_over_unet_compiled_bf16": smoe / unet_c if smoe and unet_c else None,
        "batch": part.sizes.batch or presets["unet"].batch,
        "definition": (
            "samples/s over timed AdamW steps at the preset's batch; unet_mfu_bf16: the largest model-FLOP "
            "utilisation of the U-Net in bf16 (FlopCounterMode FLOPs per sample x samples/s over the "
            "device's dense bf16 peak) over the preset batch and the compiled batch sweep"
        ),
    }


def training_item(part: Part, name: str, compiled: bool, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One config within the part's budget (a compiled one only with ``compile_reserve_s`` left); its error is
    recorded and the next one runs."""
    if part.left() < (part.sizes.compile_reserve_s if compiled else 2 * part.sizes.grace_s):
        return part.skip(name)
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as err:
        part.error(name, err)
        out = {"error": f"{type(err).__name__}: {err}"}
    reset_compiled(part)
    return {**out, "wall_s": time.perf_counter() - t0}


def reset_compiled(part: Part) -> None:
    import torch

    torch._dynamo.reset()
    release(part)


def summary_line(r: dict[str, Any]) -> str:
    if "samples_per_s" not in r:
        return str(r.get("skipped") or r.get("error"))
    mem = f", peak {r['peak_memory_gb']:.1f} GB" if r.get("peak_memory_gb") else ""
    mfu = f", MFU {100 * r['mfu']:.1f} %" if r.get("mfu") else ""
    best = r.get("best") or {}
    top = f"; best batch {best['batch']}: {best['samples_per_s']:.2f} samples/s" if r.get("sweep") else ""
    return (
        f"{r['samples_per_s']:.2f} samples/s ({r['step_ms']:.1f} ms/step, warm-up {r['warmup_s']:.1f} s{mem}{mfu}){top}"
    )


def print_training(runs: dict[str, Any]) -> None:
    print(f"\n{'config':40} {'batch':>5} {'samples/s':>10} {'ms/step':>9} {'peak GB':>8} {'MFU %':>6}")
    for k, r in runs.items():
        for x in [r] + [y for y in r.get("sweep") or [] if y is not r and y.get("batch") != r.get("batch")]:
            if "samples_per_s" not in x:
                print(f"{k:40} {x.get('batch', ''):>5} {x.get('why') or summary_line(x)}")
                continue
            mfu = 100 * x["mfu"] if x.get("mfu") else float("nan")
            peak = x["peak_memory_gb"] if x.get("peak_memory_gb") is not None else float("nan")
            print(f"{k:40} {x['batch']:>5} {x['samples_per_s']:>10.2f} {x['step_ms']:>9.1f} {peak:>8.2f} {mfu:>6.1f}")


# --- part 3: neural field against SZ3 ----------------------------------------------------------------------
def spectrum(k: np.ndarray, spec: FieldSpec) -> np.ndarray:
    """Energy spectrum E(k) (arbitrary units) of total wavenumber k (cycles per great circle): flat below
    ``k_large``, k^-3 to ``k_meso`` (synoptic scales), k^-5/3 beyond (mesoscale), continuous."""
    synoptic = (spec.k_large**2 + k**2) ** -1.5
    at_meso = (spec.k_large**2 + spec.k_meso**2) ** -1.5
    return np.where(k <= spec.k_meso, synoptic, at_meso * (np.maximum(k, 1e-9) / spec.k_meso) ** (-5.0 / 3.0))


def synthetic_field(spec: FieldSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A T850-like field (K) with small-scale structure, data (T, H, W) float32, latitude (H,) ascending,
    longitude (W,): a zonal climatology plus an anomaly whose spectrum is :func:`spectrum` out to the grid's
    resolution. The anomaly is a random-phase Fourier series on the doubly periodic (2 (H - 1), W) plane
    (latitude continued over the poles, so the rows -90..90 are its first H), each mode's amplitude
    sqrt(E(k) / k) (E per unit wavenumber spread over a ring of ~k modes), its phase turning with a period
    of 2-40 days (shorter for smaller scales) and its amplitude modulated over 5-60 days. Only uniform draws
    of numpy's PCG64, float64 arithmetic and one inverse FFT per day, so every machine generates the same
    field (to float32 rounding)."""
    n_y, n_x = 2 * (spec.n_lat - 1), spec.n_lon
    ky = np.fft.fftfreq(n_y, 1.0 / n_y)[:, None]  # cycles around the continued meridian circle
    kx = np.fft.rfftfreq(n_x, 1.0 / n_x)[None, :]  # zonal wavenumber
    k = np.hypot(kx, ky)  # (n_y, n_x // 2 + 1)
    u = np.random.default_rng(spec.seed).random((4, *k.shape))  # every random number, in one draw
    amp = np.sqrt(spectrum(k, spec) / np.maximum(k, 1.0)) * (k > 0)
    period = (2.0 + 38.0 * (np.maximum(k, 1.0) / 1.0) ** -0.6) * (0.7 + 0.6 * u[0])  # days
    mod_period = 5.0 + 55.0 * u[1]
    lat = np.linspace(-90.0, 90.0, spec.n_lat)
    lon = np.arange(spec.n_lon) * (360.0 / spec.n_lon)
    clim = 260.0 + 25.0 * np.cos(np.deg2rad(lat)) ** 2 + 5.0 * np.sin(np.deg2rad(lat))  # (H,)
    days = np.arange(spec.n_times)
    anomalies = np.empty((spec.n_times, spec.n_lat, spec.n_lon))
    for t in days:
        phase = 2 * np.pi * (u[2] + t / period)
        coef = amp * (0.6 + 0.4 * np.cos(2 * np.pi * (u[3] + t / mod_period))) * np.exp(1j * phase)
        anomalies[t] = np.fft.irfft2(coef, s=(n_y, n_x))[: spec.n_lat]
    scale = spec.anomaly_std / anomalies.std()
    data = (clim[None, :, None] + scale * anomalies).astype(np.float32)
    return data, lat, lon


def fingerprint(data: np.ndarray) -> dict[str, float]:
    x = data.astype(np.float64)
    return {
        "mean": float(x.mean()),
        "std": float(x.std()),
        "corner": float(x[0, 0, 0]),
        "sample_sum": float(x[::7, ::5, ::3].sum()),
    }


def lat_weights(lat: np.ndarray) -> np.ndarray:
    """cos(latitude) weights with mean 1 (WeatherBench's, compression/metrics.py's)."""
    w = np.cos(np.deg2rad(lat))
    return w / w.mean()


def weighted_rmse(data: np.ndarray, decoded: np.ndarray, lat: np.ndarray) -> float:
    err = decoded.astype(np.float64) - data.astype(np.float64)
    return float(np.sqrt((err**2 * lat_weights(lat)[:, None]).mean()))


def prepare_sz3(path: Path) -> None:
    """The SZ3 reference the GPU run carries: for the GPU and the dry-run field, SZ3 (pysz through
    compression/baselines.py, 16 bytes of shape counted) at absolute bounds of 1e-4 to 3.2 x the field's
    std: ratio, weighted RMSE, max abs error."""
    from importlib.metadata import version

    bootstrap(block=False)
    from postcast.compression import baselines

    fields: dict[str, Any] = {}
    for spec in (GPU.field, DRY.field):
        t0 = time.perf_counter()
        data, lat, _ = synthetic_field(spec)
        std = float(data.std(dtype=np.float64))
        rows = []
        for frac in SZ3_BOUNDS:
            r = baselines.sz3(data, frac * std)
            rows.append(
                {
                    "abs_bound": frac * std,
                    "bound_over_std": frac,
                    "bytes": r.nbytes,
                    "ratio": data.nbytes / r.nbytes,
                    "wrmse": weighted_rmse(data, r.decoded, lat),
                    "max_abs": float(np.abs(r.decoded.astype(np.float64) - data).max()),
                }
            )
            print(
                f"{spec.key}: bound {frac:.2e} std -> ratio {rows[-1]['ratio']:.1f}, wRMSE {rows[-1]['wrmse']:.4g}",
                flush=True,
            )
        fields[spec.key] = {
            "spec": asdict(spec),
            "shape": list(data.shape),
            "raw_bytes": data.nbytes,
            "std": std,
            "fingerprint": fingerprint(data),
            "seconds": time.perf_counter() - t0,
            "table": rows,
        }
    write_json(
        path,
        {
            "generated_by": "python benchmarks/gpu.py --prepare-sz3",
            "pysz": version("pysz"),
            "wrmse": "cos-latitude weighted RMSE (weights mean 1), K",
            "fields": fields,
        },
    )
    print(f"wrote {path}")


def load_reference(spec: FieldSpec, data: np.ndarray) -> dict[str, Any]:
    """The carried SZ3 table of this field, after checking it was computed on the same field."""
    if not REFERENCE.exists():
        raise FileNotFoundError(f"{REFERENCE}: missing; run `python benchmarks/gpu.py --prepare-sz3` with pysz")
    ref = json.loads(REFERENCE.read_text())["fields"][spec.key]
    if ref["spec"] != asdict(spec):
        raise ValueError(
            f"the SZ3 reference was computed for {ref['spec']}, this run uses {asdict(spec)}: rerun --prepare-sz3"
        )
    got = fingerprint(data)
    off = {k: (v, got[k]) for k, v in ref["fingerprint"].items() if not math.isclose(v, got[k], rel_tol=1e-5)}
    if off:
        raise ValueError(f"the field differs from the one SZ3 was measured on (reference, here): {off}")
    return ref


def sz3_ratio_at(table: list[dict[str, Any]], wrmse: float) -> float | None:
    """SZ3's ratio at this weighted RMSE, log-log interpolated between its settings (None outside them)."""
    pts = sorted((math.log(r["wrmse"]), math.log(r["ratio"])) for r in table if r["wrmse"] > 0)
    if not pts or not pts[0][0] <= math.log(wrmse) <= pts[-1][0]:
        return None
    xs, ys = zip(*pts, strict=True)
    return float(math.exp(np.interp(math.log(wrmse), xs, ys)))


def trilinear(grid: Any, t: Any, lat: Any, lon: Any) -> Any:
    """Trilinear interpolant of grid (T, H, W) (latitude -90..90 regular ascending, longitude regular and
    periodic) at time index t, lat, lon (N,) each -> (N,); compression/field.py's ``interpolate`` on the
    device for one variable and level."""
    import torch

    n_t, n_h, n_w = grid.shape
    fy = (lat + 90.0) / (180.0 / (n_h - 1))
    i0 = fy.floor().clamp(0, n_h - 2)
    wy = (fy - i0).clamp(0, 1)
    fx = lon / (360.0 / n_w)
    wx = fx - fx.floor()
    j0 = fx.floor().long() % n_w
    t0 = t.floor().clamp(0, n_t - 1)
    wt = (t - t0).clamp(0, 1)
    flat = grid.reshape(-1)
    out = torch.zeros_like(t)
    for ti, a in ((t0.long(), 1 - wt), ((t0 + 1).clamp(max=n_t - 1).long(), wt)):
        for yi, b in ((i0.long(), 1 - wy), (i0.long() + 1, wy)):
            for xi, c in ((j0, 1 - wx), ((j0 + 1) % n_w, wx)):
                out += a * b * c * flat[(ti * n_h + yi) * n_w + xi]
    return out


class FieldFit:
    """The network, its data on the device (normalised) and the sampling of training points."""

    def __init__(self, part: Part, data: np.ndarray, lat: np.ndarray, lon: np.ndarray, width: int):
        import torch

        from postcast.compression import field as nf

        s = part.sizes
        self.part, self.lat, self.lon, self.shape = part, lat, lon, data.shape
        self.cfg = nf.FieldConfig(
            width=width, depth=s.depth, batch_points=s.batch_points, lr=s.lr, weights="q6", entropy="lzma"
        )
        mean, std = nf.normalisation(data[None, :, None])  # per (variable, level): (1, 1) each
        self.mean, self.std = float(mean[0, 0]), float(std[0, 0])
        self.data = torch.from_numpy(data).to(part.dev)  # (T, H, W) K
        self.grid = (self.data - self.mean) / self.std
        w = torch.tensor(lat_weights(lat), dtype=torch.float64, device=part.dev)[:, None]  # (H, 1), mean 1
        wmean = float((self.data.double() * w).mean())
        self.wstd = math.sqrt(float(((self.data.double() - wmean) ** 2 * w).mean()))  # compression/metrics.py's
        self.range = float(self.data.max() - self.data.min())
        self.gen = torch.Generator(device=part.dev).manual_seed(self.cfg.seed)

    def new_net(self) -> Any:
        import torch

        from postcast.compression import field as nf

        torch.manual_seed(self.cfg.seed)
        return nf.FieldNet(self.cfg, 1, self.shape[0]).to(self.part.dev)

    def points(self) -> tuple[Any, Any, Any]:
        """batch_points (t, lat, lon), uniform in time and on the sphere (an area-weighted loss)."""
        import torch

        u = torch.rand(3, self.cfg.batch_points, generator=self.gen, device=self.part.dev)
        t = u[0] * max(self.shape[0] - 1, 0)
        lat = 90.0 - torch.rad2deg(torch.acos((1 - 2 * u[1]).clamp(-1, 1)))
        return t, lat, u[2] * 360.0

    def step(self, net: Any, opt: Any) -> Any:
        import torch
        import torch.nn.functional as F

        from postcast.compression import field as nf

        t, la, lo = self.points()
        target = trilinear(self.grid, t, la, lo)  # (N,)
        pred = net(nf.coordinates(t, self.shape[0], torch.zeros_like(t), la, lo), t)[:, 0]
        loss = F.mse_loss(pred, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        opt.step()
        return loss.detach()


def fit_field(fit: FieldFit, seconds: float) -> tuple[Any, dict[str, Any]]:
    """Adam for ``seconds`` of wall clock: learning-rate warm-up over the first 5 % of the time, then
    cosine decay to zero at the end (a time budget, not a step count); gradient clipping 0.5."""
    import torch

    net = fit.new_net()
    opt = torch.optim.Adam(net.parameters(), lr=fit.cfg.lr)
    curve: list[tuple[int, float, float]] = []
    steps, t0 = 0, time.perf_counter()
    while (frac := (time.perf_counter() - t0) / seconds) < 1:
        scale = frac / 0.05 if frac < 0.05 else 0.5 * (1 + math.cos(math.pi * (frac - 0.05) / 0.95))
        for group in opt.param_groups:
            group["lr"] = fit.cfg.lr * max(scale, 1e-3)
        loss = fit.step(net, opt)
        steps += 1
        if steps % 250 == 0 or steps == 1:
            curve.append((steps, time.perf_counter() - t0, math.sqrt(float(loss))))
    fit.part.sync()
    dt = time.perf_counter() - t0
    curve.append((steps, dt, math.sqrt(float(loss))))
    return net.eval(), {
        "steps": steps,
        "seconds": dt,
        "points_per_s": steps * fit.cfg.batch_points / dt,
        "final_batch_rmse_normalised": curve[-1][2],
        "curve": curve,
        "parameters": sum(p.numel() for p in net.parameters()),
    }


def stored(fit: FieldFit, net: Any, weights: str) -> tuple[dict[str, np.ndarray], Any]:
    """The arrays an artefact stores for ``weights`` (compression/artefact.py's from_network) and a copy of
    the network with the weights the decoder sees (after the cast)."""
    from postcast.compression import field as nf

    arrays: dict[str, np.ndarray] = {
        "norm.mean": np.array([[fit.mean]], np.float32),
        "norm.std": np.array([[fit.std]], np.float32),
    }
    state = {}
    for name, tensor in net.state_dict().items():
        if name == "bmat":
            state[name] = tensor
            continue
        arrs, back = nf.quantise(tensor.detach().cpu(), weights)
        arrays.update({f"w.{name}{suffix}": a for suffix, a in arrs.items()})
        state[name] = back
    b, ft, fl = net.bmat.cpu().numpy(), fit.cfg.time_features, fit.cfg.level_features
    arrays.update({"fourier.time": b[0, :ft], "fourier.level": b[1, ft : ft + fl], "fourier.space": b[2:, ft + fl :]})
    q = copy.deepcopy(net)
    q.load_state_dict(state)
    return arrays, q.eval()


def artefact_bytes(fit: FieldFit, cfg: Any, arrays: dict[str, np.ndarray], errors: dict[str, Any]) -> int:
    """Bytes of the artefact file (format 3: prefix, codec byte, JSON header and arrays, raw LZMA2 when
    ``cfg.entropy`` is lzma), built as compression/artefact.py does (which needs zarr: not imported)."""
    n_t, n_h, n_w = fit.shape
    table, blobs, offset = {}, [], 0
    for name, arr in arrays.items():
        raw = np.ascontiguousarray(arr).tobytes()
        table[name] = {"dtype": arr.dtype.str, "shape": list(arr.shape), "offset": offset, "nbytes": len(raw)}
        blobs.append(raw)
        offset += len(raw)
    header = {
        "format_version": 3,
        "config": cfg.to_dict(),
        "variables": ["t850"],
        "units": ["K"],
        "time_dim": "time",
        "times": [float(i) for i in range(n_t)],
        "times_are_datetimes": False,
        "levels": [None],
        "grid": {"lon0": 0.0, "nlon": n_w, "lat0": -90.0, "dlat": 180.0 / (n_h - 1), "nlat": n_h},
        "shape": [1, n_t, 1, n_h, n_w],
        "errors": {"var0": errors},
        "arrays": table,
    }
    payload = json.dumps(_plain(header), separators=(",", ":")).encode() + b"".join(blobs)
    if cfg.entropy == "lzma":
        payload = lzma.compress(payload, format=lzma.FORMAT_RAW, filters=LZMA_FILTERS)
    return ARTEFACT_PREFIX + len(payload)


def decode_errors(fit: FieldFit, net: Any) -> dict[str, float]:
    """The network's decode on every grid point against the field: compression/metrics.py's measures (K)
    and weighted RMSE / the field's std (one level: the artefact header's ``wrmse_over_std``)."""
    import torch

    from postcast.compression import field as nf

    n_t, n_h, n_w = fit.shape
    dev = fit.part.dev
    lat = torch.tensor(fit.lat, dtype=torch.float32, device=dev)[:, None].expand(n_h, n_w).reshape(-1)
    lon = torch.tensor(fit.lon, dtype=torch.float32, device=dev)[None, :].expand(n_h, n_w).reshape(-1)
    w = torch.tensor(lat_weights(fit.lat), dtype=torch.float64, device=dev)[:, None]  # (H, 1), mean 1
    zero = torch.zeros_like(lat)
    sums = torch.zeros(3, dtype=torch.float64, device=dev)  # weighted and plain squared errors, abs errors
    worst = torch.zeros((), dtype=torch.float64, device=dev)
    with torch.no_grad():
        for t in range(n_t):
            ti = torch.full_like(lat, float(t))
            pred = net(nf.coordinates(ti, n_t, zero, lat, lon), ti)[:, 0].view(n_h, n_w) * fit.std + fit.mean
            err = (pred - fit.data[t]).double()  # (H, W) K
            sums += torch.stack([(err**2 * w).sum(), (err**2).sum(), err.abs().sum()])
            worst = torch.maximum(worst, err.abs().max())
    wmse, mse, mae = (sums / (n_t * n_h * n_w)).tolist()
    return {
        "wrmse": math.sqrt(wmse),
        "rmse": math.sqrt(mse),
        "mae": mae,
        "max_abs": float(worst),
        "psnr_db": 20 * math.log10(fit.range) - 10 * math.log10(max(mse, 1e-300)),
        "wrmse_over_std": math.sqrt(wmse) / fit.wstd,
    }


def width_for(sizes: Sizes, shape: tuple[int, ...], ratio: float) -> dict[str, Any]:
    """The network width whose parameters, stored at ``bytes_per_parameter``, come nearest raw bytes / ratio
    (depth fixed); its parameter count and the ratio that estimate predicts."""
    from postcast.compression import field as nf

    want = 4 * math.prod(shape) / ratio / sizes.bytes_per_parameter  # parameters
    best: tuple[float, int, int] | None = None
    for width in range(4, 1025, 2):
        net = nf.FieldNet(nf.FieldConfig(width=width, depth=sizes.depth), 1, shape[0])
        n = sum(p.numel() for p in net.parameters())
        gap = abs(math.log(n / want))
        if best is None or gap < best[0]:
            best = (gap, width, n)
        if n > want:
            break
    assert best is not None
    _, width, n = best
    return {"width": width, "parameters": n, "predicted_ratio": 4 * math.prod(shape) / (n * sizes.bytes_per_parameter)}


def part_compression(part: Part) -> None:
    import torch

    spec = part.sizes.field
    t0 = time.perf_counter()
    data, lat, lon = synthetic_field(spec)
    ref = load_reference(spec, data)
    part.save(
        field={
            **asdict(spec),
            "shape": list(data.shape),
            "raw_bytes": data.nbytes,
            "generate_s": time.perf_counter() - t0,
            "std": ref["std"],
        }
    )
    if part.dev.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls in the fit and the decode
    targets: dict[str, Any] = {}
    for i, ratio in enumerate(part.sizes.target_ratios):
        name = f"{ratio:g}"
        left = len(part.sizes.target_ratios) - i
        seconds = min(part.sizes.fit_seconds, (part.left() - (12 if part.dev.type == "cuda" else 1) * left) / left)
        if seconds < 0.2 * part.sizes.fit_seconds:
            targets[name] = part.skip(f"the fit for ratio {name}")
            continue
        try:
            targets[name] = fit_target(part, data, lat, lon, ratio, seconds, ref)
        except Exception as err:
            part.error(f"neural field for ratio {name}", err)
            targets[name] = {"error": f"{type(err).__name__}: {err}"}
        part.save(targets=targets, figures=compression_figures(part, targets))
    part.save(targets=targets, figures=compression_figures(part, targets))
    print_compression(targets)


def fit_target(
    part: Part, data: np.ndarray, lat: np.ndarray, lon: np.ndarray, ratio: float, seconds: float, ref: dict[str, Any]
) -> dict[str, Any]:
    """One network sized for ``ratio`` (q6 per row + lzma), fitted for ``seconds``: its ratio and weighted RMSE
    after the cast, and SZ3's ratio at that same weighted RMSE."""
    from postcast.models import kernels

    size = width_for(part.sizes, data.shape, ratio)
    fit = FieldFit(part, data, lat, lon, size["width"])
    net, info = fit_field(fit, seconds)
    stored_as = lever(fit, net, "q6", "lzma", ref)
    fourier = kernels.resolve(fit.grid, kernel="fourier_layer")  # auto: PyTorch (EAGER_UNDER_AUTO)
    info.pop("curve")
    return {"target_ratio": ratio, **size, "fit": {**info, "fourier_layer": fourier, "budget_s": seconds}, **stored_as}


def compression_figures(part: Part, targets: dict[str, Any]) -> dict[str, Any]:
    done = {k: v for k, v in targets.items() if "ratio" in v}
    figures: dict[str, Any] = {f"neural_over_sz3_at_ratio_{k}": v["neural_over_sz3"] for k, v in done.items()}
    figures.update(
        {
            "storage": "q6+lzma",
            "fit_seconds_each": part.sizes.fit_seconds,
            "definition": (
                "for each target ratio r a network sized for raw float32 bytes / r at q6 per row + lzma is "
                "fitted for a fixed time; neural_over_sz3_at_ratio_r = its measured ratio (raw bytes / "
                "artefact bytes) over SZ3's ratio at the network's own cos-latitude weighted RMSE, log-log "
                "interpolated from benchmarks/gpu_sz3_reference.json (pysz on the CPU machine, same field; "
                "null outside its table); > 1: the network is smaller at equal error"
            ),
        }
    )
    return figures


def lever(fit: FieldFit, net: Any, weights: str, entropy: str, ref: dict[str, Any]) -> dict[str, Any]:
    """One storage of the fitted network: its decode errors (after the cast), size, ratio and SZ3's ratio at
    the same weighted RMSE."""
    from dataclasses import replace

    t0 = time.perf_counter()
    cfg = replace(fit.cfg, weights=weights, entropy=entropy)
    arrays, q = stored(fit, net, weights)
    errors = decode_errors(fit, q)
    t1 = time.perf_counter()
    nbytes = artefact_bytes(fit, cfg, arrays, errors)
    ratio = 4 * math.prod(fit.shape) / nbytes
    sz3 = sz3_ratio_at(ref["table"], errors["wrmse"])
    return {
        **errors,
        "bytes": nbytes,
        "ratio": ratio,
        "sz3_ratio_at_same_wrmse": sz3,
        "neural_over_sz3": ratio / sz3 if sz3 else None,
        "decode_s": t1 - t0,
        "encode_s": time.perf_counter() - t1,
    }


def print_compression(targets: dict[str, Any]) -> None:
    head = ("target", 7), ("width", 6), ("params", 8), ("steps", 7), ("ratio", 8), ("wRMSE K", 9), ("SZ3 ratio", 10)
    print("\n" + " ".join(f"{h:>{n}}" for h, n in head) + f" {'x SZ3':>7}")
    for name, r in targets.items():
        if "ratio" not in r:
            print(f"{name:>7} {r.get('skipped') or r.get('error')}")
            continue
        print(
            f"{name:>7} {r['width']:>6} {r['parameters']:>8} {r['fit']['steps']:>7} {r['ratio']:>8.1f} "
            f"{r['wrmse']:>9.4f} {fmt(r['sz3_ratio_at_same_wrmse']):>10} {fmt(r['neural_over_sz3']):>7}",
            flush=True,
        )


# --- entry point -------------------------------------------------------------------------------------------
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu", help="output folder ($OUT, else runs/gpu)")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, Triton in its interpreter")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--fail-part", choices=PARTS, help="make this part raise at its start (tests)")
    p.add_argument("--prepare-sz3", action="store_true", help=f"write {REFERENCE.name} (needs pysz)")
    p.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # internal: run one part in this process
    p.add_argument("--deadline", type=float, default=math.inf, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.out = str(Path(args.out).resolve())  # the parts run in the repository root
    args.parts = [x for x in args.parts.split(",") if x]
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        p.error(f"--parts: unknown {sorted(unknown)}; choose from {PARTS}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.prepare_sz3:
        prepare_sz3(REFERENCE)
        return 0
    if args.part:
        return run_part(args)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
