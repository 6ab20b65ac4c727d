"""The command line: teaching --help, config validation, exit codes, the quickstart path."""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from postcast.datasets.core import config
from postcast.datasets.core.errors import ConfigError
from postcast.datasets.ingest.run import IngestConfig
from postcast.datasets.synth.synthetic import SynthConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("verb", ["synth", "ingest", "inspect", "config"])
def test_help_teaches(cli, verb):
    proc = cli(verb, "--help", check=True)
    assert "usage: postcast" in proc.stdout
    if verb in ("synth", "ingest"):
        assert "examples:" in proc.stdout


def test_top_level_help_lists_exit_codes(cli):
    out = cli("--help", check=True).stdout
    for verb in ("synth", "ingest", "inspect", "config"):
        assert verb in out
    assert " 66  missing input" in out


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
def test_presets_validate(cli):
    files = sorted(str(p) for p in (ROOT / "configs").rglob("*.yaml"))
    assert len(files) >= 4
    proc = cli("config", "validate", *files, check=True)
    assert proc.stdout.count(": ok") == len(files)


def test_invalid_presets_are_rejected(cli, tmp_path):
    bad = {
        "unknown_key.yaml": "kind: synth\nresolution: 5\ncolour: blue\n",
        "wrong_type.yaml": "kind: synth\ndates_per_year: many\n",
        "bad_level.yaml": "kind: synth\nlevels: [500, 851]\n",
        "no_kind.yaml": "resolution: 5\n",
        "bad_split.yaml": "kind: ingest\nsource: a\nout: b\nsplits: {train: [2000, 2015], val: [2014, 2015]}\n",
    }
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        proc = cli("config", "validate", str(tmp_path / name))
        assert proc.returncode == 2, name
        assert "INVALID" in proc.stderr and name in proc.stderr


def test_config_loader_types():
    cfg = config.load(ROOT / "configs/synth/quickstart.yaml", "synth", seed=7)
    assert isinstance(cfg, SynthConfig) and cfg.seed == 7 and cfg.levels == (500, 850)
    ing = config.from_dict(IngestConfig, {"source": "s", "out": "o", "splits": {"train": [1998, 2010]}})
    assert ing.splits.train == (1998, 2010) and ing.splits.test == (2016, 2017)
    with pytest.raises(ConfigError, match="unknown keys"):
        config.from_dict(SynthConfig, {"resolutoin": 5})
    with pytest.raises(ConfigError, match="is a 'synth' config"):
        config.load(ROOT / "configs/synth/quickstart.yaml", "ingest")


def test_quickstart_cli_chain(cli, tmp_path):
    """synth -> ingest -> inspect through the console script, on the tiny preset."""
    s, t = tmp_path / "s", tmp_path / "t.zarr"
    cli("synth", "-c", str(ROOT / "configs/synth/tiny.yaml"), "--out", str(s), "--years", "2015:2017", check=True)
    cli("ingest", str(s), "--out", str(t), "--threads", check=True)
    again = cli("ingest", str(s), "--out", str(t), "--threads", check=True)
    assert "already complete" in again.stdout
    out = cli("inspect", str(t), check=True).stdout
    assert "init times 2015-03-01 .. 2017-11-01 (9)" in out


def test_console_script_installed():
    exe = shutil.which("postcast", path=Path(sys.executable).parent)
    assert exe, "the `postcast` console script is not on PATH: run scripts/setup.sh"
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert proc.stdout.startswith("postcast ")


def test_module_entry_point():
    proc = subprocess.run([sys.executable, "-m", "postcast", "--version"], capture_output=True, text=True, check=True)
    assert proc.stdout.startswith("postcast ")


def test_train_cli_fit_test_and_checkpoint(cli, store, tmp_path):
    """`postcast train fit -c preset` on the store, then `test` from the saved checkpoint."""
    import torch

    preset = ROOT / "configs/train/tiny_emos_t2m.yaml"
    common = ["-c", str(preset), "--data.cfg.store", str(store), "--trainer.default_root_dir", str(tmp_path)]
    cli("train", "fit", *common, check=True)
    ckpts = sorted(tmp_path.rglob("*.ckpt"))
    assert ckpts, "no checkpoint written"
    ck = torch.load(ckpts[-1], weights_only=False)
    assert ck["postcast"]["format_version"] == 5 and ck["postcast"]["sample"]["target"] == "t2m"
    assert ck["postcast"]["checksum"].startswith("sha256:")  # of the weights and hyperparameters
    assert ck["hyper_parameters"]["family"] == "emos" and ck["hyper_parameters"]["grid"] == (19, 36)
    assert float(ck["state_dict"]["norm_std"].abs().sum()) > 0  # statistics travel with the weights
    out = cli("train", "test", *common, "--ckpt_path", str(ckpts[-1]), check=True)
    assert "test_crps" in out.stdout + out.stderr


def test_train_presets_cover_every_model_and_target(cli, tmp_path):
    from postcast.models import registry

    presets = {p.stem for p in (ROOT / "configs/train").glob("*.yaml")}
    assert {f"{m}_{t}" for m in registry.architectures() for t in ("z500", "t850", "t2m")} <= presets  # all validated
    cases = {
        "trainer: {max_epochs: many}\nmodel: {family: mlp}\n": "max_epochs",
        "model: {family: resnet}\n": "resnet",  # no such family
        "model: {family: unet, net: {hidden: 3}}\n": "hidden",  # another family's option
        "model: {family: transformer}\n": "members",  # reads members, the spec has none
        "data: {cfg: {sample: {target: t999}}}\n": "t999",
    }
    files = []
    for i, text in enumerate(cases):
        files.append(tmp_path / f"bad_train_{i}.yaml")
        files[-1].write_text(text)
    proc = cli("config", "validate", *map(str, files))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == len(cases), proc.stderr
    for path, line, why in zip(files, lines, cases.values(), strict=True):
        assert line.startswith(f"{path}: INVALID") and why in line, line


def test_paths_live_in_one_file_and_presets_stack():
    """The store path is written in configs/paths.yaml only; a preset plus fragments resolve to their
    union (later files win), with the store from the paths fragment."""
    from postcast.pipeline.train import data_config, resolve

    yamls = (ROOT / "configs").rglob("*.yaml")
    naming = sorted(str(p.relative_to(ROOT)) for p in yamls if "store.zarr" in p.read_text())
    assert naming == ["configs/paths.yaml"]
    args = [
        "-c",
        str(ROOT / "configs/train/unet_t850.yaml"),
        "-c",
        str(ROOT / "configs/fragments/gpu.yaml"),
        "-c",
        str(ROOT / "configs/fragments/big_cache.yaml"),
        "--data.cfg.batch_size",
        "2",
    ]
    cfg = resolve(args)
    assert cfg["trainer"]["accelerator"] == "gpu" and cfg["trainer"]["max_epochs"] == 12  # fragment + preset
    assert cfg["model"] == {
        "family": "unet",
        "net": {"base_filters": 32, "embedding": 32, "head": 256, "smoothing": 2, "norm": "none"},
        "lr": 0.001,
        "weight_decay": 0.0,
        "schedule": "plateau",
        "lr_patience": 2,
        "distribution": None,
        "scale": "blend",
        "point_lr": 1.0,
        "normalisation": "channel",
    }  # None: the target's family (gaussian)
    data = data_config(cfg)
    assert data.store == "runs/quickstart/store.zarr" and data.loader == "clairvoyant" and data.batch_size == 2
    assert data.sample.target == "t850" and data.sample.variables == ("t", "z", "q", "w", "d", "u", "v", "tcc")


@pytest.mark.parametrize("form", ["two words", "equals"])
def test_a_nested_net_option_is_set_alone(form):
    """``--model.net.smoe.experts 4`` sets that one option of the SMoE and keeps the preset's others; the
    parser alone replaced ``net.smoe`` with ``{experts: '4'}`` (text, refused by the architecture, the gate,
    RC loss and quantile of the preset dropped)."""
    from postcast.pipeline.train import resolve

    preset = str(ROOT / "configs/train/unet_smoe_t2m.yaml")
    flag = ["--model.net.smoe.experts", "4"] if form == "two words" else ["--model.net.smoe.experts=4"]
    before = resolve(["-c", preset])["model"]["net"]
    after = resolve(["-c", preset, *flag, "--model.net.head", "256"])["model"]["net"]
    assert after == {**before, "smoe": {**before["smoe"], "experts": 4}, "head": 256}
    deeper = resolve(["-c", preset, *flag, "--model.net.smoe.gate", "conv"])["model"]["net"]["smoe"]
    assert deeper == {**before["smoe"], "experts": 4, "gate": "conv"}  # two nested flags, each kept


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_train_help_is_lightnings(cli, flag):
    """`postcast train --help` reaches the Lightning CLI (it was refused as an unrecognized argument)."""
    proc = cli("train", flag)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage: postcast train" in proc.stdout and "{fit,validate,test,predict}" in proc.stdout
    assert "no configs/paths.yaml" not in proc.stderr


def test_unknown_arguments_are_still_refused(cli):
    proc = cli("inspect", "s.zarr", "--colour", "blue")
    assert proc.returncode == 2 and "unrecognized arguments: --colour blue" in proc.stderr


def _options(parser, where="postcast"):
    """(verb, action) for every option of every verb and sub-verb."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{where} {name}")
        elif action.option_strings and not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield where, action


def test_every_option_says_what_it_does_and_its_default():
    from postcast.main import HelpFormatter, build_parser

    fmt = HelpFormatter("postcast")
    undocumented = [f"{v} {a.option_strings[0]}" for v, a in _options(build_parser()) if not a.help]
    no_default = [
        f"{v} {a.option_strings[0]}"
        for v, a in _options(build_parser())
        if a.default not in (None, False, [], ())
        and not a.required
        and not isinstance(a, argparse._StoreConstAction)  # a switch: the flag says what it does, not its default
        and "default" not in fmt._get_help_string(a)
    ]
    assert undocumented == [] and no_default == []
    text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    assert "--host HOST" in text and "(default: 127.0.0.1)" in text


def test_every_verb_module_is_on_the_command_line():
    """Each cli/verb_*.py is listed in main.VERBS, has the verb interface (add_parser, run) and adds a command
    whose parser runs that module."""
    import importlib

    from postcast.main import VERBS, build_parser

    modules = {f"postcast.{p.stem}" for p in (ROOT / "cli").glob("verb_*.py")}
    assert {v.__name__ for v in VERBS} == modules and len(VERBS) == len(modules)
    commands = build_parser()._subparsers._group_actions[0].choices
    for name in sorted(modules):
        verb = importlib.import_module(name)
        assert callable(verb.add_parser) and callable(verb.run), name
        assert any(p.get_default("verb") is verb for p in commands.values()), f"{name} adds no command"
    assert all(p.get_default("verb") in VERBS for p in commands.values())


def test_run_help_describes_every_stage(cli):
    out = cli("run", "--help", check=True).stdout
    for stage in ("download", "ingest", "train", "evaluate", "forecast", "compress"):
        assert stage in out.split("positional arguments")[0], stage


@pytest.mark.system  # a training process on a pseudo-terminal: the system tier
def test_progress_bars_only_on_a_terminal(synth_zarr, tmp_path):
    """In a log file (stderr not a terminal) the ingest's bar ran into its log lines; now there is none,
    and the log lines report progress."""
    import contextlib
    import io

    from postcast.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert main(["ingest", str(synth_zarr), "--out", str(tmp_path / "s.zarr"), "--threads"]) == 0
    text = err.getvalue()
    assert "\r" not in text and "date/s" not in text and "it/s" not in text
    assert "ingest: 18/18 dates (100%)" in text
    assert all(ln[:4].isdigit() for ln in text.splitlines() if ln.strip()), text[-2000:]  # every line a log line


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
def test_lightning_logs_each_line_once_without_adverts(store, tmp_path):
    """A real `postcast train fit` process: Lightning printed each line twice (its own handler and the
    root's), advertised litlogger/litmodels and passed on a torch deprecation about its own code."""
    cmd = [
        sys.executable,
        "-m",
        "postcast",
        "train",
        "fit",
        "-c",
        str(ROOT / "configs/train/tiny_emos_t2m.yaml"),
        "--data.cfg.store",
        str(store),
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.max_epochs",
        "1",
    ]
    err = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stderr
    assert err.count("GPU available") == 1 and err.count("`Trainer.fit` stopped") == 1, err
    assert "💡" not in err and "litlogger" not in err and "LeafSpec" not in err, err


def test_a_bug_inside_ingest_is_an_internal_error_with_a_log(cli, synth_zarr, tmp_path, monkeypatch, internal_error):
    """A bug is not the user's bad data (65) and not a traceback (1): exit 70, the trace in a log file."""
    planted_bug, assert_internal_error = internal_error
    monkeypatch.setattr("postcast.datasets.ingest.tasks.load_date", planted_bug)  # runs in the date tasks
    proc = cli("ingest", str(synth_zarr), "--out", str(tmp_path / "s.zarr"), "--threads")
    assert_internal_error(proc)


def _codes_in(text: str, start: str) -> set[int]:
    """The exit codes a passage (from ``start`` to the next blank line) lists as "<code> <meaning>"."""
    import re

    passage = text[text.index(start) :]
    passage = passage[: passage.find("\n\n")]
    return {int(c) for c in re.findall(r"(?<![\w.])(\d{1,3})\s+[a-z(]", passage)}


def test_exit_codes_come_from_one_table(cli):
    """README, the architecture doc, --help and the error classes agree with errors.EXIT_CODES (two of five
    former lists omitted 74)."""
    from postcast.datasets.core import errors
    from postcast.main import INTERNAL, INTERRUPTED

    table = set(errors.EXIT_CODES)
    assert _codes_in((ROOT / "README.md").read_text(), "Exit codes (") == table
    assert _codes_in((ROOT / "docs/architecture.md").read_text(), "codes (`errors.EXIT_CODES`") == table
    classes = {errors.ConfigError, errors.BadInputError, errors.MissingInputError, errors.OutputError}
    assert {c.exit_code for c in classes} | {0, INTERNAL, INTERRUPTED, errors.TERMINATED} == table
    out = cli("--help", check=True).stdout
    assert all(f"{code:>3}  {meaning}" in out for code, meaning in errors.EXIT_CODES.items())


class _Payload:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
def test_train_ckpt_path_goes_through_the_checkpoint_gate(cli, store, tmp_path):
    """`train fit/test --ckpt_path` used tampered checkpoints (no checksum check) and answered a crafted
    pickle with a traceback; it now refuses them like forecast and evaluate do: one line, exit 65."""
    import torch

    common = [
        "-c",
        str(ROOT / "configs/train/tiny_emos_t2m.yaml"),
        "--data.cfg.store",
        str(store),
        "--trainer.default_root_dir",
        str(tmp_path / "runs"),
        "--trainer.max_epochs",
        "1",
    ]
    cli("train", "fit", *common, check=True)
    good = next((tmp_path / "runs").rglob("last.ckpt"))
    ckpt = torch.load(good, weights_only=True)
    downgraded = {**ckpt, "postcast": {k: v for k, v in ckpt["postcast"].items() if k != "checksum"}}
    downgraded["postcast"]["format_version"] = 2
    flipped = {**ckpt, "state_dict": {k: v + (1e-3 if k == "net.coef" else 0) for k, v in ckpt["state_dict"].items()}}
    planted = tmp_path / "created_by_the_checkpoint"
    cases = {
        "downgraded": (downgraded, "checkpoint format 2"),
        "flipped": (flipped, "do not match the checksum"),
        "crafted": ({"postcast": {}, "hook": _Payload(str(planted))}, "not a readable checkpoint"),
    }
    for name, (content, says) in cases.items():
        path = tmp_path / f"{name}.ckpt"
        torch.save(content, path)
        for verb in ("fit", "test"):
            proc = cli("train", verb, *common, "--ckpt_path", str(path))
            lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("postcast: error:")]
            assert proc.returncode == 65 and len(lines) == 1 and says in lines[0], (name, verb, proc.stderr[-2000:])
            assert "weights_only=False" not in proc.stderr and "Traceback" not in proc.stderr
    assert not planted.exists()
    assert cli("train", "test", *common, "--ckpt_path", str(good)).returncode == 0


def test_asyncio_leftovers_stay_out_of_the_error_output():
    """A library's unretrieved future, garbage-collected while a verb runs, added a multi-line ERROR to
    the one-line answer (seen in CI: dask's tornado timeout logged during `inspect --verify`); it is
    shown at --log-level DEBUG only."""
    import contextlib
    import io
    import logging

    from postcast.main import _log_handler

    root, before = logging.getLogger(), logging.getLogger().level
    for level, shown in (("INFO", False), ("DEBUG", True)):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            handler = _log_handler(level)
        try:
            logging.getLogger("asyncio").error("Future exception was never retrieved\nfuture: <Future finished>")
            logging.getLogger("postcast").error("a real error")
        finally:
            root.removeHandler(handler)
            root.setLevel(before)
        assert ("never retrieved" in err.getvalue()) == shown and "a real error" in err.getvalue()


def test_ctrl_c_at_the_start_of_a_dask_call_stays_one_line():
    """Ctrl-C that reaches a dask call before its coroutine has started: distributed's ``sync`` queues its
    ``cancel`` callback, which reads a future not yet made, and tornado logged that NameError with its
    traceback before postcast's one line (seen in CI, in an ingest interrupted as it started indexing). The
    race is made here with a real client whose event loop is busy when the interrupt arrives; a handler of
    the test's own on tornado's logger shows the record was logged, postcast's handler leaves it out."""
    import asyncio
    import contextlib
    import io
    import logging
    import signal
    import threading
    import time

    from dask.distributed import Client, LocalCluster

    from postcast.main import _log_handler

    class Seen(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    root, before, seen = logging.getLogger(), logging.getLogger().level, Seen()
    tornado = logging.getLogger("tornado.application")
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, Client(cluster) as client:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            handler = _log_handler("INFO")
        tornado.addHandler(seen)
        try:
            client.loop.add_callback(time.sleep, 0.5)  # the loop is busy: the call's coroutine waits
            main = threading.main_thread().ident
            assert main is not None and threading.get_ident() == main  # where Ctrl-C lands
            threading.Timer(0.1, signal.pthread_kill, (main, signal.SIGINT)).start()  # a real signal: wakes the wait
            with contextlib.suppress(KeyboardInterrupt):
                client.sync(asyncio.sleep, 0)  # interrupted before its coroutine ran
            time.sleep(1.0)  # the loop runs the coroutine, then the queued cancel
            logging.getLogger("postcast").error("a real error")
        finally:
            tornado.removeHandler(seen)
            root.removeHandler(handler)
            root.setLevel(before)
    assert any(r.exc_info and isinstance(r.exc_info[1], NameError) for r in seen.records), seen.records
    assert "NameError" not in err.getvalue() and "a real error" in err.getvalue(), err.getvalue()
