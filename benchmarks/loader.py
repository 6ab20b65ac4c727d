"""Loader throughput on the training store over a simulated slow filesystem: a plain xarray +
DataLoader, xbatcher, postcast's direct loader, postcast's clairvoyant loader, and the raw-read
limit (the same chunks read with zarr into numpy).

Every case reads the training split of the same store (default ``runs/quickstart/store.zarr``, the quickstart
store: 5 deg grid) for ``--epochs`` shuffled epochs in batches of ``--batch-size`` through the same
zarr 3 store wrapper adding ``--latency-ms`` per read (``zarr.testing.store.LatencyStore``: an async
sleep before each ``get``, as on a network or parallel filesystem, so concurrent reads overlap).
A sample is one init date at +48 h for T850: the ensemble mean and std of 7 pressure-level
variables at 850 hPa, the truth and the oracle mean/std (17 arrays, one chunk each).

* ``xarray_dataloader``: ``xr.open_zarr`` (dask) and a Dataset whose ``__getitem__`` selects one
  date and ``.values`` each variable; torch ``DataLoader`` (shuffle, batch size B, no workers);
* ``xbatcher``: ``BatchGenerator`` over the same variables as one DataArray with
  ``batch_dims={init_time: B}`` (xbatcher builds whole batches: one dask compute per batch, its
  favourable setting) and ``xbatcher.loaders.torch.MapDataset`` in a ``DataLoader`` (batch order
  shuffled);
* ``postcast_direct``: ``StoreDataset`` (the normalised sample the models train on) in a shuffled
  ``DataLoader`` (``DataConfig.loader="plain"``);
* ``postcast_clairvoyant``: the same dataset behind ``clairvoyant_loader`` (stream replayed from the
  seed, ``--threads`` prefetch threads, each reading its next 8 samples' chunks in one round trip) with a
  RAM tier of the first ``--cache-fraction`` of the split (default 1.0: the cache holds the epoch);
  ``postcast_clairvoyant_<f>`` the same with each further fraction ``f`` (default 0.5: the cap is smaller
  than the split, as in training on a store larger than memory);
* ``raw_read``: for each batch in a shuffled order, the 17 arrays' chunks of its dates read with
  ``zarr`` into numpy (``get_orthogonal_selection``, arrays in a ``--raw-threads`` thread pool): no
  decoding into samples, no cache; each epoch reads everything again.

MB/s counts the decoded bytes of the chunks a sample needs (identical for every case). Ratios come
from one run on one machine. ``fraction_of_raw`` compares whole runs (all epochs; the clairvoyant
loader reads each sample from the store once and serves later epochs from RAM);
``cold_over_raw`` (also ``cold_fraction_of_raw``) compares the first epoch alone (everything from the
store). The headline figures are the first cache fraction's; ``*_cache_<f>`` keys give the others'.

    python benchmarks/loader.py                      # 3 epochs, 2 ms per read, caches of 1.0 and 0.5
    python benchmarks/loader.py --latency-ms 10 --epochs 5 --cache-fraction 0.5

Writes ``benchmarks/results/loader.json``; prints the cache each clairvoyant run was given and its RAM
hit rate, and last ``RESULT speedup_vs_xbatcher=<x> fraction_of_raw=<x> cold_over_raw=<x>``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import xarray as xr
import xbatcher
import zarr
from common import DEFAULT_STORE, require_store
from torch.utils.data import DataLoader, Dataset
from xbatcher.loaders.torch import MapDataset
from zarr.storage import LocalStore
from zarr.testing.store import LatencyStore

from postcast.datasets import contract, schema
from postcast.datasets.io import write_json
from postcast.datasets.loaders import prefetch
from postcast.datasets.loaders.datamodule import DataConfig, StoreDataset
from postcast.datasets.sample import SampleSpec

ROOT = Path(__file__).resolve().parents[1]
VARIABLES = ("t", "z", "q", "w", "d", "u", "v")
LEVEL = 850


def slow_store(path: str, latency_ms: float) -> LatencyStore:
    return LatencyStore(LocalStore(path, read_only=True), get_latency=latency_ms / 1e3)


def array_names() -> list[str]:
    return [f"ens_{k}_{v}" for v in VARIABLES for k in ("mean", "std")] + [
        "truth_t850",
        "oracle_mean_t850",
        "oracle_std_t850",
    ]


def train_rows(path: str) -> np.ndarray:
    g = zarr.open_group(path, mode="r")
    return np.flatnonzero(np.asarray(g["split"][:]) == contract.split_code("train"))


def open_lazy(path: str, latency_ms: float) -> xr.Dataset:
    """The sample's variables at +48 h and 850 hPa, lazily (dask) over the slow store."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_zarr(slow_store(path, latency_ms), zarr_format=3)
    sub = ds[array_names()].sel({schema.STEP: pd.Timedelta(hours=48)})
    return sub.sel({schema.LEVEL: LEVEL}).drop_vars([schema.LEVEL, "valid_time"], errors="ignore")


class XarraySamples(Dataset[torch.Tensor]):
    """The plain approach: one date per item from an ``xr.open_zarr`` dataset."""

    def __init__(self, ds: xr.Dataset, rows: np.ndarray):
        self.ds, self.rows = ds, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        day = self.ds.isel({schema.INIT_TIME: int(self.rows[i])})
        return torch.from_numpy(np.stack([day[v].values for v in array_names()]))  # (17, H, W)


def run_epochs(
    make_iter: Callable[[int], Iterable[Any]], epochs: int, count: Callable[[Any], int]
) -> tuple[float, list[float], int]:
    """(total seconds, seconds per epoch, samples) of iterating ``make_iter(epoch)`` per epoch."""
    per_epoch, samples = [], 0
    for e in range(epochs):
        t0 = time.perf_counter()
        for batch in make_iter(e):
            samples += count(batch)
        per_epoch.append(time.perf_counter() - t0)
    return sum(per_epoch), per_epoch, samples


def case_xarray(args: argparse.Namespace, rows: np.ndarray) -> tuple[float, list[float], int]:
    data = XarraySamples(open_lazy(args.store, args.latency_ms), rows)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    return run_epochs(lambda e: loader, args.epochs, len)


def case_xbatcher(args: argparse.Namespace, rows: np.ndarray) -> tuple[float, list[float], int]:
    ds = open_lazy(args.store, args.latency_ms).isel({schema.INIT_TIME: rows})
    da = ds.to_array("variable").transpose(schema.INIT_TIME, "variable", schema.LAT, schema.LON)
    gen = xbatcher.BatchGenerator(
        da,
        input_dims={
            "variable": da.sizes["variable"],
            schema.LAT: da.sizes[schema.LAT],
            schema.LON: da.sizes[schema.LON],
        },
        batch_dims={schema.INIT_TIME: args.batch_size},
    )
    loader = DataLoader(MapDataset(gen), batch_size=None, shuffle=True, generator=torch.Generator().manual_seed(0))
    return run_epochs(lambda e: loader, args.epochs, len)


def store_dataset(args: argparse.Namespace) -> StoreDataset:
    cfg = DataConfig(
        store=args.store, sample=SampleSpec(target="t850", variables=VARIABLES), batch_size=args.batch_size
    )
    return StoreDataset(cfg, "train", source=slow_store(args.store, args.latency_ms))


def case_direct(args: argparse.Namespace, rows: np.ndarray) -> tuple[float, list[float], int]:
    loader = DataLoader(
        store_dataset(args), batch_size=args.batch_size, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    return run_epochs(lambda e: loader, args.epochs, lambda b: len(b["fields"]))


def case_clairvoyant(args: argparse.Namespace, rows: np.ndarray, fraction: float) -> tuple[float, list[float], int]:
    base = store_dataset(args)
    spec = prefetch.StreamSpec(len(base), seed=0)
    slots = int(fraction * len(base))
    loader = prefetch.clairvoyant_loader(
        base,
        spec,
        batch_size=args.batch_size,
        sample_bytes=base.sample_nbytes(),
        ram_bytes=slots * base.sample_nbytes(),
        epochs=args.epochs,
        threads=args.threads,
        lookahead=4 * args.batch_size,
    )
    data = loader.dataset
    assert isinstance(data, prefetch.ClairvoyantDataset) and isinstance(loader.sampler, prefetch.ReplaySampler)
    sampler = loader.sampler

    def epoch(e: int) -> DataLoader[prefetch.Sample]:
        sampler.set_epoch(e)
        return loader

    out = run_epochs(epoch, args.epochs, lambda b: len(b["fields"]))
    data.close()
    stats = [st.summary(base.sample_nbytes()) for st in data.stats]
    accesses = sum(st["accesses"] for st in stats)
    CACHES[fraction] = {
        "cache_fraction": fraction,
        "cache_samples": data.plan.capacity[0],
        "split_samples": len(base),
        "cache_MB": round(data.plan.capacity[0] * base.sample_nbytes() / 1e6, 1),
        "hit_rate_ram": round(sum(st["hit_rate_ram"] * st["accesses"] for st in stats) / max(accesses, 1), 3),
        "epochs": stats,
    }
    return out


CACHES: dict[float, dict[str, Any]] = {}  # per cache fraction: what the clairvoyant run was given and hit


def case_raw(args: argparse.Namespace, rows: np.ndarray) -> tuple[float, list[float], int]:
    group = zarr.open_group(slow_store(args.store, args.latency_ms), mode="r")
    arrays = [group[n] for n in array_names()]
    pool = ThreadPoolExecutor(args.raw_threads)

    def batches(e: int) -> Iterable[int]:
        order = rows[np.random.default_rng(e).permutation(len(rows))]
        for lo in range(0, len(order), args.batch_size):
            sel = np.sort(order[lo : lo + args.batch_size])
            out = list(pool.map(lambda a, s=sel: a.get_orthogonal_selection((s,)), arrays))  # each (B, ...)
            yield sum(int(o.shape[0]) for o in out) // len(out)

    try:
        return run_epochs(batches, args.epochs, lambda n: n)
    finally:
        pool.shutdown()


def sample_mb(path: str) -> float:
    """Decoded MB of the chunks one sample needs."""
    g = zarr.open_group(path, mode="r")
    total = 0
    for n in array_names():
        a = g[n]
        total += int(np.prod(a.chunks)) * a.dtype.itemsize
    return total / 1e6


CASES = {
    "xarray_dataloader": case_xarray,
    "xbatcher": case_xbatcher,
    "postcast_direct": case_direct,
    "postcast_clairvoyant": case_clairvoyant,  # once per --cache-fraction
    "raw_read": case_raw,
}


def clairvoyant_name(fraction: float, first: bool) -> str:
    return "postcast_clairvoyant" if first else f"postcast_clairvoyant_{fraction:g}"


def runs(args: argparse.Namespace) -> list[tuple[str, Callable[..., tuple[float, list[float], int]], tuple[Any, ...]]]:
    """(result name, case, extra arguments) per run: the clairvoyant case once per cache fraction."""
    out: list[tuple[str, Callable[..., tuple[float, list[float], int]], tuple[Any, ...]]] = []
    for name in args.cases:
        if name != "postcast_clairvoyant":
            out.append((name, CASES[name], ()))
            continue
        for k, f in enumerate(args.cache_fraction):
            out.append((clairvoyant_name(f, k == 0), case_clairvoyant, (f,)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", default=str(DEFAULT_STORE))
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--latency-ms", type=float, default=2.0)
    p.add_argument("--threads", type=int, default=2, help="clairvoyant prefetch threads (2 cores: 2 was best of 2/4/8)")
    p.add_argument(
        "--cache-fraction",
        type=float,
        nargs="+",
        default=[1.0, 0.5],
        help="clairvoyant RAM tier, a fraction of the split: one run per value; the first gives the headline",
    )
    p.add_argument("--raw-threads", type=int, default=4, help="raw-read thread pool (4 was best of 2/4/8)")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "loader.json"))
    args = p.parse_args()
    args.store = require_store(args.store)
    torch.set_num_threads(1)
    rows = train_rows(args.store)
    mb = sample_mb(args.store)
    results: dict[str, dict[str, Any]] = {}
    for name, case, extra in runs(args):
        total, per_epoch, samples = case(args, rows, *extra)
        results[name] = {
            "seconds": round(total, 3),
            "epoch_s": [round(s, 3) for s in per_epoch],
            "samples": samples,
            "samples_per_s": round(samples / total, 1),
            "MB_per_s": round(samples * mb / total, 1),
            "cold_samples_per_s": round(len(rows) / per_epoch[0], 1),
        }
        print(f"{name}: {results[name]}", flush=True)
    cols = ["case", "samples", "seconds", "epoch_s", "samples_per_s", "MB_per_s", "cold_samples_per_s"]
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for name, r in results.items():
        print("| " + " | ".join([name] + [str(r[c]) for c in cols[1:]]) + " |")
    summary: dict[str, Any] = {}
    raw, xb = results.get("raw_read"), results.get("xbatcher")
    for k, f in enumerate(args.cache_fraction if "postcast_clairvoyant" in args.cases else []):
        cv, tail = results[clairvoyant_name(f, k == 0)], "" if k == 0 else f"_cache_{f:g}"
        if xb:
            summary["speedup_vs_xbatcher" + tail] = round(cv["samples_per_s"] / xb["samples_per_s"], 2)
        if raw:
            summary["fraction_of_raw" + tail] = round(cv["samples_per_s"] / raw["samples_per_s"], 2)
            cold = round(cv["cold_samples_per_s"] / raw["cold_samples_per_s"], 2)
            summary["cold_over_raw" + tail] = cold
            if k == 0:
                summary["cold_fraction_of_raw"] = cold  # the key earlier runs recorded
    write_json(
        args.out,
        {
            "config": {k: v for k, v in vars(args).items() if k != "out"},
            "sample_MB": mb,
            "train_samples": len(rows),
            "results": results,
            "summary": summary,
            "clairvoyant_caches": list(CACHES.values()),
        },
    )
    for k, (f, c) in enumerate(CACHES.items()):
        print(f"\n{clairvoyant_name(f, k == 0)} per epoch: {c['epochs']}")
    print(f"summary: {summary}")
    for k, (f, c) in enumerate(CACHES.items()):
        print(
            f"{clairvoyant_name(f, k == 0)}: cache {c['cache_samples']} of {c['split_samples']} samples "
            f"(--cache-fraction {f:g}, {c['cache_MB']} MB), RAM hit rate {c['hit_rate_ram']} over "
            f"{args.epochs} epochs (per epoch {[round(e['hit_rate_ram'], 3) for e in c['epochs']]})"
        )
    print(
        f"RESULT speedup_vs_xbatcher={summary.get('speedup_vs_xbatcher', float('nan'))} "
        f"fraction_of_raw={summary.get('fraction_of_raw', float('nan'))} "
        f"cold_over_raw={summary.get('cold_over_raw', float('nan'))}"
    )


if __name__ == "__main__":
    main()
