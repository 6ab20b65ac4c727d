"""A pipeline's config (YAML ``kind: pipeline``) and the configs of the stages it runs (ingest, evaluate,
forecast), built from it: once to check them before anything runs (:func:`check_stages`, from the config
itself, so ``config validate`` and ``run --dry-run`` refuse what a later stage would), again by
:mod:`postcast.pipeline.run` to run each stage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from postcast.datasets import schema
from postcast.datasets.core import config
from postcast.datasets.core.errors import ConfigError
from postcast.datasets.synth.synthetic import SynthConfig
from postcast.pipeline.jobs import CompressJob, DownloadJob

if TYPE_CHECKING:
    from postcast.datasets.ingest.run import IngestConfig
    from postcast.pipeline.forecast import ForecastConfig
    from postcast.pipeline.verify.evaluate import EvalConfig


@config.register("pipeline")
@dataclass(frozen=True)
class PipelineConfig:
    """A whole run (YAML ``kind: pipeline``; see configs/quickstart.yaml)."""

    workdir: str = "runs/quickstart"
    synth: SynthConfig | None = None  # synthesise the input ...
    source: str | None = None  # ... or ingest raw forecasts from here (GRIB / netCDF / zarr)
    truth: str | None = None  # truth next to ``source`` when None
    splits: schema.Splits = field(default_factory=schema.Splits)
    workers: int = 2  # dask LocalCluster workers for ingest
    processes: bool = True  # LocalCluster of processes (False: threads, for small runs and tests)
    train: tuple[str, ...] = ()  # Lightning training presets, e.g. configs/train/unet_t850.yaml
    train_args: tuple[str, ...] = ()  # extra Lightning CLI arguments for every training run
    evaluate: bool = True
    split: str = "test"  # evaluation split
    bootstrap: int = 1000
    forecast_from: str | None = None  # batch forecast of every trained model for these init times
    forecast_to: str | None = None  # (inclusive; default: forecast_from) -> WORKDIR/forecasts
    compress: tuple[CompressJob, ...] = ()  # neural-field artefacts of training fields -> WORKDIR/compressed
    download: DownloadJob | None = None  # fetch the real ENS-10 (+ ERA5) into download.out before ingest

    def __post_init__(self) -> None:
        if (self.synth is None) == (self.source is None):
            msg = "pipeline: give exactly one of 'synth' (a synth config mapping) or 'source' (raw forecasts)"
            raise ConfigError(msg)
        missing = [p for p in self.train if not Path(p).exists()]
        if missing:
            msg = f"pipeline.train: preset files not found: {missing} (paths are relative to the working directory)"
            raise ConfigError(msg)
        if self.split not in ("train", "val", "test"):
            msg = f"pipeline.split {self.split!r}: use train, val or test"
            raise ConfigError(msg)
        if self.download is not None and self.source is None:
            msg = "pipeline.download: give 'source' too (the ingest reads the downloaded files from there)"
            raise ConfigError(msg)
        check_stages(self)

    @property
    def root(self) -> Path:
        return Path(self.workdir)

    @property
    def store(self) -> Path:
        return self.root / "store.zarr"


# --- the stages' own configs: built once to check them (check_stages), again to run them -------------
def ingest_config(cfg: PipelineConfig, progress: bool = False) -> IngestConfig:
    """The ingest stage's config. The manifest decides that the stage runs (never done, inputs or settings
    changed, or forced): a complete store in the way is rebuilt (``overwrite``), never kept as done (an
    interrupted one still resumes)."""
    from postcast.datasets.ingest.run import IngestConfig

    source = cfg.source if cfg.source is not None else str(cfg.root / "synth")
    return IngestConfig(
        source=source,
        out=str(cfg.store),
        truth=cfg.truth,
        splits=cfg.splits,
        workers=cfg.workers,
        processes=cfg.processes,
        progress=progress,
        overwrite=True,
    )


def eval_config(cfg: PipelineConfig, checkpoints: list[str]) -> EvalConfig:
    """The evaluate stage's config (the report in WORKDIR/report; each checkpoint named after its preset)."""
    from postcast.pipeline.verify.evaluate import EvalConfig

    names = {c: Path(p).stem for c, p in zip(checkpoints, cfg.train, strict=True)}
    return EvalConfig(
        store=str(cfg.store),
        checkpoints=tuple(checkpoints),
        split=cfg.split,
        out=str(cfg.root / "report"),
        bootstrap=cfg.bootstrap,
        names=names,
    )


def forecast_config(cfg: PipelineConfig, checkpoint: str, preset: str) -> ForecastConfig:
    """The forecast stage's config for one trained model (its product folder named after its preset)."""
    from postcast.pipeline.forecast import ForecastConfig

    assert cfg.forecast_from is not None
    return ForecastConfig(
        checkpoint=checkpoint,
        input=cfg.source if cfg.source is not None else str(cfg.root / "synth"),
        out=str(cfg.root / "forecasts"),
        init_time=cfg.forecast_from,
        end=cfg.forecast_to,
        overwrite=True,
        name=Path(preset).stem,
    )


def check_stages(cfg: PipelineConfig) -> None:
    """The checks each stage makes of its settings, made on the configs the stages will build, so that
    ``config validate``, ``run --dry-run`` and the first stage refuse what a later stage would (a bad
    ``forecast_from``, a negative ``bootstrap``, ``workers: 0``, a ``train_args`` the training parser
    refuses), not after training and evaluation have run: :class:`ConfigError` naming the key."""
    from postcast.pipeline.train import validate_preset

    checks: list[tuple[str, Callable[[], object]]] = [("workers/processes", lambda: ingest_config(cfg))]
    if cfg.evaluate:
        checks.append(("split/bootstrap", lambda: eval_config(cfg, ["?"] * len(cfg.train))))
    if cfg.forecast_from is not None:
        checks.append(("forecast_from/forecast_to", lambda: forecast_config(cfg, "?", "?").window))
    for key, check in checks:
        try:
            check()
        except ConfigError as err:
            msg = f"pipeline.{key}: {err}"
            raise ConfigError(msg) from err
    for preset in cfg.train:
        problem = validate_preset(preset, cfg.train_args)
        if problem is not None:
            msg = f"pipeline.train_args {list(cfg.train_args)} with {preset}: {problem}"
            raise ConfigError(msg)
