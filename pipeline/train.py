"""``postcast train {fit,validate,test,predict}``: the Lightning CLI over postcast's store and models.

Presets live in ``configs/train/`` (LightningCLI YAML: ``trainer``, ``model``, ``data``) and stack
with ``-c`` (later files and flags win). Every run first reads the paths fragment
(:func:`paths_file`: ``configs/paths.yaml``, or the file named by ``$POSTCAST_PATHS``), the one home
of the store path, so presets name none. The model's sample spec, grid and ensemble size are linked
from the instantiated DataModule, and the normalisation statistics are copied into the model at fit
start, so checkpoints are self-describing.

Every YAML the parser reads (``-c`` files, the paths fragment, YAML values) goes through the limits of
:func:`postcast.datasets.core.config.check_yaml` (jsonargparse loader mode :data:`YAML_MODE`); named files
are checked first, so an alias bomb is one line naming the file and the limit (exit 2). SIGTERM ends a
run at once, whatever the loader is waiting for (exit 143, 128 + SIGTERM); SIGINT exits 130.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from jsonargparse.typing import OpenUnitInterval
from lightning.pytorch.callbacks import EarlyStopping, EMAWeightAveraging, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from postcast.datasets.core import config, heap
from postcast.datasets.core.errors import TERMINATED
from postcast.datasets.loaders.datamodule import DataConfig, StoreDataModule
from postcast.models import plugins  # noqa: F401  (plugin classes show up in --help as known subclasses)
from postcast.models.module import PostProcessor, read_checkpoint
from postcast.models.postprocessors import LocalEMOS
from postcast.pipeline import stopping

LIGHTNING_CKPT_KEYWORDS = ("last", "best", "hpc")  # --ckpt_path values Lightning resolves itself


class PostcastCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: Any) -> None:
        # what every preset used to repeat (a preset is the diff from these; GPU: --trainer.accelerator gpu)
        parser.set_defaults({"trainer.accelerator": "cpu", "trainer.devices": 1, "trainer.log_every_n_steps": 10})
        # model selection on the validation split (never test) ...
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val_crps",
                "checkpoint.mode": "min",
                "checkpoint.filename": "best-{epoch}-{val_crps:.4f}",
                "seed_everything": 0,
            }
        )
        # ... and "last.ckpt" after every epoch for resuming (ModelCheckpoint's own save_last only
        # refreshes it when the best checkpoint changes)
        parser.add_lightning_class_args(ModelCheckpoint, "latest")
        parser.set_defaults(
            {
                "latest.filename": "last",
                "latest.monitor": None,
                "latest.save_top_k": 1,
                "latest.enable_version_counter": False,
            }
        )
        # ... early stopping on the validation CRPS (max_epochs is a ceiling; pipeline/stopping.py)
        parser.add_lightning_class_args(EarlyStopping, "early_stopping")
        parser.set_defaults(stopping.early_stopping_defaults())
        # ... and, when given, validation and checkpoints on an exponential moving average of the weights
        parser.add_argument(
            "--ema_decay",
            type=OpenUnitInterval | None,
            default=None,
            help="average the weights over the training steps, w_avg <- d w_avg + (1 - d) w after each step; "
            "validation, model selection and the checkpoints' weights use the average (e.g. 0.99; none: off)",
        )
        parser.link_arguments(
            "data", "model.sample", compute_fn=lambda dm: dm.cfg.sample.to_dict(), apply_on="instantiate"
        )
        parser.link_arguments("data", "model.grid", compute_fn=lambda dm: dm.grid, apply_on="instantiate")
        parser.link_arguments("data", "model.grid_area", compute_fn=lambda dm: dm.grid_area, apply_on="instantiate")
        parser.link_arguments("data", "model.n_members", compute_fn=lambda dm: dm.n_members, apply_on="instantiate")

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Any:
        """The trainer, with Lightning's EMA weight averaging among its callbacks when ``ema_decay`` is set (it
        swaps the average in for validation and writes it as the checkpoint's weights, the current weights
        beside them for a resumed fit)."""
        decay = self._get(self.config, "ema_decay")
        if decay is not None:
            callbacks = [*callbacks, EMAWeightAveraging(decay=float(decay))]
        return super()._instantiate_trainer(config, callbacks)

    def _parse_ckpt_path(self) -> None:
        """``--ckpt_path`` goes through the gate every use of a checkpoint takes (:func:`read_checkpoint`:
        current format, content checksum, no code in the pickle) before Lightning reads it, which it does
        while parsing (for its hyperparameters); Lightning's keywords (last, best, hpc) pass."""
        sub = self.config.get("subcommand")
        path = self.config[sub].get("ckpt_path") if sub else None
        if path and str(path) not in LIGHTNING_CKPT_KEYWORDS and not str(path).startswith("registry"):
            read_checkpoint(str(path))
        super()._parse_ckpt_path()

    def before_fit(self) -> None:
        """A fit resumed with ``--ckpt_path`` continues the run it comes from: same logger version,
        hence the same checkpoint directory, so ModelCheckpoint restores its best score and best_k_models
        from the checkpoint (it only does when the directory is unchanged) and model selection spans
        the whole run, not the last attempt."""
        self.trainer.callbacks.append(stopping.StopSummary())  # type: ignore[attr-defined]  # LOGDIR/summary.json
        if isinstance(self.model.net, LocalEMOS) and self.model._newton():
            # fitted at train start: an epoch's steps only score the fit, logged at every one (Lightning warned
            # that an epoch of fewer batches than the default interval of 10 logs no step)
            self.trainer.log_every_n_steps = 1  # type: ignore[attr-defined]  # (set by its logger connector)
        version = resumed_version(self.config[self.subcommand].get("ckpt_path"), self.trainer.logger)
        logger = self.trainer.logger
        if version is not None and isinstance(logger, TensorBoardLogger | CSVLogger):
            self.trainer.logger = type(logger)(save_dir=logger.save_dir, name=logger.name, version=version)


def resumed_version(ckpt_path: str | None, logger: Any) -> str | None:
    """The logger version (e.g. ``"version_0"``) a checkpoint was written under, when it lies in this
    logger's run directory (``ROOT/NAME/VERSION/checkpoints/FILE.ckpt``); None otherwise (no resume, a
    checkpoint from elsewhere, or no logger)."""
    if not ckpt_path or logger is None or getattr(logger, "root_dir", None) is None:
        return None
    ckpt = Path(ckpt_path).resolve()
    if ckpt.parent.name != "checkpoints" or ckpt.parents[2] != Path(logger.root_dir).resolve():
        return None
    return ckpt.parents[1].name


SUBCOMMANDS = ("fit", "validate", "test", "predict")


def paths_file() -> Path | None:
    """The paths fragment every training run reads first: ``$POSTCAST_PATHS``, else
    ``configs/paths.yaml`` in the working directory (None when neither exists)."""
    named = os.environ.get("POSTCAST_PATHS")
    path = Path(named) if named else Path("configs/paths.yaml")
    return path if path.is_file() else None


def resolve(args: Sequence[str]) -> dict[str, Any]:
    """The configuration ``postcast train fit ARGS`` would run with (paths fragment, presets and flags
    merged, every default filled in) as plain data, without instantiating anything; raises
    ``ValueError`` with the parser's last line when the arguments are invalid."""
    import io

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            _cli([*args, "--print_config"], subcommands=False)  # the fit parser alone: 4x quicker to build
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise ValueError(_parser_error(err.getvalue()) or f"invalid (exit {stop.code})") from None
    resolved = config.load_yaml(out.getvalue(), "the resolved training configuration")
    return resolved if isinstance(resolved, dict) else {}


NET_FLAG = "--model.net."  # the architecture's options: a free mapping, checked by the family's dataclass


def _fold_net_flags(args: Sequence[str]) -> list[str]:
    """``--model.net.KEY.SUB[...] VALUE`` sets one nested option of the architecture and keeps the others: the
    parser reads a mapping-typed option one key deep (``--model.net.head 256``) and replaced ``net.KEY`` with
    ``{SUB: 'VALUE'}``, the value as text and the preset's other options under KEY dropped. Such a flag
    becomes ``--model.net.KEY MAPPING``: ``net.KEY`` as the arguments before it resolve, with the one option
    set to the YAML value."""
    out: list[str] = []
    rest = iter(args)
    for a in rest:
        flag, eq, value = a.partition("=")
        keys = flag.removeprefix(NET_FLAG).split(".") if flag.startswith(NET_FLAG) else []
        if len(keys) < 2:
            out.append(a)
            continue
        value = value if eq else next(rest, "")
        try:
            net = resolve([x for x in out if x not in SUBCOMMANDS]).get("model") or {}
        except ValueError:  # the arguments before it are wrong: the parser says so on the whole line
            out += [flag, value]
            continue
        current = (net.get("net") or {}).get(keys[0])
        mapping = current if isinstance(current, dict) else {}
        out += [NET_FLAG + keys[0], json.dumps(_set_nested(mapping, keys[1:], _yaml_or_text(value)))]
    return out


def _yaml_or_text(value: str) -> Any:
    """A flag's value as the parser reads one: YAML, or the text itself when it is no YAML (then refused by the
    option's type, naming it)."""
    import yaml

    try:
        return _load_yaml_value(value)
    except yaml.YAMLError:
        return value


def _set_nested(mapping: dict[str, Any], keys: list[str], value: Any) -> dict[str, Any]:
    """A copy of ``mapping`` with ``mapping[k0][k1]...`` set to ``value`` (missing levels made)."""
    inner = mapping.get(keys[0])
    child = _set_nested(inner if isinstance(inner, dict) else {}, keys[1:], value) if len(keys) > 1 else value
    return {**mapping, keys[0]: child}


def _parser_error(text: str) -> str:
    """The parser's error as one line: from its ``error:`` line on (the key, then what was wrong)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if "error:" in ln), max(len(lines) - 1, 0))
    return " ".join(lines[start:])[:1000]


def built(args: Sequence[str]) -> PostcastCLI:
    """The model and data module ``postcast train fit ARGS`` would train (``.model``, ``.datamodule``), built
    without training: for benchmarks that time one part of a training."""
    return _cli(args, subcommands=False)


def data_config(args: Sequence[str] | dict[str, Any]) -> DataConfig:
    """The DataConfig a training run with ``args`` (e.g. ``["-c", preset]``, or their :func:`resolve`d
    configuration) would read."""
    cfg = args if isinstance(args, dict) else resolve(args)
    data = (cfg.get("data") or {}).get("cfg") or {}
    return config.from_dict(DataConfig, data, where="data.cfg")


def validate_preset(path: str, args: Sequence[str] = ()) -> str | None:
    """Check a training preset (with the paths fragment) and extra arguments after it (a pipeline's
    ``train_args``) without instantiating anything: the Lightning parser's checks, then the architecture's
    options (``model.family``), the predictive family (``model.distribution``) and the sample spec. None if
    valid, else the error."""
    from postcast.datasets.core.errors import ConfigError
    from postcast.models import distributions, registry

    try:
        cfg = resolve(["--config", path, *args])
        model = cfg.get("model") or {}
        arch = registry.make(model.get("family", "mlp"), model.get("net"))
        if model.get("distribution"):  # None: the target's family (a registered one)
            distributions.get(model["distribution"])
        spec = data_config(cfg).sample
    except (ValueError, ConfigError) as err:
        return str(err)
    if arch.needs_members and not spec.members:
        return f"model.family {arch.name!r} reads the raw members: set data.cfg.sample.members: true"
    return None


class _NoAdverts(logging.Filter):
    """Drops Lightning's "💡 Tip: ... try installing [another package]" records."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡")


def quiet_lightning() -> None:
    """Each of Lightning's log records once, in the application's format, and no noise a user cannot act on.

    * Lightning adds a console handler of its own to the ``lightning`` logger at import and lets records
      propagate, so an application that logs to the root logger (the ``postcast`` command, a pipeline's
      log file) printed every record twice; with a root handler in place, Lightning's is removed.
    * Its tips advertise other packages (litlogger, litmodels).
    * ``isinstance(treespec, LeafSpec) is deprecated``: torch warns about Lightning's own code.
    """
    import warnings

    if logging.getLogger().handlers:
        logging.getLogger("lightning").handlers.clear()
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _NoAdverts) for f in rank_zero.filters):
        rank_zero.addFilter(_NoAdverts())
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")


YAML_MODE = "postcast_yaml"  # jsonargparse parser mode: its YAML loader within config.check_yaml's limits


def _load_yaml_value(text: str) -> Any:
    """jsonargparse's own YAML loader, after the size and alias checks (for every config file and value)."""
    from jsonargparse import get_loader

    config.check_yaml(text, "a YAML config or value given to `postcast train`")
    return get_loader("yaml")(text)


def _config_files(args: Sequence[str], paths: Path | None) -> list[str]:
    """The files the parser will read: the paths fragment and every ``-c``/``--config`` that names a file."""
    named = [str(paths)] if paths else []
    for i, a in enumerate(args):
        value = args[i + 1] if a in ("-c", "--config") and i + 1 < len(args) else a.partition("=")[2]
        if (a in ("-c", "--config") or a.startswith("--config=")) and _is_file(value):
            named.append(value)
    return named


def _is_file(value: str) -> bool:
    """Whether ``value`` names a file (``--config`` also takes YAML text, which may be no valid path)."""
    try:
        return Path(value).is_file()
    except (OSError, ValueError):
        return False


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread wherever it waits (a loader's queue, a prefetch
    entry), so the run ends at once; a BaseException like KeyboardInterrupt, so no ``except Exception``
    swallows it."""


def _raise_terminated(signum: int, frame: Any) -> None:
    sys.excepthook = _log_late_error  # the loader's workers go down with the run: their pipes break
    raise Terminated(signum)


def _log_late_error(kind: type[BaseException], err: BaseException, tb: Any) -> None:
    """After SIGTERM, a helper thread's error from a worker going down (multiprocessing's
    resource sharer reports a reset connection through ``sys.excepthook``) is expected: logged at
    DEBUG, so stderr keeps the one line saying the run was terminated."""
    logging.getLogger(__name__).debug("after SIGTERM: %s: %s", kind.__name__, err, exc_info=(kind, err, tb))


def _quiet_worker_handshakes(hook: Any, kind: type[BaseException], err: BaseException, tb: Any) -> None:
    """During a run, multiprocessing's resource sharer reports a loader worker that went away in the middle
    of a handshake through ``sys.excepthook``: a signal stopping the run does that, sometimes before the
    SIGTERM handler has run (Lightning's runs first), and a worker dying on its own is reported by the
    loader. Logged at DEBUG; anything else goes to ``hook``."""
    frames = traceback.extract_tb(tb)
    if isinstance(err, OSError | EOFError) and any(f.filename.endswith(_RESOURCE_SHARER) for f in frames):
        _log_late_error(kind, err, tb)
    else:
        hook(kind, err, tb)


_RESOURCE_SHARER = os.path.join("multiprocessing", "resource_sharer.py")


@contextlib.contextmanager
def _signals_end_the_run() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` (Lightning's own handler only sets a flag checked between
    batches, and a loader blocked on a dead thread never reaches one); exit 143. Lightning turns a
    KeyboardInterrupt (SIGINT) into ``sys.exit(1)``: it leaves as KeyboardInterrupt (the CLI's exit 130)."""
    main_thread = threading.current_thread() is threading.main_thread()  # (only it may set handlers)
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    hook = sys.excepthook
    sys.excepthook = quiet = functools.partial(_quiet_worker_handshakes, hook)
    try:
        yield
    except Terminated:
        print("postcast: terminated (SIGTERM); resume with --ckpt_path LOGDIR/checkpoints/last.ckpt", file=sys.stderr)
        raise SystemExit(TERMINATED) from None
    except SystemExit as stop:
        if isinstance(stop.__context__, KeyboardInterrupt):
            raise KeyboardInterrupt from None
        raise
    finally:
        if sys.excepthook is quiet:  # after SIGTERM it stays _log_late_error: the workers go down after the run
            sys.excepthook = hook
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def run(args: Sequence[str]) -> PostcastCLI:
    """Run the Lightning CLI on ``args``; returns the CLI (``cli.trainer.checkpoint_callback
    .best_model_path`` after ``fit``). ``sys.argv`` is left alone: DDP's launcher re-runs it for the
    other ranks. Threads started from here on share glibc's arenas (:func:`heap.one_arena`)."""
    heap.one_arena()
    return _cli(args, subcommands=True)


def _cli(args: Sequence[str], *, subcommands: bool) -> PostcastCLI:
    """The Lightning CLI on ``args``: with its subcommands (``fit ...``: :func:`run`), or the training
    parser alone (``run=False``: what :func:`resolve` prints with ``--print_config``)."""
    import warnings

    import yaml
    from jsonargparse import set_loader

    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")  # by design, see above
    quiet_lightning()
    paths = paths_file()
    for path in _config_files(args, paths):
        config.read_yaml(path)  # the limits, naming the file (the parser would name neither)
    set_loader(YAML_MODE, _load_yaml_value, exceptions=(yaml.YAMLError,))
    read_paths = {"default_config_files": [str(paths)]} if paths else {}
    defaults = {sub: {"parser_mode": YAML_MODE, **read_paths} for sub in SUBCOMMANDS} if subcommands else read_paths
    if paths is None and not any(str(a).startswith("--data.cfg.store") or a in ("-h", "--help") for a in args):
        print(
            "postcast train: no configs/paths.yaml in this directory and $POSTCAST_PATHS is unset: the store "
            "must come from a preset or --data.cfg.store STORE",
            file=sys.stderr,
        )
    with _signals_end_the_run():
        return PostcastCLI(
            PostProcessor,
            StoreDataModule,
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"prog": "postcast train", "parser_mode": YAML_MODE, **defaults},
            args=_fold_net_flags(args),
            run=subcommands,
        )
