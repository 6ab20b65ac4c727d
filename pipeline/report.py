"""The evaluation report: ``report.md`` and ``report.html`` with PNG figures, from the metrics dict.

Figures: a scorecard (CRPS skill against the raw ensemble, forecast x target), CRPS maps per
forecast, spread/skill bars, the raw ensemble's rank histogram and the PIT histograms.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np

from postcast.datasets import io

FIG_DPI = 90


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> str:
    with io.atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=FIG_DPI, bbox_inches="tight", format="png")
    _plt().close(fig)
    return path.name


def scorecard(results: dict[str, Any], out: Path) -> str:
    plt = _plt()
    targets = list(results["targets"])
    names = sorted({f for t in targets for f in results["targets"][t]["forecasts"]})
    grid = np.full((len(names), len(targets)), np.nan)
    for j, t in enumerate(targets):
        for i, f in enumerate(names):
            if f in results["targets"][t]["forecasts"]:
                grid[i, j] = 100 * results["targets"][t]["forecasts"][f]["global"]["skill_vs_raw"]
    fig, ax = plt.subplots(figsize=(1.6 * len(targets) + 2, 0.45 * len(names) + 1.2))
    lim = max(1.0, float(np.nanmax(np.abs(grid))))
    im = ax.imshow(grid, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    for (i, j), v in np.ndenumerate(grid):
        if np.isfinite(v):
            ax.text(j, i, f"{v:+.1f}%", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(targets)), targets)
    ax.set_yticks(range(len(names)), names)
    ax.set_title("CRPS skill vs raw ensemble (blue = better)")
    fig.colorbar(im, ax=ax, shrink=0.8)
    return _save(fig, out / "scorecard.png")


def crps_maps(target: str, res: dict[str, Any], out: Path) -> str:
    plt = _plt()
    names = list(res["crps_map"])
    lat, lon = np.asarray(res["latitude"]), np.asarray(res["longitude"])
    maps = [np.asarray(res["crps_map"][f]) for f in names]
    vmax = float(np.nanpercentile(np.stack(maps), 99))
    cols = min(3, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.4 * rows), squeeze=False)
    for ax, f, m in zip(axes.flat, names, maps, strict=False):
        im = ax.pcolormesh(lon, lat, m, vmin=0, vmax=vmax, cmap="viridis", shading="auto")
        ax.set_title(f"{f}: {np.nanmean(m):.3g} {res['units']}", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.colorbar(im, ax=axes, shrink=0.8, label=f"mean CRPS ({res['units']})")
    fig.suptitle(f"{target}: CRPS per grid point ({res['n_dates']} dates, +{res['lead_h']} h)")
    return _save(fig, out / f"crps_map_{target}.png")


def calibration(target: str, res: dict[str, Any], out: Path) -> str:
    plt = _plt()
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(13, 3.2))
    names = list(res["forecasts"])
    ratios = [res["forecasts"][f]["global"]["spread_skill"] for f in names]
    a1.barh(names, ratios, color="tab:blue")
    a1.axvline(1.0, color="k", lw=1)
    a1.set_title("spread / skill (1 = calibrated)")
    rank = np.asarray(res["raw_ensemble"]["global"]["rank_histogram"], dtype=float)
    a2.bar(range(rank.size), rank / rank.sum(), color="tab:gray")
    a2.axhline(1 / rank.size, color="k", lw=1)
    a2.set_title("raw ensemble rank histogram")
    centres = (np.arange(10) + 0.5) / 10
    for f in names:
        h = np.asarray(res["forecasts"][f]["global"]["pit_histogram"], dtype=float)
        a3.plot(centres, h / h.sum() * h.size, marker=".", label=f)
    a3.axhline(1.0, color="k", lw=1)
    a3.set_title("PIT density (1 = calibrated)")
    a3.legend(fontsize=7)
    fig.suptitle(target, y=1.04)
    return _save(fig, out / f"calibration_{target}.png")


def _table(res: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    head = ["forecast", "CRPS", "CRPS (area-w.)", "EECRPS", "skill vs raw", "gap closed", "95% CI vs raw",
            "spread/skill", "bias"]
    rows = []
    for f, regions in res["forecasts"].items():
        g = regions["global"]
        ci = g["crps_minus_raw"]["ci95"]
        rows.append([f, f"{g['crps']:.4g}", f"{g['crps_weighted']:.4g}", f"{g['eecrps']:.4g}",
                     f"{100 * g['skill_vs_raw']:+.1f}%", f"{100 * g.get('gap_closed', float('nan')):.0f}%",
                     f"[{ci[0]:+.3g}, {ci[1]:+.3g}]", f"{g['spread_skill']:.2f}", f"{g['bias']:+.3g}"])
    return head, rows


def write_report(results: dict[str, Any], out: Path) -> Path:
    """Write figures, ``report.md`` and ``report.html`` into ``out``; returns the HTML path."""
    md = [f"# postcast evaluation: split `{results['split']}`", "", f"Store: `{results['store']}`", ""]
    body = [f"<h1>postcast evaluation: split {html.escape(results['split'])}</h1>",
            f"<p>Store: <code>{html.escape(results['store'])}</code></p>"]
    card = scorecard(results, out)
    md += [f"![scorecard]({card})", ""]
    body.append(f'<img src="{card}">')
    for target, res in results["targets"].items():
        head, rows = _table(res)
        raw = res["raw_ensemble"]["global"]
        note = (f"Raw ensemble CRPS (members): fair {raw['crps_fair']:.4g}, standard {raw['crps_standard']:.4g}; "
                f"mean |EFI| {raw['mean_abs_efi']:.2f}; {res['n_dates']} dates at +{res['lead_h']} h; "
                f"units {res['units']}.")
        figs = [crps_maps(target, res, out), calibration(target, res, out)]
        md += [f"## {target}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        md += ["| " + " | ".join(r) + " |" for r in rows]
        md += ["", note, ""] + [f"![{f}]({f})" for f in figs] + [""]
        table = "".join(f"<th>{h}</th>" for h in head)
        table += "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
        body += [f"<h2>{target}</h2><table border=1 cellpadding=3>{table}</table><p>{html.escape(note)}</p>"]
        body += [f'<img src="{f}">' for f in figs]
    io.write_text(out / "report.md", "\n".join(md) + "\n")
    page = "<!doctype html><html><head><meta charset='utf-8'><title>postcast evaluation</title></head><body>"
    io.write_text(out / "report.html", page + "\n".join(body) + "</body></html>\n")
    return out / "report.html"
