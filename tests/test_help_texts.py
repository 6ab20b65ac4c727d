"""Help texts say what the commands do (issue 40, item 6): every flag's default reads correctly, the
forecast fallback is named as the family it is, and the step-by-step example's store is the one train
reads."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import yaml

from postcast.main import build_parser

ROOT = Path(__file__).resolve().parents[1]


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_no_switch_reads_default_true_or_false():
    for p in _parsers(build_parser()):
        text = p.format_help()
        assert "(default: True)" not in text and "(default: False)" not in text, p.prog
        for action in p._actions:  # a valued option with a default still says it
            valued = action.option_strings and action.nargs != 0 and action.default not in (None, False, [], ())
            if valued and action.default is not argparse.SUPPRESS:
                assert action.help is None or "default" in p._get_formatter()._get_help_string(action), (p.prog, action)


def test_forecast_help_names_the_fallback_family():
    text = next(p for p in _parsers(build_parser()) if p.prog.endswith(" forecast")).format_help()
    flat = " ".join(text.split())
    assert "raw-ensemble Gaussian" not in flat
    assert "truncated normal for ws10" in flat and "censored shifted gamma for tp24" in flat


def test_the_step_by_step_example_builds_the_store_train_reads():
    epilog = build_parser().epilog
    ingested = re.search(r"postcast ingest \S+ --out (\S+)", epilog).group(1)
    train_store = yaml.safe_load((ROOT / "configs" / "paths.yaml").read_text())["data"]["cfg"]["store"]
    evaluated = re.search(r"postcast evaluate (\S+)", epilog).group(1)
    inspected = re.search(r"postcast inspect (\S+)", epilog).group(1)
    assert ingested == train_store == evaluated == inspected
    synth_out = re.search(r"postcast synth --out (\S+)", epilog).group(1)
    assert re.search(rf"postcast ingest {re.escape(synth_out)} ", epilog)
