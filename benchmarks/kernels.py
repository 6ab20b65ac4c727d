"""Fused-kernel benchmark: time per kernel for eager PyTorch, ``torch.compile`` and (on a CUDA GPU)
the Triton kernels of :mod:`postcast.models.kernels`, at ENS-10's 0.5 deg grid (361 x 720).

Bandwidth: each kernel's *compulsory* bytes (every input read once, every output written once; for
kernels with a backward, the forward and backward together) divided by its time, as a fraction of
the device's measured copy bandwidth (a large ``clone``, read + write). Speedups are eager time over
the path's time, measured in the same run. On a CPU only the PyTorch paths run; the Triton kernels
are then covered by the interpreter tests (tests/test_kernels.py), not timed.

    python benchmarks/kernels.py              # all kernels
    python benchmarks/kernels.py --scale 0.25 # smaller fields (quick look)

Last line: ``RESULT device=<cpu|gpu name> min_bandwidth_fraction=<x or na> min_speedup_vs_eager=<x>``:
the smallest bandwidth fraction of the Triton kernels 1 and 2 (na without a GPU) and the smallest
speedup over eager of the fastest fused path (Triton on a GPU, ``torch.compile`` on a CPU) over all
kernels.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from postcast.datasets.io import write_json
from postcast.models import kernels

H, W = 361, 720
F32 = 4  # bytes


def timeit(fn: Callable[[], Any], reps: int, sync: Callable[[], None]) -> float:
    """Median seconds of ``reps`` calls after two warm-ups (compilation, caches)."""
    for _ in range(2):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(dev: torch.device, sync: Callable[[], None], reps: int) -> float:
    """Measured device copy bandwidth in bytes/s (read + write of a 256 MiB buffer)."""
    x = torch.empty(64 * 2**20, dtype=torch.float32, device=dev).uniform_()
    t = timeit(lambda: x.clone(), reps, sync)
    return 2 * x.numel() * F32 / t


def cases(dev: torch.device, scale: float) -> dict[str, tuple[Callable[[str], Any], float]]:
    """kernel -> (run(backend), compulsory bytes)."""
    g = torch.Generator(device=dev).manual_seed(0)
    pts = int(H * W * scale)

    def rnd(*shape: int, grad: bool = False) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=dev).requires_grad_(grad)

    members = rnd(1, 10, 8, pts)  # (B, M, V, points): one sample, 8 variables

    def standardise(backend: str) -> Any:
        with kernels.use_backend(backend):
            return kernels.ensemble_standardise(members)

    n = 4 * pts  # a batch of four fields
    mu, y = rnd(n, grad=True), rnd(n)
    sigma = (torch.rand(n, generator=g, device=dev) + 0.5).requires_grad_()

    def crps_gauss(backend: str) -> Any:
        with kernels.use_backend(backend):
            kernels.crps_gaussian(mu, sigma, y).sum().backward()

    ens, obs = rnd(n // 4, 10), rnd(n // 4)

    def crps_ens(backend: str) -> Any:
        with kernels.use_backend(backend):
            return kernels.crps_ensemble(ens, obs, True)

    values, weights = rnd(8, 3, pts, grad=True), rnd(8, 3, pts, grad=True)  # (2B, E, points)

    def topk(backend: str) -> Any:
        with kernels.use_backend(backend):
            kernels.topk_route(values, weights, 1, weighted=True).sum().backward()

    coords, bmat = torch.rand(pts, 4, generator=g, device=dev), rnd(4, 64)
    weight, bias = (rnd(128, 128) / 8).requires_grad_(), rnd(128)

    def fourier(backend: str) -> Any:
        with kernels.use_backend(backend), torch.no_grad():  # decoding: forward only
            return kernels.fourier_layer(coords, bmat, weight, bias)

    return {
        "1 ensemble_standardise": (standardise, F32 * members.numel() * (2 + 2 / 10)),
        "2 crps_gaussian fwd+bwd": (crps_gauss, F32 * n * 6),  # read mu, sigma, y; write 3 gradients
        "3 crps_ensemble fair": (crps_ens, F32 * (n // 4) * 12),
        "4 smoe topk_route fwd+bwd": (topk, F32 * 8 * pts * (2 * 3 + 2 + 2 * 3)),
        "5 fourier_layer decode": (fourier, F32 * pts * (4 + 128)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=1.0, help="fraction of the 0.5 deg field size")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile path")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/kernels.json"))
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    gpu = torch.cuda.is_available()
    dev = torch.device("cuda" if gpu else "cpu")
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    name = torch.cuda.get_device_name() if gpu else "cpu"
    bw = copy_bandwidth(dev, sync, a.reps)
    paths = ["torch"] + ([] if a.no_compile else ["compile"])
    paths += ["triton"] if gpu and kernels.triton_available() else []
    rows = []
    for kernel, (run, nbytes) in cases(dev, a.scale).items():
        row: dict[str, Any] = {"kernel": kernel, "bytes": nbytes}
        for path in paths:
            t = timeit(lambda run=run, path=path: run(path), a.reps, sync)
            row[f"{path}_ms"] = 1e3 * t
            row[f"{path}_bw_fraction"] = nbytes / t / bw
        for path in paths[1:]:
            row[f"{path}_speedup"] = row["torch_ms"] / row[f"{path}_ms"]
        rows.append(row)
        print(f"timed {kernel}", flush=True)
    print(f"\ndevice: {name}, measured copy bandwidth {bw / 1e9:.1f} GB/s, field {int(H * W * a.scale)} points")
    head = f"{'kernel':28} {'MB':>7}" + "".join(f" {p + ' ms':>11} {p + ' %bw':>11}" for p in paths)
    head += "".join(f" {p + ' x eager':>15}" for p in paths[1:])
    print(head)
    for r in rows:
        line = f"{r['kernel']:28} {r['bytes'] / 1e6:>7.1f}"
        line += "".join(f" {r[f'{p}_ms']:>11.2f} {100 * r[f'{p}_bw_fraction']:>10.1f}%" for p in paths)
        line += "".join(f" {r[f'{p}_speedup']:>15.2f}" for p in paths[1:])
        print(line)
    fused = "triton" if "triton" in paths else ("compile" if "compile" in paths else None)
    min_speedup = min(r[f"{fused}_speedup"] for r in rows) if fused else float("nan")
    frac = "na"
    if "triton" in paths:
        frac = f"{min(r['triton_bw_fraction'] for r in rows if r['kernel'][0] in '12'):.3f}"
    write_json(a.out, {"device": name, "copy_bandwidth_Bps": bw, "scale": a.scale, "paths": paths, "rows": rows})
    device = name.replace(" ", "_")
    print(f"RESULT device={device} min_bandwidth_fraction={frac} min_speedup_vs_eager={min_speedup:.3f}")


if __name__ == "__main__":
    main()
