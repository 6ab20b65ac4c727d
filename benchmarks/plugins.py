"""Training plugins on the quickstart store: CRPS after a fixed number of steps and bytes per step.

Every plugin trains the same small U-Net (``configs/train/unet_t850.yaml`` with ``base_filters`` 8
instead of 32, ~31k parameters, so the whole script fits in ~10 minutes on 2 shared CPU cores) for
T850 on ``runs/quickstart/store.zarr`` (37 x 72, 128 training dates), with 2 gloo ranks, batch 4 per rank,
``--steps`` optimizer steps (default 48 = 3 epochs) from the same seed. The configuration is exactly
``postcast train fit -c configs/train/unet_t850.yaml -c configs/plugins/<plugin>.yaml`` (the Lightning
CLI, built in-process with ``run=False``; the two ranks are spawned once and run every plugin in
turn, each on a fresh gloo group over a FileStore).

* CRPS: mean Gaussian CRPS (K) of rank 0's model on the whole validation split after the last step.
* bytes/step: modelled bytes each rank sends per optimizer step (``postcast.models.plugins.comm``:
  ring all-reduce 2 (P - 1) / P B, all-gather (P - 1) b), averaged over the ranks.
* "within 5 %": CRPS <= 1.05 x the DDP baseline's (``configs/plugins/ddp.yaml``: DDP's dense
  all-reduce through the counted hook).

A second table: CRPS against sparsity (one-shot magnitude pruning of the initial weights to 50/75/90 %,
gradual cubic pruning over steps 0-40 to 50/75/90 %, 2:4 N:M masks from step 0), DDP communication.

On 2 CPU cores this shows convergence and communication volume, not speed; step times are
recorded but dominated by compute and process sharing.

    python benchmarks/plugins.py [--steps 48] [--base-filters 8] [--store runs/quickstart/store.zarr]

Last line: ``RESULT plugins_within_5pct_of_ddp=<n>/<total>``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from common import DEFAULT_STORE, require_store

from postcast.datasets.io import write_json

ROOT = Path(__file__).resolve().parents[1]
WORLD = 2
COMM_PLUGINS = ["topk", "oktopk", "powersgd", "wagma", "eager_solo", "eager_majority", "lion_cub"]
SPARSITY = {  # name -> callback entry for the sparsity table (runs under DDP)
    "magnitude_0.5": {"class_path": "postcast.models.plugins.MagnitudePruning", "init_args": {"sparsity": 0.5}},
    "magnitude_0.75": {"class_path": "postcast.models.plugins.MagnitudePruning", "init_args": {"sparsity": 0.75}},
    "magnitude_0.9": {"class_path": "postcast.models.plugins.MagnitudePruning", "init_args": {"sparsity": 0.9}},
    "cubic_0.5": {
        "class_path": "postcast.models.plugins.MagnitudePruning",
        "init_args": {"sparsity": 0.5, "schedule": "cubic", "end_step": 40, "every": 4},
    },
    "cubic_0.9": {
        "class_path": "postcast.models.plugins.MagnitudePruning",
        "init_args": {"sparsity": 0.9, "schedule": "cubic", "end_step": 40, "every": 4},
    },
}
FRAGMENT_SPARSITY = ["prune_magnitude", "sparsity_2to4"]  # the shipped fragments, counted in the RESULT


def val_crps(model: Any, dm: Any) -> float:
    """Mean Gaussian CRPS over every finite grid point of the validation split."""
    from postcast.models.kernels import crps_gaussian

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in dm.val_dataloader():
            mu, sigma = model(batch)
            ok = torch.isfinite(batch["y"])
            total += float(crps_gaussian(mu[ok], sigma[ok], batch["y"][ok]).sum())
            count += int(ok.sum())
    return total / count


def run_one(rank: int, configs: list[str], extra: list[str], out: Path) -> dict[str, Any]:
    from postcast.datasets.loaders.datamodule import StoreDataModule
    from postcast.models.module import PostProcessor
    from postcast.models.plugins import CommReport
    from postcast.models.plugins.sparsity import _MaskedTraining
    from postcast.pipeline.train import PostcastCLI

    args = [a for c in configs for a in ("-c", c)] + extra
    args += [
        "--trainer.callbacks+=postcast.models.plugins.CommReport",
        "--trainer.logger",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.default_root_dir",
        str(out),
    ]
    cli = PostcastCLI(PostProcessor, StoreDataModule, run=False, args=args, save_config_kwargs={"overwrite": True})
    start = time.perf_counter()
    cli.trainer.fit(cli.model, cli.datamodule)
    wall = time.perf_counter() - start
    report = next(c for c in cli.trainer.callbacks if isinstance(c, CommReport)).summary
    masks = [c for c in cli.trainer.callbacks if isinstance(c, _MaskedTraining)]
    res = {
        "steps": cli.trainer.global_step,
        "fit_s": wall,
        "bytes_per_step": report["bytes_per_step"],
        "n_parameters": report["n_parameters"],
        "sparsity": masks[0].sparsity() if masks else 0.0,
    }
    if rank == 0:
        res["crps"] = val_crps(cli.model, cli.datamodule)
    return res


def worker(rank: int, runs: list[tuple[str, list[str], list[str]]], tmp: str, results: Any) -> None:
    os.environ.update(
        {
            "LOCAL_RANK": str(rank),
            "RANK": str(rank),
            "NODE_RANK": "0",
            "WORLD_SIZE": str(WORLD),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "1",
            "PYTHONWARNINGS": "ignore",
        }
    )
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    for i, (name, configs, extra) in enumerate(runs):
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp}/store{i}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=300)
        )
        try:
            res = run_one(rank, configs, extra, Path(tmp) / name)
            results.put((name, rank, res))
        except BaseException:
            results.put((name, rank, {"error": traceback.format_exc()}))
            raise
        finally:
            dist.destroy_process_group()


def fragments(tmp: Path) -> list[tuple[str, list[str]]]:
    ddp = str(ROOT / "configs/plugins/ddp.yaml")
    out = [("ddp", [ddp])]
    out += [(p, [str(ROOT / f"configs/plugins/{p}.yaml")]) for p in COMM_PLUGINS]
    out += [(p, [ddp, str(ROOT / f"configs/plugins/{p}.yaml")]) for p in FRAGMENT_SPARSITY]
    for name, cb in SPARSITY.items():
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"trainer": {"callbacks": [cb]}}))
        out.append((name, [ddp, str(path)]))
    return out


def table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--base-filters", type=int, default=8)
    ap.add_argument("--store", default=str(DEFAULT_STORE))
    ap.add_argument("--only", nargs="*", help="run only these plugins (ddp is always run)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/plugins.json"))
    a = ap.parse_args()
    a.store = require_store(a.store)
    preset = str(ROOT / "configs/train/unet_t850.yaml")
    steps_per_epoch = 128 // (4 * WORLD)
    extra = [
        "--data.cfg.store",
        a.store,
        "--model.net",
        json.dumps({"base_filters": a.base_filters}),
        "--trainer.max_steps",
        str(a.steps),
        "--trainer.max_epochs",
        str(-(-a.steps // steps_per_epoch)),
        "--data.cfg.batch_size",
        "4",
        "--trainer.devices",
        str(WORLD),
    ]
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        todo = [(n, c) for n, c in fragments(Path(tmp)) if not a.only or n == "ddp" or n in a.only]
        runs = [(n, [preset, *c], extra) for n, c in todo]
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=worker, args=(r, runs, tmp, results)) for r in range(WORLD)]
        for p in procs:
            p.start()
        got: dict[str, dict[int, Any]] = {}
        try:
            while sum(len(v) for v in got.values()) < WORLD * len(runs):
                name, rank, res = results.get(timeout=900)
                if "error" in res:
                    raise SystemExit(f"{name} failed on rank {rank}:\n{res['error']}")
                got.setdefault(name, {})[rank] = res
                if len(got[name]) == WORLD:
                    print(f"{name}: done ({res['fit_s']:.1f} s)", flush=True)
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    base = got["ddp"][0]
    rows = []
    for name, _ in todo:
        r0 = got[name][0]
        rows.append(
            {
                "plugin": name,
                "crps": round(r0["crps"], 4),
                "crps_vs_ddp": round(r0["crps"] / base["crps"], 3),
                "bytes_per_step": round(r0["bytes_per_step"]),
                "bytes_vs_ddp": round(r0["bytes_per_step"] / base["bytes_per_step"], 3),
                "sparsity": round(r0["sparsity"], 3),
                "steps": r0["steps"],
                "fit_s": round(max(got[name][r]["fit_s"] for r in range(WORLD)), 1),
            }
        )
    counted = [r for r in rows if r["plugin"] in COMM_PLUGINS + FRAGMENT_SPARSITY]
    within = sum(r["crps_vs_ddp"] <= 1.05 for r in counted)
    comm_rows = [r for r in rows if r["plugin"] in ["ddp", *COMM_PLUGINS]]
    sparse_rows = [r for r in rows if r["plugin"] in ["ddp", *FRAGMENT_SPARSITY, *SPARSITY]]
    print(
        f"\nU-Net (base {a.base_filters}, {base['n_parameters']} parameters), T850, {WORLD} gloo ranks, "
        f"{a.steps} steps, batch 4 per rank; CRPS on the validation split (K)\n"
    )
    print(table(comm_rows, ["plugin", "crps", "crps_vs_ddp", "bytes_per_step", "bytes_vs_ddp", "steps", "fit_s"]))
    print("\nCRPS against sparsity (DDP communication)\n")
    print(table(sparse_rows, ["plugin", "sparsity", "crps", "crps_vs_ddp", "steps", "fit_s"]))
    write_json(
        a.out,
        {
            "config": {
                "steps": a.steps,
                "base_filters": a.base_filters,
                "world": WORLD,
                "store": a.store,
                "n_parameters": base["n_parameters"],
            },
            "rows": rows,
            "within_5pct": within,
            "counted": len(counted),
            "wall_s": time.perf_counter() - t_start,
        },
    )
    print(f"\nwall {time.perf_counter() - t_start:.0f} s; {a.out}")
    print(f"RESULT plugins_within_5pct_of_ddp={within}/{len(counted)}")


if __name__ == "__main__":
    main()
