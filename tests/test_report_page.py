"""The evaluation report as a forecaster reads it (issue 40, item 5): a contents list, Markdown rendered,
each target's tables named after that target's own baseline, events that fit the target (no "below
q10" for rain), one colour per forecast in every figure of every target, labelled colour bars and CRPS
maps with coastlines and degree axes. On a real evaluation of the synthetic store's t2m and tp24."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
import xarray as xr
from matplotlib.colors import to_rgba

from postcast.datasets import schema
from postcast.pipeline.verify.evaluate import EvalConfig, evaluate

TARGETS = ("t2m", "tp24")  # a Gaussian target (baseline: raw) and a non-Gaussian one (raw_ensemble)


@pytest.fixture(scope="module")
def evaluated(derived_store, tmp_path_factory):
    out = tmp_path_factory.mktemp("report_page")
    evaluate(EvalConfig(store=str(derived_store), targets=TARGETS, split="val", out=str(out), bootstrap=20))
    with xr.open_dataset(out / "results.nc") as ds:
        results = ds.load()
    return json.loads((out / "metrics.json").read_text()), results, out


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.ids |= {v for k, v in attrs if k == "id"}

    def handle_data(self, data):
        self.text.append(data)


def _sections(page: str) -> dict[str, str]:
    """The HTML of each target's section (from its <h2> to the next)."""
    parts = re.split(r'(?=<h2 id="[^"]+">)', page)
    return {re.match(r'<h2 id="([^"]+)">', p).group(1): p for p in parts if p.startswith("<h2")}


def test_the_report_has_contents_and_rendered_markdown(evaluated):
    _, _, out = evaluated
    page = (out / "report.html").read_text()
    parsed = _Text()
    parsed.feed(page)
    links = re.findall(r"<nav>.*?</nav>", page, re.S)[0]
    for anchor in ("scorecard", *TARGETS, "tp24-figures"):
        assert f'href="#{anchor}"' in links and anchor in parsed.ids
    assert "`" not in "".join(parsed.text)  # no literal Markdown backticks
    assert "<code>raw_ensemble</code>" in page
    md = (out / "report.md").read_text()
    assert "- [t2m](#t2m)" in md and '<a id="t2m"></a>' in md


def test_each_target_is_measured_against_its_own_baseline_named(evaluated):
    summary, results, out = evaluated
    sections = _sections((out / "report.html").read_text())
    names = {"raw": "the raw ensemble&#x27;s Gaussian", "raw_ensemble": "the raw members"}
    for target in TARGETS:
        base = str(results["baseline"].sel(target=target).item())
        assert base == summary["targets"][target]["baseline"]
        assert f"CRPS against {names[base]}" in sections[target], target
        other = names["raw" if base == "raw_ensemble" else "raw_ensemble"]
        assert f"CRPS against {other}" not in sections[target]
    assert "raw Gaussian" not in sections["tp24"]


def test_rain_has_no_below_q10_event(evaluated):
    from postcast.pipeline.verify import report

    summary, results, out = evaluated
    sections = _sections((out / "report.html").read_text())
    assert "y &lt; q10" not in sections["tp24"] and "y &lt; q10" in sections["t2m"]
    fig = report.reliability_diagrams(
        schema.target("tp24"), results, summary["targets"]["tp24"]["lead_h"], report.palette(results)
    )
    assert fig is not None and all("below" not in ax.get_title() for ax in fig.axes)


def _line_colours(fig) -> dict[str, tuple]:
    return {
        line.get_gid().split(":", 1)[1]: to_rgba(line.get_color())
        for ax in fig.axes
        for line in ax.get_lines()
        if (line.get_gid() or "").startswith("forecast:")
    }


def test_one_colour_per_forecast_in_every_figure_and_target(evaluated):
    from postcast.pipeline.verify import report

    summary, results, _ = evaluated
    colours = report.palette(results)
    seen: dict[str, set] = {}
    for target in TARGETS:
        tg, res = schema.target(target), summary["targets"][target]
        figs = [
            report.skill_vs_lead(tg, results, colours),
            report.reliability_diagrams(tg, results, res["lead_h"], colours),
            report.calibration(tg, res, colours),
        ]
        for fig in figs:
            for name, rgba in _line_colours(fig).items():
                seen.setdefault(name, set()).add(rgba)
    assert len(seen) >= 3 and all(len(c) == 1 for c in seen.values()), seen
    assert len({next(iter(c)) for c in seen.values()}) == len(seen)  # and different forecasts differ


def test_maps_have_coastlines_and_axes_and_colour_bars_labels(evaluated):
    from postcast.pipeline.products import maps
    from postcast.pipeline.verify import report

    summary, results, _ = evaluated
    fig = report.crps_maps(schema.target("tp24"), results, summary["targets"]["tp24"]["lead_h"])
    panels = [ax for ax in fig.axes if ax.get_images() or (ax.collections and ax.get_title())]
    assert panels
    for ax in panels:
        assert any(line.get_gid() == maps.COASTLINE_GID for line in ax.get_lines())
        assert "longitude" in ax.get_xlabel() and "latitude" in ax.get_ylabel()
    card = report.scorecard(results)
    assert "skill" in card.axes[-1].get_ylabel()  # the colour bar says what it shows
