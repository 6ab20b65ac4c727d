"""The GPU figures in one prepared run (issue 41): the fused kernels, U-Net training throughput at 0.5 deg
and the neural field against SZ3, in under 8 minutes on one NVIDIA H100/H200, every figure as JSON.

    python benchmarks/gpu.py --out $OUT        # on the GPU machine (its Python: torch + CUDA, triton, xarray)
    python benchmarks/gpu.py --dry-run         # anywhere: tiny sizes on the CPU, well under a minute
    python benchmarks/gpu.py --prepare-sz3     # CPU machine with pysz: rewrites benchmarks/gpu_sz3_reference.json

Nothing is installed on the GPU machine: each part makes ``postcast.*`` importable from this checkout
(a temporary folder of links laid out as installed, first on ``sys.path``) and marks zarr, dask,
netCDF4, eccodes, cfgrib, numcodecs and pysz absent, so a module that needs them fails here as it
would there (the dry run proves the parts import none). Each part runs in its own process with its
own time budget inside one global deadline; a part that fails, crashes or runs out of time is recorded
(error and traceback text) and the next one runs. Files in ``--out`` (default ``$OUT``, else
``runs/gpu``): ``gpu.json`` (everything), ``<part>.json`` (written as each part goes) and
``<part>.stderr.txt``.

Parts and figures:

* **kernels**: every Triton kernel of ``models/kernels`` (docs/kernels.md) on 0.5 deg fields, timed
  for eager PyTorch (``torch``), ``torch.compile`` (``compile``) and Triton (``triton``), median of
  CUDA-event timings after warm-up; bandwidth = compulsory bytes (inputs read once, outputs written once,
  forward and backward together where the kernel trains) / time, as a fraction of the measured
  device-to-device copy bandwidth; max abs difference from eager, forward and backward.
  ``min_bandwidth_fraction``: the smallest Triton fraction over the kernels; ``min_speedup_vs_eager``:
  the smallest eager time / Triton time.
* **training**: the U-Net and U-Net + SMoE T850 presets (configs/train/) at 361 x 720 on random batches of
  the sample layout (datasets/sample.py), the PostProcessor's training step (normalise, network, Gaussian
  CRPS, SMoE routing loss) and AdamW, fp32 and bf16-mixed (autocast), eager and ``torch.compile``d:
  samples/s over timed optimizer steps after warm-up at the preset's batch, peak memory, and the
  largest batch that fits (doubling, then bisection on out-of-memory). ``unet_samples_per_s_bf16``:
  the U-Net's bf16 figure, the better of eager and compiled.
* **compression**: a neural field (compression/field.py) at the seed paper's scale (width 512, 12 residual
  blocks) fitted for 2 minutes to one synthetic smooth field (numpy from a seed: a year of daily 0.5 deg
  fields), stored as docs/compression.md recommends (q6 per row + lzma) and as the paper did (fp16);
  ratio (raw float32 bytes / artefact bytes) and cos-latitude weighted RMSE after the cast.
  ``compression_ratio_at_sz3_error``: the network's own ratio (q6 + lzma) at its own weighted RMSE; the
  JSON puts beside it SZ3's ratio at that same weighted RMSE, interpolated (log-log) from the table that
  ``--prepare-sz3`` computed with pysz on the CPU machine on the identical field, and their quotient.

Last line: ``RESULT device=<cuda|cpu> min_bandwidth_fraction=<x> min_speedup_vs_eager=<x>
unet_samples_per_s_bf16=<x> compression_ratio_at_sz3_error=<x>`` (nan for a figure whose part failed).
The script exits 0 once it has written gpu.json. ``--fail-part NAME`` makes that part raise at its start
(the test that a failing part is recorded and the rest still runs); ``--parts`` runs a subset.
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
LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]  # compression/artefact.py's
ARTEFACT_PREFIX = 4 + 2 + 4 + 4 + 1  # magic, version, header length, crc32, codec byte (artefact format 3)
SZ3_BOUNDS = tuple(float(x) for x in np.logspace(-4, 0.5, 19))  # absolute bounds, fractions of the field's std
RESULT_KEYS = (
    ("kernels", "min_bandwidth_fraction"),
    ("kernels", "min_speedup_vs_eager"),
    ("training", "unet_samples_per_s_bf16"),
    ("compression", "compression_ratio_at_sz3_error"),
)


@dataclass(frozen=True)
class FieldSpec:
    """The synthetic smooth field (T850-like, K), generated from the seed with numpy alone."""

    key: str  # its entry in the SZ3 reference
    n_times: int  # daily dates
    n_lat: int  # -90..90 inclusive
    n_lon: int  # 0..360 exclusive
    modes: int = 96
    max_wavenumber: int = 64
    seed: int = 41


@dataclass(frozen=True)
class Sizes:
    """Everything that differs between the GPU run and the dry run."""

    grid: tuple[int, int]  # (H, W)
    budgets: dict[str, float]  # seconds kept for each part (a part may also use what earlier ones left)
    deadline_s: float  # the whole run
    grace_s: float  # a part stops starting work this long before it is killed
    copy_floats: int  # the copy-bandwidth buffer
    kernel_points: int  # points of one field in the kernel cases (the GPU: the 0.5 deg grid's)
    kernel_reps: int
    kernel_warmup: int  # calls after the first (which compiles) before timing
    kernel_seconds: float  # timing budget per kernel and path
    batch: int | None  # training batch (None: the preset's)
    warmup_steps: int
    timed_steps: int
    timed_seconds: float
    batch_cap: int  # the largest-batch search stops doubling here
    search_seconds: float  # per search
    simulated_max_batch: int | None  # dry run: batches above this "do not fit" (exercises the bisection)
    compile_backend: str  # torch.compile's backend (the dry run: no inductor codegen, minutes on a CPU)
    compile_reserve_s: float  # a compiled training config starts only with this much of the part left
    threads: int | None  # torch CPU threads (the dry run: 1; two spinning threads on a loaded 2-core box crawl)
    net_override: dict[str, Any]  # preset network options replaced (the dry run: narrower U-Nets)
    field: FieldSpec
    width: int
    depth: int
    batch_points: int
    lr: float
    fit_seconds: float


GPU = Sizes(
    grid=(361, 720),
    budgets={"kernels": 95, "training": 170, "compression": 195},
    deadline_s=470,
    grace_s=8,
    copy_floats=64 * 2**20,
    kernel_points=361 * 720,
    kernel_reps=20,
    kernel_warmup=2,
    kernel_seconds=2.0,
    batch=None,
    warmup_steps=3,
    timed_steps=20,
    timed_seconds=5.0,
    batch_cap=1024,
    search_seconds=20,
    simulated_max_batch=None,
    compile_backend="inductor",
    compile_reserve_s=60,
    threads=None,
    net_override={},
    field=FieldSpec("full", 366, 361, 720),
    width=512,
    depth=12,
    batch_points=32768,
    lr=5e-4,
    fit_seconds=120,
)
DRY = Sizes(
    grid=(16, 32),
    budgets={"kernels": 150, "training": 150, "compression": 100},
    deadline_s=400,
    grace_s=3,
    copy_floats=2**20,
    kernel_points=64,
    kernel_reps=1,
    kernel_warmup=0,
    kernel_seconds=0.5,
    batch=2,
    warmup_steps=1,
    timed_steps=2,
    timed_seconds=5.0,
    batch_cap=8,
    search_seconds=60,
    simulated_max_batch=5,
    compile_backend="eager",
    compile_reserve_s=10,
    threads=1,
    net_override={"base_filters": 8},
    field=FieldSpec("dry", 4, 16, 32, modes=24, max_wavenumber=4),
    width=16,
    depth=2,
    batch_points=1024,
    lr=5e-3,
    fit_seconds=3,
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
    backward: Callable[[str], list[Any]] | None = None


def part_kernels(part: Part) -> None:
    use_compile_backend(part.sizes.compile_backend)
    bw = copy_bandwidth(part)
    part.save(copy_bandwidth_GBps=bw / 1e9)
    cases = kernel_cases(part)
    rows = {name: {"kernel": name, "bytes": case.nbytes, "timed": case.timed} for name, case in cases.items()}
    for paths in (("torch", "triton"), ("compile",)):  # the figures first; torch.compile's compilations last
        for name, case in cases.items():
            if part.left() < 5:
                rows[name].update({f"{p}_skipped": part.skip(f"{name} / {p}")["skipped"] for p in paths})
            else:
                kernel_paths(part, rows[name], case, paths, bw)
            part.save(rows=list(rows.values()), figures=kernel_figures(list(rows.values()), bw, len(cases)))
    print_kernels(part, list(rows.values()), bw)


def kernel_figures(rows: list[dict[str, Any]], bw: float, n: int) -> dict[str, Any]:
    """The part's figures over the kernels timed so far (a part killed at its budget keeps them)."""
    done = [r for r in rows if isinstance(r.get("triton_ms"), float)]
    return {
        "min_bandwidth_fraction": min((r["triton_bw_fraction"] for r in done), default=None),
        "min_speedup_vs_eager": min((r["triton_speedup"] for r in done), default=None),
        "min_bandwidth_fraction_memory_bound": min(
            (r["triton_bw_fraction"] for r in done if r["kernel"].split()[0] in "12"), default=None
        ),
        "copy_bandwidth_GBps": bw / 1e9,
        "kernels_timed": len(done),
        "kernels": n,
    }


def use_compile_backend(backend: str) -> None:
    """The kernels' ``compile`` path through ``torch.compile(backend=...)``: inductor (untouched) on the GPU;
    in the dry run ``eager`` (dynamo's tracing and guards without AOT autograd or inductor's C++ codegen,
    which cost 15-25 s a kernel on a loaded 2-core CPU). The dispatch looks ``_compiled`` up at each call,
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


def copy_bandwidth(part: Part) -> float:
    """Measured device copy bandwidth, bytes/s: read + write of a large buffer (256 MiB on the GPU)."""
    import torch

    x = torch.empty(part.sizes.copy_floats, dtype=torch.float32, device=part.dev).uniform_()
    y = torch.empty_like(x)
    t = timed(part, lambda: y.copy_(x), 20, 2.0)
    return 2 * x.numel() * F32 / t


def kernel_cases(part: Part) -> dict[str, Case]:
    """kernel -> (run(path), compulsory bytes, what is timed), at benchmarks/kernels.py's shapes."""
    import torch

    from postcast.models import kernels

    dev, pts = part.dev, part.sizes.kernel_points
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape: int, grad: bool = False) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=dev).requires_grad_(grad)

    def fresh(*ts: torch.Tensor) -> None:
        for t in ts:
            t.grad = None

    members = rnd(1, 10, 8, pts)  # (B, M, V, points): one sample, 10 members, 8 variables

    def standardise(path: str) -> Outputs:
        with kernels.use_backend(path):
            return list(kernels.ensemble_standardise(members)), []

    n = 4 * pts  # a batch of four fields
    mu, y = rnd(n, grad=True), rnd(n)
    sigma = (torch.rand(n, generator=g, device=dev) + 0.5).requires_grad_()

    def crps_gauss(path: str) -> Outputs:
        fresh(mu, sigma)
        with kernels.use_backend(path):
            out = kernels.crps_gaussian(mu, sigma, y)
            out.sum().backward()
        return [out.detach()], [mu.grad, sigma.grad]

    ens, obs = rnd(n // 4, 10), rnd(n // 4)  # (N, M) members, (N,) outcomes

    def crps_ens(path: str) -> Outputs:
        with kernels.use_backend(path):
            return [kernels.crps_ensemble(ens, obs, True)], []

    values, weights = rnd(8, 3, pts, grad=True), rnd(8, 3, pts, grad=True)  # (2B, E, points)

    def topk(path: str) -> Outputs:
        fresh(values, weights)
        with kernels.use_backend(path):
            out = kernels.topk_route(values, weights, 1, weighted=True)
            out.sum().backward()
        return [out.detach()], [values.grad, weights.grad]

    coords, bmat = torch.rand(pts, 4, generator=g, device=dev), rnd(4, 64)  # (N, D), (D, F)
    weight, bias = (rnd(128, 128) / 8).requires_grad_(), rnd(128, grad=True)  # (H, 2F), (H,)

    def fourier(path: str) -> Outputs:
        with kernels.use_backend(path), torch.no_grad():  # decoding: forward only (timed)
            return [kernels.fourier_layer(coords, bmat, weight, bias)], []

    def fourier_bwd(path: str) -> list[Any]:  # checked, not timed: the backward is PyTorch's recompute
        fresh(weight, bias)
        with kernels.use_backend(path):
            kernels.fourier_layer(coords, bmat, weight, bias).square().sum().backward()
        return [weight.grad, bias.grad]

    return {
        "1 ensemble_standardise": Case(standardise, F32 * members.numel() * (2 + 2 / 10), "fwd"),
        "2 crps_gaussian": Case(crps_gauss, F32 * n * 6, "fwd+bwd"),  # read mu, sigma, y; write crps, 2 grads
        "3 crps_ensemble fair": Case(crps_ens, F32 * (n // 4) * 12, "fwd"),
        "4 smoe topk_route": Case(topk, F32 * 8 * pts * (2 * 3 + 2 + 2 * 3), "fwd+bwd"),
        "5 fourier_layer": Case(fourier, F32 * pts * (4 + 128), "fwd", fourier_bwd),
    }


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
            if path != "torch" and "torch_ms" in row:
                row[f"{path}_speedup"] = row["torch_ms"] / row[f"{path}_ms"]
        except Exception as err:
            part.error(f"{row['kernel']} / {path}", err)


def print_kernels(part: Part, rows: list[dict[str, Any]], bw: float) -> None:
    print(
        f"\nkernels on {part.dev.type}, copy bandwidth {bw / 1e9:.1f} GB/s, fields of {part.sizes.kernel_points} "
        "points",
        flush=True,
    )
    print(
        f"{'kernel':24} {'timed':8} {'MB':>7}"
        + "".join(f" {p + ' ms':>11} {p + ' %bw':>11}" for p in ("torch", "compile", "triton"))
        + f" {'triton x eager':>15} {'triton maxdiff':>15}"
    )
    for r in rows:
        line = f"{r['kernel']:24} {r.get('timed', ''):8} {r.get('bytes', 0) / 1e6:>7.1f}"
        for p in ("torch", "compile", "triton"):
            ms, frac = r.get(f"{p}_ms"), r.get(f"{p}_bw_fraction")
            line += f" {ms:>11.3f} {100 * frac:>10.1f}%" if ms is not None else f" {'-':>11} {'-':>11}"
        sp = r.get("triton_speedup")
        diffs = [d for d in (r.get("triton_max_abs_diff_fwd"), r.get("triton_max_abs_diff_bwd")) if d is not None]
        line += f" {sp:>15.2f}" if sp is not None else f" {'-':>15}"
        line += f" {max(diffs):>15.2e}" if diffs else f" {'-':>15}"
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

    from postcast.models import postprocessors

    x = torch.nan_to_num((batch["fields"] - batch["norm_mean"]) / batch["norm_std"])  # (B, 2V, H, W)
    view = {"x": torch.cat([x, batch["features"]], dim=1), "m": batch["m"], "s": batch["s"]}
    dist = postprocessors.predict(net, view, "gaussian")
    ok = torch.isfinite(batch["y"])  # (B, H, W)
    bad = {k: int((~torch.isfinite(batch[k][ok])).sum()) for k in ("m", "s")}
    if any(bad.values()):
        raise ValueError(f"non-finite raw ensemble statistics in the batch: {bad}")
    loss = dist.select(ok).crps(batch["y"][ok]).mean()
    layer = getattr(net, "smoe", None)
    if layer is not None and layer.cfg.rc_loss:
        rc = layer.rc_loss(loss)
        layer.expert_share()
        loss = loss + layer.cfg.rc_weight * rc
    return loss


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


def throughput(part: Part, preset: Preset, precision: str, compiled: bool) -> dict[str, Any]:
    """samples/s over timed optimizer steps after warm-up, at the preset's batch; peak memory (GPU)."""
    import torch

    torch.manual_seed(0)
    net = build_net(preset, part.sizes.grid).to(part.dev).train()
    model = torch.compile(net, backend=part.sizes.compile_backend) if compiled else net
    opt = torch.optim.AdamW(net.parameters(), lr=preset.lr)
    b = part.sizes.batch or preset.batch
    batch = random_batch(preset, b, part.sizes.grid, part.dev)
    t0 = time.perf_counter()
    for _ in range(part.sizes.warmup_steps):
        optimizer_step(model, opt, batch, precision)
    part.sync()
    warm = time.perf_counter() - t0
    if part.dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
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


def search_largest(
    fits: Callable[[int], bool], start: int, cap: int, out_of_time: Callable[[], bool]
) -> dict[str, Any]:
    """The largest batch for which ``fits`` holds: double from ``start`` until it fails (or ``cap``), then
    bisect between the last fit and the first failure; stops early (``exact`` false) when out of time."""
    lo, hi, b = 0, None, start
    while b <= cap and not out_of_time():
        if not fits(b):
            hi = b
            break
        lo, b = b, 2 * b
    while hi is not None and hi - lo > 1 and not out_of_time():
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return {
        "largest_batch": lo or None,
        "first_failure": hi,
        "capped": hi is None and b > cap,
        "exact": hi is not None and hi - lo == 1,
    }


def largest_batch(part: Part, preset: Preset, precision: str) -> dict[str, Any]:
    """Largest batch for one optimizer step (eager), doubling then bisection on out-of-memory."""
    import torch

    torch.manual_seed(0)
    net = build_net(preset, part.sizes.grid).to(part.dev).train()
    opt = torch.optim.AdamW(net.parameters(), lr=preset.lr)
    trials: list[dict[str, Any]] = []
    sim = part.sizes.simulated_max_batch
    end = time.time() + min(part.sizes.search_seconds, part.left())

    def fits(b: int) -> bool:
        t0 = time.perf_counter()
        if part.dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            if sim is not None and b > sim:
                raise torch.cuda.OutOfMemoryError(f"simulated: the dry run's limit is {sim}")
            optimizer_step(net, opt, random_batch(preset, b, part.sizes.grid, part.dev), precision)
            part.sync()
            ok, why = True, None
        except RuntimeError as err:  # torch.cuda.OutOfMemoryError, cuDNN/cuBLAS allocation failures
            ok, why = False, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        opt.zero_grad(set_to_none=True)
        release(part)
        peak = torch.cuda.max_memory_allocated() / 1e9 if part.dev.type == "cuda" else None
        trials.append({"batch": b, "fits": ok, "seconds": time.perf_counter() - t0, "peak_memory_gb": peak, "why": why})
        return ok

    found = search_largest(fits, part.sizes.batch or preset.batch, part.sizes.batch_cap, lambda: time.time() > end)
    return {**found, "precision": precision, "simulated_limit": sim, "trials": trials}


def training_plan(presets: dict[str, Preset]) -> list[tuple[str, str, str, bool]]:
    """(kind, family, precision, compiled) in priority order: the headline first, compiled configs late
    (each costs a compilation), so a tight budget drops the least informative ones."""
    head = [
        ("run", "unet", "bf16-mixed", False),
        ("run", "unet", "bf16-mixed", True),
        ("run", "unet", "32-true", False),
        ("run", "unet_smoe", "bf16-mixed", False),
        ("run", "unet_smoe", "32-true", False),
    ]
    search = [("largest", f, p, False) for f in presets for p in ("bf16-mixed", "32-true")]
    late = [
        ("run", "unet", "32-true", True),
        ("run", "unet_smoe", "bf16-mixed", True),
        ("run", "unet_smoe", "32-true", True),
    ]
    return head + search + late


def part_training(part: Part) -> None:
    presets = {name: read_preset(path, part.sizes.net_override) for name, path in PRESETS.items()}
    part.save(presets={k: asdict(v) for k, v in presets.items()}, grid=part.sizes.grid)
    runs: dict[str, Any] = {}
    largest: dict[str, Any] = {}
    for kind, family, precision, compiled in training_plan(presets):
        if kind == "run":
            name = f"{family} {precision} {'compiled' if compiled else 'eager'}"
            runs[name] = training_item(
                part, name, compiled, lambda f=family, p=precision, c=compiled: throughput(part, presets[f], p, c)
            )
        else:
            name = f"{family} {precision}"
            largest[name] = training_item(
                part, name, False, lambda f=family, p=precision: largest_batch(part, presets[f], p)
            )
        bf16 = [r["samples_per_s"] for k, r in runs.items() if k.startswith("unet bf16") and "samples_per_s" in r]
        figures = {
            "unet_samples_per_s_bf16": max(bf16, default=None),
            "batch": part.sizes.batch or presets["unet"].batch,
        }
        part.save(runs=runs, largest_batch=largest, figures=figures)
        print(f"[training] {name}: {summary_line(runs.get(name) or largest[name])}", flush=True)
    print_training(runs, largest)


def training_item(part: Part, name: str, compiled: bool, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One config or search, within the part's budget (a compiled one only with ``compile_reserve_s`` left);
    its error is recorded and the next one runs."""
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
    if "samples_per_s" in r:
        mem = f", peak {r['peak_memory_gb']:.1f} GB" if r.get("peak_memory_gb") else ""
        return f"{r['samples_per_s']:.2f} samples/s ({r['step_ms']:.1f} ms/step, warm-up {r['warmup_s']:.1f} s{mem})"
    if "largest_batch" in r:
        return f"largest batch {r['largest_batch']} (first failure {r['first_failure']}, exact {r['exact']})"
    return str(r.get("skipped") or r.get("error"))


def print_training(runs: dict[str, Any], largest: dict[str, Any]) -> None:
    print(f"\n{'config':36} {'samples/s':>10} {'ms/step':>9} {'peak GB':>8} {'warm-up s':>9}")
    for k, r in runs.items():
        if "samples_per_s" in r:
            peak = r["peak_memory_gb"]
            print(
                f"{k:36} {r['samples_per_s']:>10.2f} {r['step_ms']:>9.1f} "
                f"{peak if peak is not None else float('nan'):>8.2f} {r['warmup_s']:>9.1f}"
            )
        else:
            print(f"{k:36} {summary_line(r)}")
    for k, r in largest.items():
        print(f"largest batch {k:22} {summary_line(r)}")


# --- part 3: neural field against SZ3 ----------------------------------------------------------------------
def synthetic_field(spec: FieldSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A smooth T850-like field (K), data (T, H, W) float32, latitude (H,) ascending, longitude (W,):
    a zonal climatology plus ``modes`` travelling waves cos(lat)^m cos(n lat + a) cos(m lon + b) of total
    wavenumber m + n (log-uniform in 1..max_wavenumber, amplitude ~ wavenumber^-1.5) whose amplitudes
    oscillate with periods of 5-60 days. Only uniform draws of numpy's PCG64 and float64 arithmetic, so
    every machine generates the same field (to float32 rounding)."""
    rng = np.random.default_rng(spec.seed)
    u = rng.random((8, spec.modes))  # every random number, in one draw
    lat = np.linspace(-90.0, 90.0, spec.n_lat)
    lon = np.arange(spec.n_lon) * (360.0 / spec.n_lon)
    phi, lam = np.deg2rad(lat), np.deg2rad(lon)
    total = np.floor(np.exp(u[0] * np.log(spec.max_wavenumber + 1))).clip(1, spec.max_wavenumber)
    m = np.floor(u[1] * (total + 1)).clip(0, total)  # zonal wavenumber
    amp = 6.0 * total**-1.5 * (0.5 + u[2])  # K
    g = np.cos(phi)[:, None] ** m * np.cos((total - m) * phi[:, None] + 2 * np.pi * u[3])  # (H, K)
    h = np.cos(m[:, None] * lam[None, :] + 2 * np.pi * u[4][:, None])  # (K, W)
    days = np.arange(spec.n_times)[:, None]
    a = amp * np.cos(2 * np.pi * days / (5 + 55 * u[5]) + 2 * np.pi * u[6])  # (T, K)
    clim = 260.0 + 25.0 * np.cos(phi) ** 2 + 5.0 * np.sin(phi)  # (H,)
    data = np.empty((spec.n_times, spec.n_lat, spec.n_lon), np.float32)
    for t in range(spec.n_times):
        data[t] = clim[:, None] + (g * a[t]) @ h
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

    def __init__(self, part: Part, data: np.ndarray, lat: np.ndarray, lon: np.ndarray):
        import torch

        from postcast.compression import field as nf

        s = part.sizes
        self.part, self.lat, self.lon, self.shape = part, lat, lon, data.shape
        self.cfg = nf.FieldConfig(
            width=s.width, depth=s.depth, batch_points=s.batch_points, lr=s.lr, weights="q6", entropy="lzma"
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


def pick_fourier_backend(fit: FieldFit) -> dict[str, Any]:
    """ms per training step with the Fourier layer in Triton and in PyTorch (a throwaway network); the
    faster one fits (on a CPU without the interpreter: PyTorch)."""
    import torch

    from postcast.models import kernels

    part, out = fit.part, {}
    usable = kernels.triton_available() and (part.dev.type == "cuda" or kernels.interpreting())
    for backend in ("triton", "torch") if usable else ("torch",):
        try:
            with kernels.use_backend(backend):
                net = fit.new_net()
                opt = torch.optim.Adam(net.parameters(), lr=fit.cfg.lr)
                out[f"{backend}_step_ms"] = 1e3 * timed(
                    part,
                    lambda net=net, opt=opt: fit.step(net, opt),
                    min(5, part.sizes.kernel_reps),
                    2.0,
                    max(1, part.sizes.kernel_warmup),
                )
        except Exception as err:
            part.error(f"fourier layer on {backend}", err)
    timings = {k.split("_")[0]: v for k, v in out.items()}
    return {**out, "backend": min(timings, key=timings.__getitem__) if timings else "torch"}


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


def part_compression(part: Part) -> None:
    import torch

    from postcast.models import kernels

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
    fit = FieldFit(part, data, lat, lon)
    probe = pick_fourier_backend(fit)
    seconds = min(part.sizes.fit_seconds, part.left() - (35 if part.dev.type == "cuda" else 2))  # the rest: 2 decodes
    with kernels.use_backend(probe["backend"]):
        net, info = fit_field(fit, seconds)
        part.save(fit={**info, "fourier": probe, "config": fit.cfg.to_dict(), "budget_s": part.sizes.fit_seconds})
        levers = {}
        for weights, entropy in (("q6", "lzma"), ("fp16", "none")):
            name = weights + ("+" + entropy if entropy != "none" else "")
            levers[name] = lever(fit, net, weights, entropy, ref)
            part.save(levers=levers)
    best = levers["q6+lzma"]
    part.res["figures"] = {
        "compression_ratio_at_sz3_error": best["ratio"],
        "neural_wrmse": best["wrmse"],
        "sz3_ratio_at_same_wrmse": best["sz3_ratio_at_same_wrmse"],
        "neural_over_sz3": best["neural_over_sz3"],
        "storage": "q6+lzma",
        "definition": (
            "compression_ratio_at_sz3_error is the neural field's own ratio (raw float32 bytes / "
            "artefact bytes, q6 per row + lzma) at its own cos-latitude weighted RMSE neural_wrmse (K); "
            "sz3_ratio_at_same_wrmse is the ratio SZ3 needs for that same weighted RMSE, log-log "
            "interpolated from benchmarks/gpu_sz3_reference.json (pysz on the CPU machine, same "
            "field; null outside its range); neural_over_sz3 = the first over the second "
            "(> 1: the network is smaller at equal error)"
        ),
    }
    part.save(levers=levers)
    print_compression(part, info, levers)


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


def print_compression(part: Part, info: dict[str, Any], levers: dict[str, Any]) -> None:
    print(
        f"\nneural field width {part.sizes.width} x {part.sizes.depth} blocks, {info['parameters']} parameters, "
        f"{info['steps']} steps in {info['seconds']:.0f} s on {part.dev.type}"
    )
    print(f"{'storage':10} {'ratio':>9} {'wRMSE K':>9} {'max abs K':>10} {'SZ3 ratio at same wRMSE':>24} {'x SZ3':>7}")
    for name, r in levers.items():
        sz3, rel = r["sz3_ratio_at_same_wrmse"], r["neural_over_sz3"]
        print(
            f"{name:10} {r['ratio']:>9.1f} {r['wrmse']:>9.4f} {r['max_abs']:>10.3f} {fmt(sz3):>24} {fmt(rel):>7}",
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
