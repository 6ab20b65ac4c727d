"""Ensemble CRPS speed: postcast's kernels against properscoring and scoringrules, same arrays.

Cases: N = 1e6 points x M = 10 members, and N = 2e5 x M = 50 (float64, standard normal members and
outcomes). Peers: properscoring ``crps_ensemble`` (standard estimator; numba gufunc when numba is
installed), scoringrules ``crps_ensemble`` with ``estimator="fair"`` and ``"nrg"`` (standard) on
its numba backend. Each timing is the best of ``--repeat`` runs after a warm-up (JIT compile).
Speedup = peer time / postcast time for the same estimator; every result is checked against the
peer's to 1e-10.

    python benchmarks/metrics.py

Last line: ``RESULT fair_speedup_min=<x> standard_speedup_min=<x>`` (smallest over peers and sizes).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import properscoring
import scoringrules

from postcast.pipeline import metrics


def best_of(fn: Callable[[], np.ndarray], repeat: int) -> tuple[float, np.ndarray]:
    fn()  # warm-up (numba compilation, caches)
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    assert out is not None
    return min(times), out


def run(n: int, m: int, repeat: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((n, m)), rng.standard_normal(n)
    res: dict[str, float] = {}
    t_fair, ours_fair = best_of(lambda: metrics.crps_ensemble(x, y, estimator="fair"), repeat)
    t_std, ours_std = best_of(lambda: metrics.crps_ensemble(x, y, estimator="standard"), repeat)
    t_np, _ = best_of(lambda: metrics.crps_ensemble(x, y, estimator="fair", engine="numpy"), repeat)
    peers = {
        "properscoring_standard": (lambda: properscoring.crps_ensemble(y, x), ours_std, t_std),
        "scoringrules_nrg": (lambda: scoringrules.crps_ensemble(y, x, estimator="nrg", backend="numba"),
                             ours_std, t_std),
        "scoringrules_fair": (lambda: scoringrules.crps_ensemble(y, x, estimator="fair", backend="numba"),
                              ours_fair, t_fair),
    }
    res.update({"postcast_fair_s": t_fair, "postcast_standard_s": t_std, "postcast_numpy_fair_s": t_np})
    for name, (fn, ours, t_ours) in peers.items():
        t_peer, out = best_of(fn, repeat)
        np.testing.assert_allclose(out, ours, rtol=1e-10, atol=1e-12)
        res[f"{name}_s"] = t_peer
        res[f"speedup_vs_{name}"] = t_peer / t_ours
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/metrics.json")
    args = ap.parse_args()
    cases = {"N=1e6,M=10": (1_000_000, 10), "N=2e5,M=50": (200_000, 50)}
    rows = {name: run(n, m, args.repeat) for name, (n, m) in cases.items()}
    cols = ["postcast_fair_s", "postcast_standard_s", "postcast_numpy_fair_s", "properscoring_standard_s",
            "scoringrules_nrg_s", "scoringrules_fair_s", "speedup_vs_properscoring_standard",
            "speedup_vs_scoringrules_nrg", "speedup_vs_scoringrules_fair"]
    print(f"{'case':<12}" + "".join(f"{c:>36}" for c in cols))
    for name, r in rows.items():
        print(f"{name:<12}" + "".join(f"{r[c]:>36.4f}" for c in cols))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")
    fair = min(r["speedup_vs_scoringrules_fair"] for r in rows.values())
    std = min(min(r["speedup_vs_properscoring_standard"], r["speedup_vs_scoringrules_nrg"]) for r in rows.values())
    print(f"RESULT fair_speedup_min={fair:.2f} standard_speedup_min={std:.2f}")


if __name__ == "__main__":
    main()
