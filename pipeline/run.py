"""The staged pipeline behind ``postcast run configs/quickstart.yaml``.

Stages, in data order: ``synth`` (or raw forecasts given as ``source``) -> ``ingest`` (store and
training statistics) -> ``train:<preset>`` per training preset -> ``evaluate`` (metrics + report)
-> ``forecast`` (CF files for ``forecast_from``..``forecast_to``, optional) and ``compress:<name>``
(neural-field artefacts of the fields a training preset reads, optional; train from them with
:class:`postcast.compression.loader.CompressedDataModule`). Each stage calls the same library function as its CLI verb.

Bookkeeping lives in ``WORKDIR/manifest.json``: per stage the hash of its config and of its inputs
(upstream outputs, identified by path, size and modification time), its outputs (with their size and
modification time) and timings. A stage whose hash matches and whose outputs are those it recorded is
skipped, so a rerun does nothing; ``force`` reruns named stages (and, through the input hashes, whatever
their new outputs feed). A stage's record is dropped on disk before it runs, so a run killed inside a stage
(forced or not) leaves it to run again, never "done" over half-rewritten outputs. A killed
run resumes: synth and ingest resume themselves, training continues from its ``last.ckpt``, but only
a run with this run's :func:`fingerprint` (preset, arguments, store and splits, recorded in
``runs/<preset>/fingerprint.json``): a run from other settings is neither resumed nor selected, the
stage trains anew (and evaluate and forecast rerun on the new checkpoint).
Each run appends to ``WORKDIR/logs/pipeline.log`` and writes ``WORKDIR/summary.json``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from postcast.datasets import io
from postcast.datasets.core.errors import ConfigError, PostcastError
from postcast.pipeline import pipeline_config
from postcast.pipeline.jobs import CompressJob, DownloadJob
from postcast.pipeline.pipeline_config import PipelineConfig  # the config kind 'pipeline' (pyproject.toml)

log = logging.getLogger(__name__)

MANIFEST_VERSION = 1
MAX_WRMSE_OVER_STD = 0.1  # a compressed field worth having: weighted RMSE at most a tenth of its spread


@dataclass
class Stage:
    name: str
    settings: dict[str, Any]  # what the stage's result depends on (hashed)
    inputs: list[str]  # names of upstream stages
    action: Callable[[bool], list[str]]  # runs the stage (argument: fresh, i.e. forced), returns outputs
    listing: Callable[[], list[dict[str, Any]]] | None = None  # files a dry run lists (download)
    details: Callable[[list[str]], dict[str, Any]] | None = None  # measures of the outputs, kept in the summary


def _identity(path: str) -> str:
    p = Path(path)
    if not p.exists():
        return f"{path}:missing"
    st = p.stat()
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


class Manifest:
    def __init__(self, path: Path):
        self.path = path
        data = json.loads(path.read_text()) if path.exists() else {}
        self.stages: dict[str, Any] = data.get("stages", {})

    def stage_hash(self, stage: Stage) -> str:
        upstream = {n: [_identity(o) for o in self.stages.get(n, {}).get("outputs", [])] for n in stage.inputs}
        blob = json.dumps({"settings": stage.settings, "upstream": upstream}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def is_done(self, stage: Stage) -> bool:
        """Recorded with this stage's hash, and every output is the file the record names: there, of the
        size and modification time it had when the stage finished (a record from before output identities
        were kept checks that the outputs exist)."""
        rec = self.stages.get(stage.name)
        if not rec or rec["hash"] != self.stage_hash(stage):
            return False
        if "output_ids" not in rec:
            return all(Path(o).exists() for o in rec["outputs"])
        return [_identity(o) for o in rec["outputs"]] == rec["output_ids"]

    def record(self, stage: Stage, outputs: list[str], seconds: float) -> None:
        self.stages[stage.name] = {
            "hash": "",
            "outputs": outputs,
            "output_ids": [_identity(o) for o in outputs],
            "seconds": round(seconds, 2),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "settings": stage.settings,
            **(stage.details(outputs) if stage.details is not None else {}),
        }
        self.stages[stage.name]["hash"] = self.stage_hash(stage)  # inputs are upstream outputs: stable now
        self.save()

    def forget(self, name: str) -> None:
        self.stages.pop(name, None)

    def starting(self, stage: Stage) -> None:
        """Forget ``stage`` on disk before it runs: a run killed inside it (its outputs half rewritten) leaves
        it undone, so the next run runs it again instead of taking the old record for the new outputs."""
        self.forget(stage.name)
        self.save()

    def save(self) -> None:
        io.write_json(self.path, {"format_version": MANIFEST_VERSION, "stages": self.stages})


# --- stage actions -----------------------------------------------------------------------------
def _synth(cfg: PipelineConfig, progress: bool) -> list[str]:
    from postcast.datasets.synth import synthfiles

    assert cfg.synth is not None
    synthfiles.write_synthetic(cfg.synth, cfg.root / "synth", progress=progress)
    return [str(cfg.root / "synth" / "synth.json")]


def _download(job: DownloadJob, progress: bool) -> list[str]:
    from postcast.datasets import download

    files = job.files()
    download.download(files, job.out, jobs=job.jobs, progress=progress)
    return [str(Path(job.out) / f.name) for f in files]


def _ingest(cfg: PipelineConfig, progress: bool) -> list[str]:
    from postcast.datasets.ingest.run import ingest

    ingest(pipeline_config.ingest_config(cfg, progress))
    return [str(cfg.store / "zarr.json")]


FINGERPRINT = "fingerprint.json"  # in runs/<preset>/: what the runs there were trained from


def fingerprint(cfg: PipelineConfig, preset: str) -> dict[str, Any]:
    """What a trained model depends on: the preset (path and text), the extra arguments, the store
    (its metadata file's path, size and modification time: a new ingest is a new store) and the splits;
    ``id`` is their hash."""
    settings = {
        "preset": preset,
        "preset_text": Path(preset).read_text(),
        "args": list(cfg.train_args),
        "store": _identity(str(cfg.store / "zarr.json")),
        "splits": asdict(cfg.splits),
    }
    blob = json.dumps(settings, sort_keys=True, default=str).encode()
    return {"id": hashlib.sha256(blob).hexdigest()[:16], **settings}


def _stale_versions(root: Path, current: dict[str, Any], fresh: bool) -> set[str]:
    """The logger versions under ``root`` to leave out of resuming and model selection: all of them when
    the recorded fingerprint differs from ``current`` (or ``fresh``), else those the record marks stale.
    Records ``current`` (with the stale versions) before training, so a killed run resumes only its own."""
    record = root / FINGERPRINT
    try:
        before = json.loads(record.read_text()) if record.exists() else {}
    except (OSError, ValueError):
        before = {}  # an unreadable record trusts nothing
    if not fresh and isinstance(before, dict) and before.get("id") == current["id"]:
        return set(before.get("stale", []))
    stale = sorted(p.name for p in root.glob("lightning_logs/version_*"))
    if stale and not fresh:
        log.info("%s: %s trained from other settings (preset, arguments, store or splits): training anew", root, stale)
    root.mkdir(parents=True, exist_ok=True)
    io.write_json(record, {**current, "stale": stale})
    return set(stale)


def _newest(root: Path, pattern: str, stale: set[str]) -> str | None:
    found = [p for p in root.glob(f"lightning_logs/version_*/checkpoints/{pattern}") if p.parents[1].name not in stale]
    return str(max(found, key=lambda p: p.stat().st_mtime)) if found else None


def _train(cfg: PipelineConfig, preset: str, progress: bool, fresh: bool) -> list[str]:
    """Fit one preset; an unfinished earlier attempt with the same :func:`fingerprint` is resumed from its
    last.ckpt unless ``fresh``; runs from other settings are never resumed nor selected."""
    from postcast.pipeline.train import run as lightning

    root = cfg.root / "runs" / Path(preset).stem
    args = [
        "fit",
        "-c",
        preset,
        "--data.cfg.store",
        str(cfg.store),
        "--trainer.default_root_dir",
        str(root),
        "--trainer.enable_progress_bar",
        str(progress).lower(),
        *cfg.train_args,
    ]
    stale = _stale_versions(root, fingerprint(cfg, preset), fresh)
    last = _newest(root, "last.ckpt", stale)
    if last is not None:
        log.info("%s: resuming from %s", preset, last)
        args += ["--ckpt_path", last]
    cli = lightning(args)
    callback = cli.trainer.checkpoint_callback  # the first ModelCheckpoint: val_crps (see postcast.pipeline.train)
    best = getattr(callback, "best_model_path", "") or _newest(root, "best*.ckpt", stale)
    if not best:
        msg = f"{preset}: training finished without a checkpoint under {root}"
        raise PostcastError(msg)
    return [best]


def _evaluate(cfg: PipelineConfig, checkpoints: list[str]) -> list[str]:
    from postcast.pipeline.verify.evaluate import evaluate

    out = cfg.root / "report"
    evaluate(pipeline_config.eval_config(cfg, checkpoints))
    return [str(out / "metrics.json"), str(out / "results.nc"), str(out / "report.html")]


def _forecast(cfg: PipelineConfig, checkpoints: list[str]) -> list[str]:
    from postcast.pipeline.forecast import forecast

    written: list[str] = []
    for ckpt, preset in zip(checkpoints, cfg.train, strict=True):  # one product folder per trained model
        written += forecast(pipeline_config.forecast_config(cfg, ckpt, preset)).written
    return written


def _compress(cfg: PipelineConfig, job: CompressJob, progress: bool) -> list[str]:
    from postcast.compression.loader import compress_split

    art = compress_split(job.data_config(cfg.store), job.field_config(), job.split, progress)
    out = cfg.root / "compressed" / f"{job.name}.pcnf"
    size = art.save(out)
    psnr = min(e["psnr_db"] for e in art.header["errors"].values())
    log.info(
        "compress %s: %d fields, %d bytes, ratio %.1fx, lowest PSNR %.1f dB",
        job.name,
        len(art.header["variables"]),
        size,
        art.ratio,
        psnr,
    )
    return [str(out)]


def compressed_fields(outputs: list[str]) -> dict[str, Any]:
    """Each compressed field's errors (weighted RMSE, its ratio to the field's std, max abs error) and the
    artefact's ratio, for the summary; a field whose weighted RMSE / std exceeds 0.1 is warned about
    (at 1 the artefact is no better than the field's mean)."""
    from postcast.compression.artefact import Artefact

    art = Artefact.load(outputs[0])
    fields = {
        v: {k: float(f"{e[k]:.4g}") for k in ("wrmse", "wrmse_over_std", "max_abs")}
        for v, e in zip(art.header["variables"], art.header["errors"].values(), strict=True)
    }
    for v, e in fields.items():
        if e["wrmse_over_std"] > MAX_WRMSE_OVER_STD:
            log.warning(
                "compress: %s has weighted RMSE / std %.3f (> %.1f): the artefact barely beats the field's "
                "mean; set field.error_bound_std: 0.1 (or fit longer)",
                v,
                e["wrmse_over_std"],
                MAX_WRMSE_OVER_STD,
            )
    return {"ratio": round(art.ratio, 2), "fields": fields}


def stages(cfg: PipelineConfig, manifest: Manifest, progress: bool) -> list[Stage]:
    """The stages of a run, in order (evaluate reads the checkpoints the train stages recorded)."""
    out: list[Stage] = []
    first = "ingest"
    if cfg.synth is not None:
        out.append(Stage("synth", {"synth": asdict(cfg.synth)}, [], lambda fresh: _synth(cfg, progress)))
    fetch = cfg.download
    if fetch is not None:
        out.append(
            Stage(
                "download",
                asdict(fetch),
                [],
                lambda fresh, f=fetch: _download(f, progress),  # type: ignore[misc]
                fetch.listing,
            )
        )
    ingest_settings = {"source": cfg.source, "truth": cfg.truth, "splits": asdict(cfg.splits)}
    upstream = ["synth"] if cfg.synth is not None else ["download"] if fetch is not None else []
    out.append(Stage(first, ingest_settings, upstream, lambda fresh: _ingest(cfg, progress)))
    train_names = []
    for preset in cfg.train:
        name = f"train:{Path(preset).stem}"
        train_names.append(name)
        text = Path(preset).read_text()
        out.append(
            Stage(
                name,
                {"preset": preset, "preset_text": text, "args": list(cfg.train_args), "splits": asdict(cfg.splits)},
                [first],
                lambda fresh, p=preset: _train(cfg, p, progress, fresh),  # type: ignore[misc]
                details=lambda outputs, p=preset: {"fingerprint": fingerprint(cfg, p)["id"]},  # type: ignore[misc]
            )
        )
    if cfg.evaluate:

        def run_eval(fresh: bool) -> list[str]:
            ckpts = [manifest.stages[n]["outputs"][0] for n in train_names]
            return _evaluate(cfg, ckpts)

        out.append(Stage("evaluate", {"split": cfg.split, "bootstrap": cfg.bootstrap}, [first, *train_names], run_eval))
    if cfg.forecast_from is not None and train_names:

        def run_forecast(fresh: bool) -> list[str]:
            return _forecast(cfg, [manifest.stages[n]["outputs"][0] for n in train_names])

        out.append(Stage("forecast", {"from": cfg.forecast_from, "to": cfg.forecast_to}, train_names, run_forecast))
    for job in cfg.compress:
        settings = {"preset_text": Path(job.preset).read_text(), "split": job.split, "field": dict(job.field)}
        out.append(
            Stage(
                f"compress:{job.name}",
                settings,
                [first],
                lambda fresh, j=job: _compress(cfg, j, progress),  # type: ignore[misc]
                details=compressed_fields,
            )
        )
    return out


def run(
    cfg: PipelineConfig, *, force: tuple[str, ...] = (), progress: bool = True, dry_run: bool = False
) -> dict[str, Any]:
    """Run (or, with ``dry_run``, list) the stages; returns the summary also written to summary.json."""
    cfg.root.mkdir(parents=True, exist_ok=True)
    handler = _log_file(cfg.root)
    manifest = Manifest(cfg.root / "manifest.json")
    plan = stages(cfg, manifest, progress)
    for job in cfg.compress:
        job.check_fields()
    unknown = sorted(set(force) - {s.name for s in plan} - {"all"})
    if unknown:
        msg = f"--force {unknown}: no such stage; stages are {[s.name for s in plan]}"
        raise ConfigError(msg)
    summary: dict[str, Any] = {"workdir": str(cfg.root), "stages": {}, "status": "ok"}
    started, start = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.perf_counter()
    try:
        for stage in plan:
            forced = stage.name in force or "all" in force
            if forced:
                manifest.forget(stage.name)
            if manifest.is_done(stage):
                log.info("stage %s: done before (hash %s), skipped", stage.name, manifest.stages[stage.name]["hash"])
                summary["stages"][stage.name] = {"status": "skipped", **manifest.stages[stage.name]}
                continue
            if dry_run:
                summary["stages"][stage.name] = {"status": "would run"}
                if stage.listing is not None:
                    summary["stages"][stage.name]["files"] = stage.listing()
                continue
            log.info("stage %s: running", stage.name)
            manifest.starting(stage)
            t0 = time.perf_counter()
            try:
                outputs = stage.action(forced)
            except BaseException:
                summary["stages"][stage.name] = {"status": "failed", "seconds": round(time.perf_counter() - t0, 2)}
                summary["status"] = "failed"
                raise
            manifest.record(stage, outputs, time.perf_counter() - t0)
            summary["stages"][stage.name] = {"status": "ran", **manifest.stages[stage.name]}
            log.info("stage %s: finished in %.1f s", stage.name, time.perf_counter() - t0)
    finally:
        _finish_summary(summary, cfg.root / "summary.json", started, time.perf_counter() - start)
        summary["disk_bytes"], summary["disk_files"] = _disk_use(cfg.root)
        if "evaluate" in manifest.stages:
            summary["report"] = manifest.stages["evaluate"]["outputs"][-1]
        if not dry_run:
            io.write_json(cfg.root / "summary.json", summary)
        logging.getLogger().removeHandler(handler)
        handler.close()
    return summary


def _finish_summary(summary: dict[str, Any], previous: Path, started: str, seconds: float) -> None:
    """Totals and history. Each stage's ``seconds`` is what its current outputs took, from the run
    that made them (a skipped stage keeps its first run's time); ``seconds`` is their sum, the cost of
    the outputs; ``runs`` lists every run in this work directory (start, wall time, stages run)."""
    try:
        runs = json.loads(previous.read_text()).get("runs", []) if previous.exists() else []
    except (OSError, ValueError, AttributeError):
        runs = []  # an unreadable earlier summary loses its history, not this run
    ran = [n for n, st in summary["stages"].items() if st["status"] in ("ran", "failed")]
    summary["seconds"] = round(sum(st.get("seconds", 0.0) for st in summary["stages"].values()), 2)
    summary["runs"] = [
        *runs,
        {"started": started, "seconds": round(seconds, 2), "ran": ran, "status": summary["status"]},
    ]


def _disk_use(root: Path) -> tuple[int, int]:
    """Bytes and files under the work directory (inputs, store, runs, reports, forecasts, artefacts)."""
    sizes = [p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    return sum(sizes), len(sizes)


def _log_file(root: Path) -> logging.Handler:
    (root / "logs").mkdir(exist_ok=True)
    handler = logging.FileHandler(root / "logs" / "pipeline.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    logging.getLogger().addHandler(handler)
    return handler
