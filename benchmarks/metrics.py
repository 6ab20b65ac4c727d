"""Ensemble CRPS speed: postcast's block kernels against every peer, per core and with all threads.

Cases: N = 1e6 points x M = 10 members and N = 2e5 x M = 50 (float64, standard normal members and
outcomes, the same unsorted (N, M) arrays for everyone). Peers: properscoring ``crps_ensemble``
(standard estimator, numba gufunc), scoringrules ``crps_ensemble`` with ``estimator=`` "fair",
"nrg", "pwm", "qd" and "int" (numba backend), xskillscore ``crps_ensemble`` (properscoring under
xarray). Which estimator each peer computes is checked against postcast's fair and standard
values (to 1e-10) and each peer is compared with postcast's timing for that estimator. A separate
row times postcast's O(M) pass on pre-sorted members against scoringrules with
``sorted_ensemble=True``. The machine's copy bandwidth (``np.copyto`` of the members into a
preallocated array) is timed in the same interleaved rounds; each kernel's fraction = (bytes it
must move: members + outcomes + outputs) / time / copy bandwidth.

Two phases, each in its own process so the thread settings hold from import: ``per-core`` (every
library on one thread: NUMBA_NUM_THREADS=1, OMP/MKL/OPENBLAS_NUM_THREADS=1) and ``all-threads``.
Timings are the best of ``--repeat`` rounds, every kernel run once per round, interleaved, after
a warm-up (JIT compile), so a busy machine slows peers and postcast alike.

    python benchmarks/metrics.py

Last line (per core, smallest speedup over peers and sizes against the fastest peer per
estimator): ``RESULT fair_speedup_min=<x> standard_speedup_min=<x> bandwidth_fraction_m10=<x>``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

CASES = {"N=1e6,M=10": (1_000_000, 10), "N=2e5,M=50": (200_000, 50)}
THREAD_VARS = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
SR_ESTIMATORS = ("fair", "nrg", "pwm", "qd", "int")


def kernels(x: np.ndarray, y: np.ndarray) -> dict[str, Callable[[], np.ndarray]]:
    """Every timed callable on the same unsorted (N, M) members x and outcomes y."""
    import properscoring
    import scoringrules
    import xarray as xr
    import xskillscore

    from postcast.pipeline.verify import scores

    obs, fct = xr.DataArray(y, dims=["p"]), xr.DataArray(x, dims=["p", "member"])
    xs = np.sort(x, axis=1)
    out: dict[str, Callable[[], np.ndarray]] = {
        "postcast_fair": lambda: scores.crps_ensemble(x, y, estimator="fair"),
        "postcast_standard": lambda: scores.crps_ensemble(x, y, estimator="standard"),
        "postcast_block_kernel": lambda: scores.crps_ensemble_pair(x, y, kernel="block")[0],
        "postcast_numpy_fair": lambda: scores.crps_ensemble(x, y, estimator="fair", engine="numpy"),
        "properscoring": lambda: properscoring.crps_ensemble(y, x),
        "xskillscore": lambda: xskillscore.crps_ensemble(obs, fct, dim=[]).values,
        "presorted_postcast": lambda: scores.crps_ensemble_pair(xs, y, presorted=True)[0],
        "presorted_scoringrules_pwm": lambda: scoringrules.crps_ensemble(
            y, xs, estimator="pwm", sorted_ensemble=True, backend="numba"
        ),
    }

    def peer(estimator: str) -> Callable[[], np.ndarray]:
        return lambda: scoringrules.crps_ensemble(y, x, estimator=estimator, backend="numba")

    out.update({f"scoringrules_{e}": peer(e) for e in SR_ESTIMATORS})
    return out


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_case(n: int, m: int, repeat: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((n, m)), rng.standard_normal(n)
    fns: dict[str, Callable[[], Any]] = dict(kernels(x, y))
    dst = np.empty_like(x)
    fns["copy"] = lambda: np.copyto(dst, x)  # the bandwidth reference, timed in the same rounds
    results = {name: fn() for name, fn in fns.items()}  # warm-up (JIT) and the values checked below
    del results["copy"]
    times: dict[str, float] = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):  # interleaved rounds
        for name, fn in fns.items():
            times[name] = min(times[name], _timed(fn))
    fair, std = results["postcast_fair"], results["postcast_standard"]
    estimator = {}
    for name, val in results.items():
        if name.startswith(("postcast_", "presorted_postcast")):
            np.testing.assert_allclose(val, std if name == "postcast_standard" else fair, rtol=1e-10, atol=1e-12)
            continue
        is_fair = np.allclose(val, fair, rtol=1e-10, atol=1e-12)
        assert is_fair or np.allclose(val, std, rtol=1e-10, atol=1e-12), f"{name} computes neither estimator"
        estimator[name] = "fair" if is_fair else "standard"
    bw = 2 * x.nbytes / times.pop("copy")  # bytes read + written per second by np.copyto
    moved = x.nbytes + y.nbytes + 2 * y.nbytes  # members + outcomes + (fair, standard) written
    return {
        "times_s": times,
        "estimator": estimator,
        "copy_bandwidth_GBs": bw / 1e9,
        "bandwidth_fraction": {
            k: moved / t / bw for k, t in times.items() if k.startswith(("postcast", "presorted_p"))
        },
    }


def speedups(case: dict[str, Any]) -> dict[str, float]:
    """Per estimator: fastest peer's time / postcast's time for that estimator."""
    times: dict[str, float] = case["times_s"]
    est: dict[str, str] = case["estimator"]
    out = {}
    for e in ("fair", "standard"):
        peers = [times[p] for p, pe in est.items() if pe == e and not p.startswith("presorted")]
        out[e] = min(peers) / times[f"postcast_{e}"]
    out["presorted"] = times["presorted_scoringrules_pwm"] / times["presorted_postcast"]
    return out


def phase(repeat: int) -> dict[str, Any]:
    return {name: run_case(n, m, repeat) for name, (n, m) in CASES.items()}


def spawn(mode: str, repeat: int) -> dict[str, Any]:
    env = dict(os.environ)
    if mode == "per-core":
        env.update(dict.fromkeys(THREAD_VARS, "1"))
    else:
        for v in THREAD_VARS:
            env.pop(v, None)
    proc = subprocess.run(
        [sys.executable, __file__, "--phase", "--repeat", str(repeat)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(mode: str, rows: dict[str, dict[str, Any]]) -> None:
    names = list(next(iter(rows.values()))["times_s"])
    print(
        f"\n{mode} ({os.cpu_count()} cores on this machine; threads: "
        f"{'1' if mode == 'per-core' else 'all'}): best time in ms"
    )
    print(f"{'kernel':<28}{'estimator':>10}" + "".join(f"{c:>14}" for c in rows))
    for k in names:
        known: dict[str, str] = rows[next(iter(rows))]["estimator"]
        est = known.get(k) or ("standard" if k == "postcast_standard" else "fair")
        print(f"{k:<28}{est:>10}" + "".join(f"{1e3 * r['times_s'][k]:>14.2f}" for r in rows.values()))
    for c, r in rows.items():
        s = speedups(r)
        frac = r["bandwidth_fraction"]
        print(
            f"{c}: copy bandwidth {r['copy_bandwidth_GBs']:.2f} GB/s; speedup vs fastest peer fair "
            f"{s['fair']:.2f}x, standard {s['standard']:.2f}x, presorted vs scoringrules sorted "
            f"{s['presorted']:.2f}x; bandwidth fraction postcast_fair {frac['postcast_fair']:.2f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", default="benchmarks/results/metrics.json")
    ap.add_argument("--phase", action="store_true", help=argparse.SUPPRESS)  # child process: one phase as JSON
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(phase(args.repeat)))
        return
    res = {mode: spawn(mode, args.repeat) for mode in ("per-core", "all-threads")}
    for mode, rows in res.items():
        table(mode, rows)
    core = {c: speedups(r) for c, r in res["per-core"].items()}
    res["speedups_per_core"] = core
    res["speedups_all_threads"] = {c: speedups(r) for c, r in res["all-threads"].items()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    frac = res["per-core"]["N=1e6,M=10"]["bandwidth_fraction"]["postcast_fair"]
    print(
        f"RESULT fair_speedup_min={min(s['fair'] for s in core.values()):.2f} "
        f"standard_speedup_min={min(s['standard'] for s in core.values()):.2f} bandwidth_fraction_m10={frac:.2f}"
    )


if __name__ == "__main__":
    main()
