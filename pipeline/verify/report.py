"""The evaluation report: ``report.md`` and ``report.html`` with PNG figures, read from the results
Dataset (``results.nc``, :func:`postcast.pipeline.verify.evaluate.results_dataset`) and its JSON summary.

The page reads top to bottom: a contents list, the notes and metrics, the scorecard, then a section
per target. Figures: a scorecard (CRPS skill against each target's baseline, the raw Gaussian or, for a
non-Gaussian target, the raw members, for every forecast, target and lead, a ``*`` where the difference
is significant at 95 % by Diebold-Mariano; its colour bar labelled), skill against lead time, CRPS maps
(coastlines, latitude/longitude axes: :mod:`postcast.pipeline.products.maps`), reliability diagrams of the tail
events that fit the target (no "below the 10 % quantile" for a target with dry days: that quantile is
0 mm), the CRPS decomposition, and calibration (spread/skill, the raw ensemble's rank histogram, PIT).
Every forecast keeps one colour in every figure of every target (:func:`palette`). Tables: every
metric of :data:`postcast.pipeline.verify.metrics.METRICS` (a row each, with its label, units and
format; their descriptions in the legend; a column per forecast, a non-Gaussian one labelled with
its predictive family), the CRPS against the target's own baseline (named), the CRPS at every lead
and its decomposition. Markdown's inline code is rendered in the HTML.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from postcast.datasets import io, laws, schema
from postcast.pipeline.products import maps
from postcast.pipeline.verify import metrics
from postcast.pipeline.verify.forecasts import ENSEMBLE, RAW

FIG_DPI = 90
BASELINES = {  # a target's baseline (results' ``baseline``) as the report names it
    RAW: "the raw ensemble's Gaussian (`raw`: the members' mean and std)",
    ENSEMBLE: "the raw members (`raw_ensemble`, fair CRPS)",
}
Palette = dict[str, Any]  # forecast name -> matplotlib colour


def palette(ds: xr.Dataset) -> Palette:
    """One colour per forecast, the same in every figure of every target: tab10 (then tab20) in the
    order of the results' forecasts, the raw ensemble grey."""
    plt = _plt()
    names = [str(f) for f in ds["forecast"].values if str(f) != ENSEMBLE]
    colours = list(plt.get_cmap("tab10").colors) + list(plt.get_cmap("tab20").colors)
    return {**{n: colours[k % len(colours)] for k, n in enumerate(names)}, ENSEMBLE: "tab:gray"}


def baseline_name(ds: xr.Dataset, target: str) -> str:
    """The target's baseline, as the report names it."""
    name = str(ds["baseline"].sel(target=target).item())
    return BASELINES.get(name, f"`{name}`")


def fits(target: schema.Target, event: str) -> bool:
    """Whether a tail event means something for the target: not "below the 10 % quantile" of a target with
    dry days (rain: that quantile is 0, so the event never happens)."""
    return not (event.startswith("below") and target.dry_below is not None)


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


def _skill_grid(ds: xr.Dataset) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    """Rows: forecasts; columns: target @ lead; skill (%) vs the target's baseline (``baseline``: the raw
    Gaussian, or the raw members of a non-Gaussian target) and significance against it."""
    crps = ds["score"].sel(metric="crps", region="global", weighting="none")  # (target, forecast, lead)
    base = crps.sel(forecast=ds["baseline"])  # (target, lead): each target's own baseline
    skill = 100 * (1 - crps / base)
    sig = ds["significant"].sel(region="global", weighting="none")
    cols = [
        (str(t), int(h))
        for t in ds["target"].values
        for h in ds["lead"].values
        if np.isfinite(base.sel(target=t, lead=h))
    ]
    names = [str(f) for f in ds["forecast"].values]
    grid = np.array([[float(skill.sel(target=t, lead=h, forecast=f)) for t, h in cols] for f in names])
    marks = np.array([[bool(sig.sel(target=t, lead=h, forecast=f) == 1) for t, h in cols] for f in names])
    return names, [f"{t} +{h}h" for t, h in cols], grid, marks


def scorecard(ds: xr.Dataset) -> Any:
    plt = _plt()
    names, cols, grid, marks = _skill_grid(ds)
    fig, ax = plt.subplots(figsize=(1.3 * len(cols) + 2.5, 0.45 * len(names) + 1.4))
    scale = maps.diverging(grid)  # a skill: diverging around 0
    im = ax.imshow(grid, cmap=scale.cmap, vmin=scale.vmin, vmax=scale.vmax, aspect="auto")
    for (i, j), v in np.ndenumerate(grid):
        if np.isfinite(v):
            ax.text(j, i, f"{v:+.1f}%{'*' if marks[i, j] else ''}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_title(
        "CRPS skill vs each target's baseline: the raw Gaussian, the raw members for a non-Gaussian target\n"
        "(blue = better; * significant at 95 %, Diebold-Mariano)",
        fontsize=9,
    )
    fig.colorbar(im, ax=ax, shrink=0.8, label="CRPS skill against the target's baseline (%)")
    return fig


def skill_vs_lead(target: schema.Target, ds: xr.Dataset, colours: Palette) -> Any:
    plt = _plt()
    crps = ds["score"].sel(target=target.name, metric="crps", region="global")  # (forecast, lead, weighting)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    leads = ds["lead"].values
    for f in ds["forecast"].values:
        for ax, w in zip(axes, ("none", "area"), strict=True):
            y = crps.sel(forecast=f, weighting=w).values
            if np.isfinite(y).any():
                ax.plot(leads, y, marker="o", label=str(f), color=colours[str(f)], gid=f"forecast:{f}")
    for ax, w in zip(axes, ("unweighted", "area-weighted"), strict=True):
        ax.set_xlabel("lead (h)")
        ax.set_ylabel(f"CRPS ({ds['units'].sel(target=target.name).item()})")
        ax.set_title(f"{target.name}: {w} CRPS against lead", fontsize=9)
        ax.set_xticks(leads)
    axes[0].legend(fontsize=7)
    return fig


def crps_maps(target: schema.Target, ds: xr.Dataset, lead: int) -> Any:
    plt = _plt()
    one = ds.sel(target=target.name, lead=lead)
    names = [str(f) for f in one["forecast"].values if np.isfinite(one["crps_map"].sel(forecast=f)).all()]
    lat, lon = ds["latitude"].values, ds["longitude"].values
    fields = [one["crps_map"].sel(forecast=f).values for f in names]
    vmax = float(np.nanpercentile(np.stack(fields), 99))
    cols = min(3, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 2.9 * rows), squeeze=False, constrained_layout=True)
    im = None
    for ax, f, m in zip(axes.flat, names, fields, strict=False):
        im = ax.pcolormesh(lon, lat, m, vmin=0, vmax=vmax, cmap="viridis", shading="nearest")  # a score: from 0
        maps.draw_coastlines(ax, lon, lat)
        ax.set_title(f"{f}: mean {np.nanmean(m):.3g}", fontsize=9)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    units = ds["units"].sel(target=target.name).item()
    fig.colorbar(im, ax=axes, shrink=0.8, label=f"mean CRPS ({units})")
    fig.suptitle(f"{target.name}: CRPS per grid point (+{lead} h); coastlines: {maps.COASTLINE_SOURCE}")
    return fig


def reliability_diagrams(target: schema.Target, ds: xr.Dataset, lead: int, colours: Palette) -> Any:
    rel = ds["reliability"].sel(target=target.name, lead=lead)  # (forecast, event, quantity, prob_bin)
    if rel.sizes.get("event", 0) == 0:
        return None
    keep = [e for e in rel["event"].values if fits(target, str(e)) and np.isfinite(rel.sel(event=e)).any()]
    rel = rel.sel(event=keep)  # this target's events that mean something for it
    if rel.sizes["event"] == 0:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, rel.sizes["event"], figsize=(4.6 * rel.sizes["event"], 4), squeeze=False)
    for ax, ev in zip(axes.flat, rel["event"].values, strict=True):
        ax.plot([0, 1], [0, 1], color="k", lw=1)
        for f in rel["forecast"].values:
            r = rel.sel(forecast=f, event=ev)
            p, o = r.sel(quantity="forecast_probability").values, r.sel(quantity="observed_frequency").values
            if np.isfinite(p).any():
                ax.plot(p, o, marker="o", ms=3, label=str(f), color=colours[str(f)], gid=f"forecast:{f}")
        ax.set_xlabel("forecast probability")
        ax.set_ylabel("observed frequency")
        ax.set_title(f"{target.name} +{lead} h: y {_event_label(target, str(ev))}", fontsize=9)
    axes.flat[0].legend(fontsize=7)
    return fig


def _event_label(target: schema.Target, event: str) -> str:
    """``above q90 (training climate)`` or ``above 10 mm`` (a target's own threshold)."""
    side, q = event.split("_")
    own = dict(zip(metrics.THRESHOLD_EVENTS, target.thresholds, strict=False))
    return f"{side} {own[event]:g} {target.units}" if event in own else f"{side} {q} (training climate)"


def decomposition_figure(target: schema.Target, ds: xr.Dataset, lead: int) -> Any:
    plt = _plt()
    dec = ds["decomposition"].sel(target=target.name, lead=lead, region="global")  # (forecast, component)
    names = [str(f) for f in dec["forecast"].values if np.isfinite(dec.sel(forecast=f)).all()]
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(names) + 1.5))
    y = np.arange(len(names))
    reli = [float(dec.sel(forecast=f, component="reliability")) for f in names]
    pot = [float(dec.sel(forecast=f, component="crps_potential")) for f in names]
    ax.barh(y, pot, color="tab:blue", label="CRPS_pot = unc - resolution")
    ax.barh(y, reli, left=pot, color="tab:red", label="reliability")
    ax.set_yticks(y, names)
    ax.set_xlabel(f"CRPS ({ds['units'].sel(target=target.name).item()}), Hersbach decomposition, area-weighted")
    ax.legend(fontsize=7)
    return fig


def calibration(target: schema.Target, res: dict[str, Any], colours: Palette) -> Any:
    plt = _plt()
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(13, 3.2))
    names = list(res["forecasts"])
    ratios = [res["forecasts"][f]["global"]["spread_skill"] for f in names]
    a1.barh(names, ratios, color=[colours[f] for f in names])
    a1.axvline(1.0, color="k", lw=1)
    a1.set_title("spread / skill (1 = calibrated)")
    rank = np.asarray(res["raw_ensemble"]["global"]["rank_histogram"], dtype=float)
    a2.bar(range(rank.size), rank / rank.sum(), color="tab:gray")
    a2.axhline(1 / rank.size, color="k", lw=1)
    a2.set_title("raw ensemble rank histogram")
    for f in names:
        h = np.asarray(res["forecasts"][f]["global"]["pit_histogram"], dtype=float)
        a3.plot(
            (np.arange(h.size) + 0.5) / h.size,
            h / h.sum() * h.size,
            marker=".",
            label=f,
            color=colours[f],
            gid=f"forecast:{f}",
        )
    a3.axhline(1.0, color="k", lw=1)
    a3.set_title("PIT density (1 = calibrated)")
    a3.legend(fontsize=7)
    fig.suptitle(f"{target.name} +{res['lead_h']} h", y=1.04)
    return fig


def _score_table(target: schema.Target, ds: xr.Dataset, res: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One row per registered metric (and one more for the area-weighted value of a ``weighted``
    one), one column per forecast: global scores at the summary's lead; ``-`` where it does not apply."""
    names = [*res["forecasts"], ENSEMBLE]
    scores = ds["score"].sel(target=target.name, lead=res["lead_h"], region="global", forecast=names)
    rows = []
    for m in metrics.METRICS:
        units = str(ds["metric_units"].sel(target=target.name, metric=m.name).values)
        for w in ("none", "area") if m.weighted else ("none",):
            values = scores.sel(metric=m.name, weighting=w).values
            if m.event and (not fits(target, m.event) or not np.isfinite(values).any()):  # not this target's
                continue
            rows.append(
                [
                    m.label if w == "none" else f"{m.label}, area-w.",
                    units,
                    *(f"{v:{m.fmt}}" if np.isfinite(v) else "-" for v in values),
                ]
            )
    return ["metric", "units", *(_family_label(res, f) for f in names)], rows


def _family_label(res: dict[str, Any], name: str) -> str:
    """A forecast's column: its name, with its predictive family in brackets unless the default (Gaussian)."""
    family = res["forecasts"].get(name, {}).get("global", {}).get("distribution", laws.DEFAULT)
    return name if family == laws.DEFAULT else f"{name} [{family}]"


def _crps_vs_raw_table(res: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    head = ["forecast", "skill vs baseline", "gap closed", "95% CI vs baseline", "DM p"]
    rows = []
    for f, regions in res["forecasts"].items():
        g = regions["global"]
        d = g["crps_minus_raw"]
        mark = "*" if d["significant"] else ""
        rows.append(
            [
                f,
                f"{100 * g['skill_vs_raw']:+.1f}%{mark}",
                f"{100 * g.get('gap_closed', float('nan')):.0f}%",
                f"[{d['ci95'][0]:+.3g}, {d['ci95'][1]:+.3g}]",
                f"{d['dm_p_value']:.3g}",
            ]
        )
    return head, rows


def _lead_table(target: schema.Target, ds: xr.Dataset) -> tuple[list[str], list[list[str]]]:
    crps = ds["score"].sel(target=target.name, metric="crps", region="global")
    sig = ds["significant"].sel(target=target.name, region="global", weighting="area")
    leads = [int(h) for h in ds["lead"].values]
    head = ["forecast"] + [f"+{h} h (unw. / area-w.)" for h in leads]
    rows = []
    for f in ds["forecast"].values:
        cells = []
        for h in leads:
            a, b = (float(crps.sel(forecast=f, lead=h, weighting=w)) for w in ("none", "area"))
            mark = "*" if sig.sel(forecast=f, lead=h) == 1 else ""
            cells.append(f"{a:.4g} / {b:.4g}{mark}" if np.isfinite(a) else "-")
        if any(c != "-" for c in cells):
            rows.append([str(f), *cells])
    return head, rows


def _decomp_table(target: schema.Target, ds: xr.Dataset) -> tuple[list[str], list[list[str]]]:
    dec = ds["decomposition"].sel(target=target.name, region="global")  # (forecast, component, lead)
    comps = [str(c) for c in dec["component"].values]
    head = ["forecast", "lead", *comps]
    rows = []
    for f in dec["forecast"].values:
        for h in ds["lead"].values:
            v = dec.sel(forecast=f, lead=h).values
            if np.isfinite(v).all():
                rows.append([str(f), f"+{int(h)} h", *(f"{x:.4g}" for x in v)])
    return head, rows


def _md(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows), ""]


def inline(text: str) -> str:
    """Markdown's inline code (`x`) as HTML (<code>x</code>), the rest escaped."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _html(head: list[str], rows: list[list[str]]) -> str:
    table = "<tr>" + "".join(f"<th>{inline(h)}</th>" for h in head) + "</tr>"
    table += "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table border=1 cellpadding=3>{table}</table>"


NOTES = (
    "`*`: the CRPS difference against the target's baseline (named in each target's section: the raw "
    "ensemble's Gaussian for a Gaussian target, the raw members for another family's) is significant at "
    "95 % (Diebold-Mariano on per-date scores, HAC variance with the Harvey-Leybourne-Newbold correction); "
    "intervals from a stationary bootstrap over init dates. `raw_ensemble` is the members' fair CRPS. "
    "Decomposition: Hersbach (2000), CRPS = reliability - resolution + uncertainty, area-weighted; "
    "a Gaussian as its 50-quantile ensemble. Formulas: docs/verification.md."
)


def _legend() -> list[str]:
    """``label: description`` of every registered metric."""
    return [f"{m.label}: {m.description}" for m in metrics.METRICS]


class _Page:
    """report.md and report.html, written side by side: headings (with anchors and a contents list),
    paragraphs, tables, figures."""

    def __init__(self) -> None:
        self.md: list[str] = []
        self.body: list[str] = []
        self.contents: list[tuple[int, str, str]] = []  # (level, anchor, title)

    def heading(self, level: int, title: str, anchor: str) -> None:
        self.contents.append((level, anchor, title))
        self.md += [f'{"#" * level} <a id="{anchor}"></a>{title}', ""]
        self.body.append(f'<h{level} id="{anchor}">{inline(title)}</h{level}>')

    def text(self, line: str) -> None:
        self.md += [line, ""]
        self.body.append(f"<p>{inline(line)}</p>")

    def table(self, head: list[str], rows: list[list[str]]) -> None:
        self.md += _md(head, rows)
        self.body.append(_html(head, rows))

    def figure(self, fig: Any, path: Path) -> None:
        if fig is not None:
            name = _save(fig, path)
            self.md += [f"![{name}]({name})", ""]
            self.body.append(f'<p><img src="{name}" alt="{name}"></p>')

    def toc(self) -> tuple[list[str], str]:
        md = [f"{'  ' * (lv - 2)}- [{t}](#{a})" for lv, a, t in self.contents if lv > 1]
        items = "".join(
            f'<li style="margin-left:{1.5 * (lv - 2)}em"><a href="#{a}">{inline(t)}</a></li>'
            for lv, a, t in self.contents
            if lv > 1
        )
        return ["Contents:", "", *md, ""], f"<nav><p>Contents:</p><ul>{items}</ul></nav>"


def _target_section(page: _Page, target: schema.Target, ds: xr.Dataset, res: dict[str, Any], out: Path) -> None:
    lead, name = res["lead_h"], target.name
    colours = palette(ds)
    base = baseline_name(ds, name)
    page.heading(2, name, name)
    page.text(
        f"Baseline: {base}. Raw ensemble mean |EFI| {res['raw_ensemble']['global']['mean_abs_efi']:.2f}; "
        f"{res['n_dates']} dates at +{lead} h; units {res['units']}."
    )
    tables = [
        (f"scores at +{lead} h (global)", _score_table(target, ds, res)),
        (f"CRPS against {base} at +{lead} h (global)", _crps_vs_raw_table(res)),
        ("CRPS at every lead", _lead_table(target, ds)),
        ("CRPS decomposition (global, area-weighted)", _decomp_table(target, ds)),
    ]
    for k, (title, (head, rows)) in enumerate(tables):
        page.heading(3, title, f"{name}-table-{k}")
        page.table(head, rows)
    page.heading(3, "figures", f"{name}-figures")
    page.figure(skill_vs_lead(target, ds, colours), out / f"skill_vs_lead_{name}.png")
    page.figure(crps_maps(target, ds, lead), out / f"crps_map_{name}.png")
    page.figure(reliability_diagrams(target, ds, lead, colours), out / f"reliability_{name}.png")
    page.figure(decomposition_figure(target, ds, lead), out / f"decomposition_{name}.png")
    page.figure(calibration(target, res, colours), out / f"calibration_{name}.png")


STYLE = "body{font-family:sans-serif;max-width:1200px;margin:1em 2em}img{max-width:100%}table{border-collapse:collapse}"


def write_report(ds: xr.Dataset, results: dict[str, Any], out: Path) -> Path:
    """Write figures, ``report.md`` and ``report.html`` into ``out`` from the results Dataset and its
    JSON summary; returns the HTML path."""
    page = _Page()
    page.heading(2, "notes and metrics", "notes")
    page.text(f"Store: `{results['store']}`")
    page.text(NOTES)
    page.md += ["Metrics:", "", *(f"- {line}" for line in _legend()), ""]
    page.body.append("<p>Metrics:</p><ul>" + "".join(f"<li>{inline(line)}</li>" for line in _legend()) + "</ul>")
    page.heading(2, "scorecard", "scorecard")
    page.figure(scorecard(ds), out / "scorecard.png")
    for target, res in results["targets"].items():
        _target_section(page, schema.target(target), ds, res, out)  # the summary names its targets
    title = f"postcast evaluation: split `{results['split']}`"
    toc_md, toc_html = page.toc()
    io.write_text(out / "report.md", "\n".join([f"# {title}", "", *toc_md, *page.md]) + "\n")
    head = f"<!doctype html><html><head><meta charset='utf-8'><title>postcast evaluation</title><style>{STYLE}</style>"
    body = "\n".join([f"<h1>{inline(title)}</h1>", toc_html, *page.body])
    io.write_text(out / "report.html", f"{head}</head><body>{body}</body></html>\n")
    return out / "report.html"
