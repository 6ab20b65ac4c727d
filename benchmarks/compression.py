"""Neural-field compression against SZ3 and ZFP on the same fields, and the downstream cost of
training a post-processor from the compressed data.

Part 1 (comparison): Z500 and T850 of the synthetic world's state (``oracle_mean_*``: the smooth,
large-scale part of the truth) at ``--resolution`` degrees over ``--dates`` init dates of 2016. The
neural compressor at several widths, SZ3 (pysz) at absolute bounds and ZFP (zfpy) by tolerance and by
rate; ratio (every byte of the artefact counted), cos-latitude weighted RMSE, MAE, max abs error,
PSNR, encode/decode MB/s; one plot of ratio against weighted RMSE per field.
``ratio_vs_sz3_at_equal_wrmse``: for each field, the best neural point at a ratio >= 100, divided by
SZ3's ratio at the same weighted RMSE (log-log interpolation between SZ3 settings); the smaller of the
two fields (NaN when no neural point reaches 100x inside SZ3's range).

Part 2 (downstream): the U-Net T850 preset trained for ``--epochs`` from the original store and
from one artefact of its training split (:class:`postcast.compression.loader.CompressedDataModule`;
validation and test on the original store), same seed; ``downstream_crps_penalty_pct`` is the
relative test-CRPS increase with the network-only artefact. Two error-bounded variants of the same
network (no refit: :meth:`Artefact.with_error_bounds`) show the other end of the trade-off:
``bounded_head`` bounds the target and the Gaussian head's fields (``--head-bounds``), ``bounded_all``
bounds every field at ``--relative-bound`` times its std; their ratios and penalties are extra keys.

    python benchmarks/compression.py                  # ~20 min on 2 CPU cores
    python benchmarks/compression.py --skip-downstream

Last line: ``RESULT ratio_vs_sz3_at_equal_wrmse=<x> downstream_crps_penalty_pct=<x>``.
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from common import DEFAULT_STORE, require_store

from postcast.compression import report
from postcast.compression.artefact import Artefact
from postcast.compression.field import FieldConfig, Fields, to_fields
from postcast.datasets.io import write_json
from postcast.datasets.synthetic import SynthConfig, truth_dataset

FIELDS = ("z500", "t850")


def comparison_fields(resolution: float, dates: int, target: str) -> Fields:
    cfg = SynthConfig(resolution=resolution, years=(2016, 2016), dates_per_year=dates)
    ds = truth_dataset(cfg)[[f"oracle_mean_{target}"]].isel(step=-1)
    return to_fields(ds.drop_vars([c for c in ds.coords if c not in ds.dims]).load())


def fitted(path: Path, fields: Fields, cfg: FieldConfig) -> Artefact | None:
    """An artefact of an earlier run with the same settings on the same fields (reruns skip the fit)."""
    if not path.exists():
        return None
    art = Artefact.load(path)
    same = art.config == cfg and art.raw_bytes == fields.data.nbytes
    return art if same else None


def compare_field(target: str, a: argparse.Namespace, out: Path) -> tuple[list[dict[str, Any]], float]:
    fields = comparison_fields(a.resolution, a.dates, target)
    std = float(fields.data.std())
    rows = []
    for width in a.widths:
        cfg = FieldConfig(width=width, depth=a.depth, steps=a.steps, sigma=a.sigma)
        path = out / f"{target}_w{width}.pcnf"
        art = fitted(path, fields, cfg)
        if art is None:
            art = Artefact.build(fields, cfg, progress=True)
            art.save(path)
        rows.append(report.neural_row(fields, art, f"w={width} d={a.depth}"))
    bounds = [f * std for f in (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)]
    rows += report.baseline_rows(fields, bounds, bounds[1::2], [0.5, 1.0, 2.0, 4.0])
    report.plot(rows, out / f"ratio_vs_wrmse_{target}.png", f"{target} ({fields.data.shape[1]} dates, "
                f"{a.resolution} deg)")
    best = float("nan")
    for r in rows:
        if r["codec"] == "neural" and r["ratio"] >= 100:
            gain = r["ratio"] / report.ratio_at_equal_error(rows, "sz3", r["wrmse"])
            best = gain if np.isnan(best) else max(best, gain)
    for r in rows:
        r["field"] = target
    return rows, best


def downstream(a: argparse.Namespace, out: Path) -> dict[str, Any]:
    import lightning as L

    from postcast.compression.loader import CompressedDataModule, compress_split, split_fields
    from postcast.datasets.loaders.datamodule import StoreDataModule
    from postcast.models.module import PostProcessor
    from postcast.pipeline.train import data_config, resolve

    args = ["-c", "configs/train/unet_t850.yaml", "--data.cfg.store", a.store]
    model_args, cfg = resolve(args)["model"], data_config(args)
    fields = to_fields(split_fields(cfg, "train"))
    fcfg = FieldConfig(width=a.downstream_width, depth=a.depth, steps=a.downstream_steps, sigma=a.sigma)
    path = out / "unet_t850_train.pcnf"
    art = fitted(path, fields, fcfg)
    if art is None:
        art = compress_split(cfg, fcfg)
        art.save(path)
    res: dict[str, Any] = {"ratio": art.ratio, "artefact_bytes": art.nbytes, "fit_s": art.header["fit_seconds"],
                           "fields": len(art.header["variables"]), "errors": art.header["errors"], "variants": {}}
    variants = {"original": ("store", None), "compressed": ("network only", path)}
    std = {v: float(fields.data[i].std()) for i, v in enumerate(fields.variables)}
    bounds = {"bounded_head": {v: b for v, b in a.head_bounds.items()},  # the head's fields and the target
              "bounded_all": {v: a.relative_bound * s for v, s in std.items()}}  # every field, rel. to its std
    for name, spec in bounds.items():
        bounded = art.with_error_bounds(fields, spec)
        bounded.save(out / f"unet_t850_train_{name}.pcnf")
        variants[name] = (", ".join(f"{v}<={b:.3g}" for v, b in spec.items()), out / f"unet_t850_train_{name}.pcnf")
        res["variants"][name] = {"ratio": bounded.ratio, "bytes": bounded.nbytes, "bounds": spec}
    for name, (what, src) in variants.items():
        dm = StoreDataModule(cfg) if src is None else CompressedDataModule(cfg, str(src))
        L.seed_everything(0)
        model = PostProcessor(**model_args, sample=cfg.sample.to_dict(), grid=dm.grid, n_members=dm.n_members)
        trainer = L.Trainer(max_epochs=a.epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=out / name)
        t0 = time.perf_counter()
        trainer.fit(model, dm)
        res[f"{name}_train_s"] = time.perf_counter() - t0
        res[f"{name}_test_crps"] = trainer.test(model, dm, verbose=False)[0]["test_crps"]
        res["variants"].setdefault(name, {"ratio": art.ratio if src else 1.0, "bytes": art.nbytes if src else None})
        res["variants"][name].update(what=what, test_crps=res[f"{name}_test_crps"],
                                     penalty_pct=100 * (res[f"{name}_test_crps"] / res["original_test_crps"] - 1))
    res["penalty_pct"] = 100 * (res["compressed_test_crps"] / res["original_test_crps"] - 1)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--resolution", type=float, default=2.0)
    p.add_argument("--dates", type=int, default=24, help="init dates of 2016")
    p.add_argument("--widths", type=int, nargs="+", default=[16, 24, 32])
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--sigma", type=float, default=1.6)
    p.add_argument("--store", default=str(DEFAULT_STORE))
    p.add_argument("--epochs", type=int, default=12, help="U-Net epochs (the preset's)")
    p.add_argument("--downstream-width", type=int, default=64)
    p.add_argument("--downstream-steps", type=int, default=3000)
    p.add_argument("--head-bounds", nargs="*", default=["truth_t850=0.25", "ens_mean_t=0.1", "ens_std_t=0.05"],
                   metavar="VAR=BOUND", help="downstream 'bounded_head' variant: SZ3 bounds (K) on these fields")
    p.add_argument("--relative-bound", type=float, default=0.01,
                   help="downstream 'bounded_all' variant: every field bounded at this fraction of its std")
    p.add_argument("--skip-downstream", action="store_true")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/compression"))
    a = p.parse_args()
    a.store = require_store(a.store)
    a.head_bounds = {k: float(v) for k, v in (b.split("=", 1) for b in a.head_bounds)}
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.WARNING)
    a.out.mkdir(parents=True, exist_ok=True)
    rows, gains = [], {}
    for target in FIELDS:
        r, gains[target] = compare_field(target, a, a.out)
        rows += r
        print(f"\n{target}\n{report.format_table(r)}", flush=True)
    gain = min(gains.values())
    down = {} if a.skip_downstream else downstream(a, a.out)
    if down:
        print(f"\ndownstream (U-Net T850, {a.epochs} epochs, {down['fields']} training fields; network fit "
              f"{down['fit_s']:.0f} s)\n{'variant':<14}{'ratio':>8}{'test CRPS':>11}{'penalty %':>11}  bounds")
        for name, v in down["variants"].items():
            print(f"{name:<14}{v['ratio']:>8.1f}{v['test_crps']:>11.4f}{v['penalty_pct']:>11.2f}  {v['what']}")
    write_json(a.out / "compression.json", {"rows": rows, "ratio_vs_sz3": gains, "downstream": down,
                                            "args": {k: str(v) for k, v in vars(a).items()}})
    var = down.get("variants", {})
    extra = "".join(f" {n}_ratio={v['ratio']:.1f} {n}_penalty_pct={v['penalty_pct']:.2f}"
                    for n, v in var.items() if n.startswith("bounded"))
    penalty = var.get("compressed", {}).get("penalty_pct", float("nan"))
    print(f"RESULT ratio_vs_sz3_at_equal_wrmse={gain:.3f} downstream_crps_penalty_pct={penalty:.2f}{extra}")


if __name__ == "__main__":
    main()
