"""Neural-field compression against SZ3, ZFP and EBCC on the same fields, the levers that move the
network's ratio, and the downstream cost of training a post-processor from compressed data.

Part 1 (comparison, item 1 of issue 19): Z500 and T850 of the synthetic world's state
(``oracle_mean_*``: the smooth, large-scale part of the truth) at ``--resolution`` degrees (1 by
default) over ``--dates`` init dates of 2016, picked evenly from ENS-10's 105 (26: one a fortnight).
The network is fitted once per width in fp32; every storage lever is the same network stored another
way (errors always measured after the cast): fp16, fp16 + lzma, per-row q8/q6/q4 + lzma. The hybrid
``neural+sz3`` adds an SZ3 residual at a relative bound (the error-bounded mode) to one lever.
SZ3 (pysz) and EBCC (numcodecs-wasm-ebcc) at absolute bounds, ZFP (zfpy) by tolerance and by rate.
Every row: ratio (every byte counted), cos-latitude weighted RMSE, MAE, max abs error, PSNR, encode
seconds per GB (for the network: the fit), decode MB/s.
``ratio_vs_sz3_at_equal_wrmse`` (``..._maxerr``): per field, the best neural point with a ratio in
[100, 1000] divided by SZ3's ratio at the same weighted RMSE (max abs error), log-log interpolated
between SZ3 settings; the smaller of the two fields (NaN: no neural point in that range within SZ3's).
``ratio_vs_ebcc_at_equal_wrmse`` (an extra key): the same against EBCC.
A steps sweep at one width shows what a longer fit buys.

Part 2 (downstream, item 3): the U-Net T850 preset trained for ``--epochs`` from (a) the store,
(b) the compressed loader over a network of its training fields (network only, at each
``--down-widths``; and network + SZ3 residual at each ``--down-bounds``), (c) the same loader over
SZ3-compressed fields (:class:`postcast.compression.loader.SZ3Split`) at each ``--sz3-bounds``.
One rule for both codecs' error bounds: each field at r x its std. Validation and test on the
original store, same seed. ``downstream_ratio_at_2pct``: the largest neural ratio whose test-CRPS
penalty stays below 2 %; ``downstream_ratio_vs_sz3_loader``: that over SZ3's largest such ratio.

Reruns skip finished work (fitted networks, artefacts and trained variants are cached under --out).

    python benchmarks/compression.py                       # ~60 min on 2 CPU cores
    python benchmarks/compression.py --skip-downstream

Last line: ``RESULT ratio_vs_sz3_at_equal_wrmse=<x> ratio_vs_sz3_at_equal_maxerr=<x>
downstream_ratio_at_2pct=<x> downstream_ratio_vs_sz3_loader=<x>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import DEFAULT_STORE, require_store

from postcast.compression import baselines, report
from postcast.compression.artefact import Artefact
from postcast.compression.field import FieldConfig, FieldNet, Fields, to_fields, train_network
from postcast.datasets.io import write_json
from postcast.datasets.synth.synthetic import SynthConfig, truth_dataset

FIELDS = ("z500", "t850")
LEVERS = (("fp16", "none"), ("fp16", "lzma"), ("q8", "lzma"), ("q6", "lzma"), ("q4", "lzma"))
Net = tuple[FieldNet, np.ndarray, np.ndarray, float]  # network (fp32), mean, std, fit seconds


def comparison_fields(resolution: float, dates: int, target: str) -> Fields:
    cfg = SynthConfig(resolution=resolution, years=(2016, 2016), dates_per_year=dates)
    ds = truth_dataset(cfg)[[f"oracle_mean_{target}"]].isel(step=-1)
    return to_fields(ds.drop_vars([c for c in ds.coords if c not in ds.dims]).load())


def lever_name(cfg: FieldConfig) -> str:
    return cfg.weights + ("" if cfg.entropy == "none" else f"+{cfg.entropy}")


def fitted_net(path: Path, fields: Fields, cfg: FieldConfig) -> Net:
    """The fp32 network of ``cfg`` on ``fields``: from an earlier run's artefact when the settings and
    data shape match (its fit time in a sidecar JSON), else fitted and saved."""
    cfg = replace(cfg, weights="fp32", entropy="none", error_bound=None, error_bounds={})
    side = path.with_suffix(".json")
    if path.exists() and side.exists():
        art = Artefact.load(path)
        if art.config == cfg and art.header["shape"] == list(fields.data.shape):
            return art.network(), art.arrays["norm.mean"], art.arrays["norm.std"], json.loads(side.read_text())["fit_s"]
    t0 = time.perf_counter()
    net, mean, std = train_network(fields, cfg, progress=True)
    fit_s = time.perf_counter() - t0
    Artefact.from_network(fields, cfg, net, mean, std, fit_s).save(path)
    write_json(side, {"fit_s": fit_s, "threads": torch.get_num_threads()})
    return net, mean, std, fit_s


def neural_rows(fields: Fields, a: argparse.Namespace, target: str, out: Path) -> list[dict[str, Any]]:
    rows = []
    std = float(fields.data.std())
    sweep = [(a.sweep_width, s) for s in a.sweep_steps] if target == FIELDS[0] else []  # first field only
    for width, steps in [(w, a.steps) for w in a.widths] + sweep:
        cfg = FieldConfig(width=width, depth=a.depth, steps=steps, sigma=a.sigma, batch_points=a.batch_points)
        net, mean, std_, fit_s = fitted_net(out / f"{target}_w{width}_s{steps}.pcnf", fields, cfg)
        in_sweep = (width, steps) in sweep and (width not in a.widths or steps != a.steps)
        for weights, entropy in [tuple(a.hybrid_lever)] if in_sweep else LEVERS:
            art = Artefact.from_network(fields, replace(cfg, weights=weights, entropy=entropy), net, mean, std_, fit_s)
            codec = f"neural {lever_name(art.config)}" + (" steps" if in_sweep else "")
            rows.append(report.neural_row(fields, art, f"w={width} d={a.depth} {steps} steps", codec))
            if not in_sweep and (weights, entropy) == tuple(a.hybrid_lever):
                for f in a.hybrid_bounds:
                    hyb = art.with_error_bounds(fields, {fields.variables[0]: f * std})
                    hyb.fit_seconds = fit_s
                    rows.append(
                        report.neural_row(
                            fields, hyb, f"w={width} {lever_name(art.config)} sz3<={f:g}std", "neural+sz3"
                        )
                    )
    return rows


def compare_field(target: str, a: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    fields = comparison_fields(a.resolution, a.dates, target)
    std = float(fields.data.std())
    rows = neural_rows(fields, a, target, out)
    ebcc = [f * std for f in a.ebcc_bounds] if baselines.ebcc_available() else []
    sz3 = [f * std for f in (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)]  # to the networks' error range
    rows += report.baseline_rows(fields, sz3, [f * std for f in (0.003, 0.03, 0.3)], [0.5, 1.0, 2.0], ebcc)
    for r in rows:
        r["field"] = target
    return rows


def best_gain(rows: list[dict[str, Any]], key: str, ref: str = "sz3") -> float:
    """Best neural (or hybrid) ratio in [100, 1000] over ``ref``'s ratio at the same error ``key``."""
    gains = [
        r["ratio"] / report.ratio_at_equal_error(rows, ref, r[key], key)
        for r in rows
        if r["codec"].startswith("neural") and not r["codec"].endswith("steps") and 100 <= r["ratio"] <= 1000
    ]
    finite = [g for g in gains if math.isfinite(g)]
    return max(finite) if finite else float("nan")


# --- part 2: downstream ----------------------------------------------------------------------------
def downstream_sources(a: argparse.Namespace, out: Path, cfg: Any) -> dict[str, tuple[str, Any]]:
    """name -> (codec, decoded-fields source) for every compressed variant (one bound rule: r x std)."""
    from postcast.compression.loader import SZ3Split, split_fields

    fields = to_fields(split_fields(cfg, "train"))
    std = {v: float(fields.data[i].std()) for i, v in enumerate(fields.variables)}
    srcs: dict[str, tuple[str, Any]] = {}
    for width in a.down_widths:
        fcfg = FieldConfig(width=width, depth=a.depth, steps=a.down_steps, sigma=a.sigma, batch_points=a.batch_points)
        net, mean, sd, fit_s = fitted_net(out / f"unet_t850_train_w{width}.pcnf", fields, fcfg)
        art = Artefact.from_network(
            fields, replace(fcfg, weights=a.down_lever[0], entropy=a.down_lever[1]), net, mean, sd, fit_s
        )
        srcs[f"neural w={width}"] = ("neural", art)
        if width == max(a.down_widths):
            for r in a.down_bounds:
                srcs[f"neural w={width}+sz3 r={r:g}"] = (
                    "neural+sz3",
                    art.with_error_bounds(fields, {v: r * s for v, s in std.items()}),
                )
    for r in a.sz3_bounds:
        srcs[f"sz3 r={r:g}"] = ("sz3", SZ3Split.build(fields, {v: r * s for v, s in std.items()}))
    return srcs


def train_variant(name: str, src: Any, a: argparse.Namespace, out: Path, cfg: Any, model_args: Any) -> dict[str, Any]:
    """Test CRPS of the U-Net trained from ``src`` (None: the store); cached per name and settings."""
    import lightning as L

    from postcast.compression.loader import CompressedDataModule
    from postcast.datasets.loaders.datamodule import StoreDataModule
    from postcast.models.module import PostProcessor

    ratio = 1.0 if src is None else float(src.ratio)
    key = {"name": name, "ratio": round(ratio, 3), "epochs": a.epochs, "store": a.store}
    cache = out / "downstream" / (name.replace(" ", "_").replace("=", "").replace("+", "_") + ".json")
    if cache.exists() and json.loads(cache.read_text())["key"] == key:
        res: dict[str, Any] = json.loads(cache.read_text())
        return res
    dm = StoreDataModule(cfg) if src is None else CompressedDataModule(cfg, src)
    L.seed_everything(0)
    model = PostProcessor(**model_args, sample=cfg.sample.to_dict(), grid=dm.grid, n_members=dm.n_members)
    trainer = L.Trainer(
        max_epochs=a.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out / "downstream",
    )
    t0 = time.perf_counter()
    trainer.fit(model, dm)
    res = {
        "key": key,
        "ratio": ratio,
        "train_s": time.perf_counter() - t0,
        "test_crps": trainer.test(model, dm, verbose=False)[0]["test_crps"],
    }
    write_json(cache, res)
    return res


def downstream(a: argparse.Namespace, out: Path) -> dict[str, Any]:
    from postcast.pipeline.train import data_config, resolve

    args = ["-c", "configs/train/unet_t850.yaml", "--data.cfg.store", a.store]
    model_args, cfg = resolve(args)["model"], data_config(args)
    variants: dict[str, dict[str, Any]] = {
        "store": {"codec": "store", **train_variant("store", None, a, out, cfg, model_args)}
    }
    for name, (codec, src) in downstream_sources(a, out, cfg).items():
        variants[name] = {"codec": codec, "bytes": src.nbytes, **train_variant(name, src, a, out, cfg, model_args)}
        print(f"  {name}: ratio {variants[name]['ratio']:.1f}, test CRPS {variants[name]['test_crps']:.4f}", flush=True)
    base = variants["store"]["test_crps"]
    for v in variants.values():
        v["penalty_pct"] = 100 * (v["test_crps"] / base - 1)
    return variants


def largest_ratio_below(variants: dict[str, dict[str, Any]], prefix: str, pct: float) -> float:
    ok = [v["ratio"] for v in variants.values() if v["codec"].startswith(prefix) and v["penalty_pct"] < pct]
    return max(ok) if ok else float("nan")


def plot_downstream(variants: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for codec, marker in (("neural", "o"), ("neural+sz3", "D"), ("sz3", "s")):
        pts = sorted((v["ratio"], v["penalty_pct"]) for v in variants.values() if v["codec"] == codec)
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=marker, label=codec)
    ax.axhline(2.0, color="k", lw=0.8, ls="--", label="2 % penalty")
    ax.set(xscale="log", xlabel="compression ratio of the training fields", ylabel="test CRPS penalty (%)", title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    report.save_png(fig, path, dpi=110)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--resolution", type=float, default=1.0)
    p.add_argument("--dates", type=int, default=26, help="init dates of 2016, evenly among ENS-10's 105")
    p.add_argument("--widths", type=int, nargs="+", default=[24, 48])
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-points", type=int, default=8192)
    p.add_argument("--sigma", type=float, default=1.6)
    p.add_argument("--sweep-width", type=int, default=24)
    p.add_argument(
        "--sweep-steps", type=int, nargs="*", default=[300, 2000], help="a fit-length sweep on the first field (Z500)"
    )
    p.add_argument("--hybrid-lever", nargs=2, default=["q6", "lzma"], metavar=("WEIGHTS", "ENTROPY"))
    p.add_argument("--hybrid-bounds", type=float, nargs="*", default=[0.003, 0.01, 0.03], help="x field std")
    p.add_argument("--ebcc-bounds", type=float, nargs="*", default=[0.01, 0.1, 1.0], help="x field std")
    p.add_argument("--store", default=str(DEFAULT_STORE))
    p.add_argument("--epochs", type=int, default=4, help="U-Net epochs (the preset has 12)")
    p.add_argument("--down-widths", type=int, nargs="+", default=[32])
    p.add_argument("--down-steps", type=int, default=800)
    p.add_argument("--down-lever", nargs=2, default=["q6", "lzma"], metavar=("WEIGHTS", "ENTROPY"))
    p.add_argument(
        "--down-bounds", type=float, nargs="*", default=[0.01, 0.03, 0.05, 0.1, 0.3], help="neural+sz3: x field std"
    )
    p.add_argument(
        "--sz3-bounds",
        type=float,
        nargs="*",
        default=[0.003, 0.01, 0.03, 0.05, 0.1, 0.3],
        help="sz3 loader: x field std",
    )
    p.add_argument("--skip-comparison", action="store_true")
    p.add_argument("--skip-downstream", action="store_true")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/compression"))
    return p.parse_args()


def main() -> None:
    a = parse()
    a.store = require_store(a.store)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.WARNING)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"torch threads: {torch.get_num_threads()}; EBCC installed: {baselines.ebcc_available()}", flush=True)
    rows: list[dict[str, Any]] = []
    gains: dict[str, dict[str, float]] = {"wrmse": {}, "max_abs": {}, "ebcc_wrmse": {}}
    if not a.skip_comparison:
        for target in FIELDS:
            r = compare_field(target, a, a.out)
            rows += r
            for key in ("wrmse", "max_abs"):
                gains[key][target] = best_gain(r, key)
            gains["ebcc_wrmse"][target] = best_gain(r, "wrmse", "ebcc")
            print(f"\n{target}\n{report.format_table(r)}", flush=True)
        report.plot_panels(
            rows,
            a.out / "ratio_vs_error.png",
            list(FIELDS),
            f"{a.dates} dates of 2016, {a.resolution} deg, {a.steps} CPU steps per fit",
        )
    down = {} if a.skip_downstream else downstream(a, a.out)
    result = {k: float(np.min(list(v.values()))) if v else float("nan") for k, v in gains.items()}  # NaN wins
    at2 = largest_ratio_below(down, "neural", 2.0) if down else float("nan")
    sz3_at2 = largest_ratio_below(down, "sz3", 2.0) if down else float("nan")
    if down:
        print(
            f"\ndownstream (U-Net T850, {a.epochs} epochs; bounds r x field std for both codecs)\n"
            f"{'variant':<26}{'ratio':>8}{'test CRPS':>11}{'penalty %':>11}"
        )
        for name, v in down.items():
            print(f"{name:<26}{v['ratio']:>8.1f}{v['test_crps']:>11.4f}{v['penalty_pct']:>11.2f}")
        plot_downstream(down, a.out / "downstream_penalty.png", f"U-Net T850, {a.epochs} epochs")
    write_json(
        a.out / "compression.json",
        {"rows": rows, "ratio_vs_sz3": gains, "downstream": down, "args": {k: str(v) for k, v in vars(a).items()}},
    )
    print(
        f"RESULT ratio_vs_sz3_at_equal_wrmse={result['wrmse']:.3f} "
        f"ratio_vs_sz3_at_equal_maxerr={result['max_abs']:.3f} downstream_ratio_at_2pct={at2:.1f} "
        f"downstream_ratio_vs_sz3_loader={at2 / sz3_at2:.3f} ratio_vs_ebcc_at_equal_wrmse={result['ebcc_wrmse']:.3f}"
    )


if __name__ == "__main__":
    main()
