"""The skill benchmark's seeds trained as one fused array (models/fused.py; Horizontally Fused Training Array,
Wang et al., MLSys 2021) against the same seeds trained one after another: same preset, same batches (read
from the store once, held in memory), same number of Adam steps; the figure is the wall-time ratio.

Both sides run torch's Adam update without weight decay (``FusedAdam`` is Adam; the presets' AdamW decay is
left out of both). The members start from the seeds' own initialisations (``torch.manual_seed(seed)`` before
each network is built, as ``postcast train --seed_everything`` does), and after training every member's
predictions (training mode) are compared with its sequential twin's (``max_abs_difference``, physical units):
the two are the same training, so this is float round-off.

    python benchmarks/fused_seeds.py --store runs/targets/store.zarr --target t2m --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path
from typing import Any

import torch
from common import ROOT

from postcast.datasets.loaders.datamodule import StoreDataModule, StoreDataset
from postcast.models.fused import FusedAdam, FusedArray
from postcast.models.losses import distribution_head
from postcast.models.module import PostProcessor
from postcast.pipeline.train import data_config, resolve

Batch = dict[str, torch.Tensor]


def build(model: str, target: str, store: str, seeds: list[int]) -> tuple[list[PostProcessor], list[Batch], float]:
    """One PostProcessor per seed, normalised with the store's statistics, the preset's first training
    batches (``batches`` x batch_size dates, in the store's order) and the preset's learning rate."""
    args = ["-c", str(ROOT / f"configs/train/{model}_{target}.yaml"), "--data.cfg.store", store]
    options, cfg = resolve(args)["model"], data_config(args)
    dm = StoreDataModule(cfg)
    mean, std = (torch.from_numpy(v) for v in dm.normalisation())
    nets = []
    for seed in seeds:
        torch.manual_seed(seed)
        net = PostProcessor(**options, sample=cfg.sample.to_dict(), grid=dm.grid, n_members=dm.n_members)
        net.set_normalisation(mean, std)
        nets.append(net.train())
    data = StoreDataset(cfg, "train")
    n, b = len(data), cfg.batch_size
    batches = [collate([data[i] for i in range(s, min(s + b, n))]) for s in range(0, n, b)]
    return nets, batches, float(options["lr"])


def collate(samples: list[Batch]) -> Batch:
    return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


def member_loss(outs: Any, batch: Batch, family: str) -> torch.Tensor:
    """Each member's mean CRPS over the finite truths: (S,) from raw outputs (S, B, H, W) each."""
    ok = torch.isfinite(batch["y"])  # (B, H, W)
    y = torch.where(ok, batch["y"], batch["m"])  # (B, H, W): no NaN into the gradients
    crps = distribution_head(outs, batch["m"], batch["s"], family).crps(y)  # (S, B, H, W)
    return (crps * ok).sum(dim=(-3, -2, -1)) / ok.sum()


def sequential(nets: list[PostProcessor], batches: list[Batch], lr: float, family: str) -> float:
    t0 = time.perf_counter()
    for net in nets:
        opt = torch.optim.Adam(net.net.parameters(), lr=lr)
        for batch in batches:
            x = net.normalise(batch)
            opt.zero_grad()
            outs = [o.unsqueeze(0) for o in net.net(x)]  # (1, B, H, W) each
            member_loss(outs, batch, family).sum().backward()
            opt.step()
    return time.perf_counter() - t0


def fused(array: FusedArray, norm: PostProcessor, batches: list[Batch], lr: float, family: str) -> float:
    opt = FusedAdam(array, [lr] * array.size)
    t0 = time.perf_counter()
    for batch in batches:
        x = norm.normalise(batch)  # the members share the store's statistics
        opt.zero_grad()
        member_loss(array(x), batch, family).sum().backward()  # (S,): each member's gradient is its own loss's
        opt.step()
    return time.perf_counter() - t0


@torch.no_grad()
def largest_difference(array: FusedArray, nets: list[PostProcessor], batch: Batch, family: str) -> float:
    """The largest |difference| of the predictive parameters, fused member s against sequential s, in training
    mode (BatchNorm on the batch) on copies. Not in eval mode: a convolution's bias before a BatchNorm has a
    gradient of round-off alone, which Adam scales to steps of the learning rate in either run; the batch's
    statistics cancel it, the running ones (early in training) do not (U-Net T2m after 16 steps: 4.0 K apart in
    eval mode)."""
    array, nets = copy.deepcopy(array).train(), [copy.deepcopy(n).train() for n in nets]
    x = nets[0].normalise(batch)
    outs = array(x)  # (S, B, H, W) each
    worst = 0.0
    for s, net in enumerate(nets):
        mine = distribution_head([o[s] for o in outs], batch["m"], batch["s"], family).params
        theirs = distribution_head(net.net(x), batch["m"], batch["s"], family).params
        worst = max(worst, *(float((mine[k] - theirs[k]).abs().max()) for k in mine))
    return worst


def measure(model: str, target: str, store: str, seeds: list[int], steps: int) -> dict[str, Any]:
    """Sequential and fused training of ``seeds`` on the first ``steps`` training batches (0: one epoch)."""
    nets, batches, lr = build(model, target, store, seeds)
    batches = batches[:steps] if steps else batches
    family = nets[0].meta.family
    array = FusedArray([n.net for n in nets]).train()  # copies of the untrained members
    t_seq = sequential(nets, batches, lr, family)
    t_fused = fused(array, nets[0], batches, lr, family)
    return {
        "model": model,
        "target": target,
        "seeds": seeds,
        "steps": len(batches),
        "batch_size": int(batches[0]["y"].shape[0]),
        "sequential_s": t_seq,
        "fused_s": t_fused,
        "speedup": t_seq / t_fused,
        "max_abs_difference": largest_difference(array, nets, batches[0], family),
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", required=True)
    p.add_argument("--model", default="unet")
    p.add_argument("--target", default="t2m")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=0, help="training batches (0: one epoch)")
    a = p.parse_args()
    if not Path(a.store).exists():
        raise SystemExit(f"{a.store}: no such store; give --store a training store")
    r = measure(a.model, a.target, a.store, a.seeds, a.steps)
    print(r)
    print(f"RESULT fused_seeds_speedup={r['speedup']:.3g}")


if __name__ == "__main__":
    main()
