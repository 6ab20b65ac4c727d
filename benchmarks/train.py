"""Training throughput of every post-processor: samples (init-date fields) per second through a real
Lightning ``Trainer`` (forward, Gaussian CRPS, backward, AdamW step), at the embedded default grid
(5 deg, 37 x 72) and at ENS-10's 0.5 deg (361 x 720).

Each model is built from its T850 preset (``configs/train/<model>_t850.yaml``: architecture, input
variables, members) exactly as ``postcast train`` builds it; the batches are random tensors of the
shapes the data module yields for that preset, so the figure is compute only (the loader has its own
benchmark). Batch size is the preset's at 5 deg and 1 at 0.5 deg. The first ``--warmup`` steps are
not timed.

    python benchmarks/train.py                     # all models, both grids
    python benchmarks/train.py --models unet --grids 0.5

Last line: ``RESULT <model>_<grid>=<samples/s> ...`` for every model and grid.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from postcast.datasets.io import write_json
from postcast.datasets.loaders.datamodule import DataConfig
from postcast.models import registry
from postcast.models.module import PostProcessor
from postcast.pipeline.train import data_config, resolve

MODELS = list(registry.architectures())

GRIDS = {"5": (37, 72), "0.5": (361, 720)}
N_MEMBERS = 10


class RandomSamples(Dataset[dict[str, torch.Tensor]]):
    """``n`` random samples shaped like the data module's for ``cfg`` on ``grid``."""

    def __init__(self, cfg: DataConfig, grid: tuple[int, int], n: int):
        g = torch.Generator().manual_seed(0)
        h, w = grid
        spec = cfg.sample
        self.sample = {
            "fields": torch.randn(spec.n_fields, h, w, generator=g),  # (2V, H, W) (model statistics 0/1)
            "features": torch.randn(spec.n_features, h, w, generator=g),  # (F, H, W)
            "y": torch.randn(h, w, generator=g),  # (H, W) truth
            "m": torch.randn(h, w, generator=g),  # (H, W) raw ensemble mean
            "s": torch.rand(h, w, generator=g) + 0.5,  # (H, W) raw ensemble std > 0
        }
        if spec.members:
            self.sample["members"] = torch.randn(N_MEMBERS, len(spec.input_variables), h, w, generator=g)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.sample


class StepTimer(L.Callback):
    """Wall time of the training steps after the first ``warmup``."""

    def __init__(self, warmup: int):
        self.warmup, self.t0, self.seconds, self.steps = warmup, 0.0, 0.0, 0

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step > self.warmup:
            self.seconds += time.perf_counter() - self.t0
            self.steps += 1


def preset(model: str) -> tuple[dict[str, Any], DataConfig]:
    """The model section and data config of ``configs/train/<model>_t850.yaml`` as training resolves them."""
    args = ["-c", f"configs/train/{model}_t850.yaml"]
    return resolve(args)["model"], data_config(args)


def measure(model: str, grid_name: str, steps: int, warmup: int) -> dict[str, Any]:
    hparams, cfg = preset(model)
    grid = GRIDS[grid_name]
    batch = cfg.batch_size if grid_name == "5" else 1
    net = PostProcessor(**hparams, sample=cfg.sample.to_dict(), grid=grid, n_members=N_MEMBERS)
    timer = StepTimer(warmup)
    trainer = L.Trainer(
        max_steps=warmup + steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
        accelerator="auto",
        devices=1,
    )
    loader = DataLoader(RandomSamples(cfg, grid, (warmup + steps) * batch), batch_size=batch)
    trainer.fit(net, loader)
    rate = timer.steps * batch / timer.seconds
    params = sum(p.numel() for p in net.parameters())
    return {
        "model": model,
        "grid": f"{grid[0]}x{grid[1]}",
        "batch": batch,
        "steps": timer.steps,
        "samples_per_s": rate,
        "points_per_s": rate * grid[0] * grid[1],
        "parameters": params,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--grids", nargs="+", default=list(GRIDS), choices=list(GRIDS))
    p.add_argument("--steps", type=int, default=10, help="timed steps per model and grid")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/train.json"))
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    rows = []
    for grid_name in a.grids:
        for model in a.models:
            steps = a.steps if grid_name == "5" else max(2, a.steps // 4)
            rows.append(measure(model, grid_name, steps, a.warmup))
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu x{torch.get_num_threads()} threads"
    print(f"\ntraining throughput on {dev}")
    print(f"{'model':12} {'grid':>8} {'batch':>5} {'params':>9} {'samples/s':>10} {'points/s':>12}")
    for r in rows:
        print(
            f"{r['model']:12} {r['grid']:>8} {r['batch']:>5} {r['parameters']:>9} {r['samples_per_s']:>10.2f} "
            f"{r['points_per_s']:>12.3g}"
        )
    write_json(a.out, {"device": dev, "rows": rows})
    grid_key = {"37x72": "5deg", "361x720": "0.5deg"}
    print("RESULT " + " ".join(f"{r['model']}_{grid_key[r['grid']]}={r['samples_per_s']:.3g}" for r in rows))


if __name__ == "__main__":
    main()
