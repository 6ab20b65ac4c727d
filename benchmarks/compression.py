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
relative test-CRPS increase.

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
    import yaml

    from postcast.compression.loader import CompressedDataModule, compress_split
    from postcast.datasets.datamodule import DataConfig, StoreDataModule
    from postcast.models.module import PostProcessor

    preset = yaml.safe_load(Path("configs/train/unet_t850.yaml").read_text())
    data = {**preset["data"]["cfg"], "store": a.store, "variables": tuple(preset["data"]["cfg"]["variables"])}
    cfg = DataConfig(**data)
    t0 = time.perf_counter()
    art = compress_split(cfg, FieldConfig(width=a.downstream_width, depth=a.depth, steps=a.downstream_steps,
                                          sigma=a.sigma))
    fit_s = time.perf_counter() - t0
    path = out / "unet_t850_train.pcnf"
    art.save(path)
    res: dict[str, Any] = {"ratio": art.ratio, "artefact_bytes": art.nbytes, "fit_s": fit_s,
                           "fields": len(art.header["variables"]), "errors": art.header["errors"]}
    for name, dm in (("original", StoreDataModule(cfg)), ("compressed", CompressedDataModule(cfg, str(path)))):
        L.seed_everything(0)
        model = PostProcessor(**preset["model"], in_channels=cfg.n_channels, grid=dm.grid,
                              target_channels=dm.target_channels, n_variables=len(cfg.input_variables))
        trainer = L.Trainer(max_epochs=a.epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=out / name)
        t0 = time.perf_counter()
        trainer.fit(model, dm)
        res[f"{name}_train_s"] = time.perf_counter() - t0
        res[f"{name}_test_crps"] = trainer.test(model, dm, verbose=False)[0]["test_crps"]
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
    p.add_argument("--skip-downstream", action="store_true")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/compression"))
    a = p.parse_args()
    a.store = require_store(a.store)
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
        print(f"\ndownstream (U-Net T850, {a.epochs} epochs): artefact {down['artefact_bytes']} bytes for "
              f"{down['fields']} fields, ratio {down['ratio']:.0f}x, fit {down['fit_s']:.0f} s; test CRPS original "
              f"{down['original_test_crps']:.4f} vs compressed {down['compressed_test_crps']:.4f} "
              f"({down['penalty_pct']:+.2f}%)")
    write_json(a.out / "compression.json", {"rows": rows, "ratio_vs_sz3": gains, "downstream": down,
                                            "args": {k: str(v) for k, v in vars(a).items()}})
    penalty = down.get("penalty_pct", float("nan"))
    print(f"RESULT ratio_vs_sz3_at_equal_wrmse={gain:.3f} downstream_crps_penalty_pct={penalty:.2f}")


if __name__ == "__main__":
    main()
