"""What the benchmarks share: the store they read.

Every benchmark that needs the training store defaults to the quickstart's
(``runs/quickstart/store.zarr``: synthetic ENS-10, 5 deg, 160 init dates, 128 for training); the skill
benchmark to the targets run's (``runs/targets/store.zarr``: the same world with the truths of all five
targets). When the default is missing, :func:`require_store` builds it by running that pipeline's synth
and ingest stages only (same config, same manifest), so a later ``postcast run configs/<run>.yaml``
skips them; any other missing ``--store`` is an error.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
DEFAULT_STORE = ROOT / "runs" / "quickstart" / "store.zarr"
TARGETS_RUN = ROOT / "configs" / "targets.yaml"  # its store has truth for z500, t850, t2m, ws10 and tp24
TARGETS_STORE = ROOT / "runs" / "targets" / "store.zarr"


def require_store(store: str | Path, default: Path = DEFAULT_STORE, pipeline: Path = QUICKSTART) -> str:
    """``store`` as a string; the ``default`` store of the ``pipeline`` config is built when absent (~1 min on
    2 cores)."""
    path = Path(store).resolve()
    if path.exists():
        return str(store)
    if path != default:
        raise SystemExit(
            f"{store}: no such store (exit 66); build one with `postcast synth` + `postcast ingest`, "
            f"or leave --store at its default ({default}), which is built on demand"
        )
    import os

    from postcast.datasets.core import config
    from postcast.pipeline.run import run

    cfg = config.load(pipeline, expect_kind="pipeline")
    data_only = dataclasses.replace(cfg, train=(), evaluate=False, forecast_from=None, compress=())
    cwd = os.getcwd()
    os.chdir(ROOT)  # the pipeline's paths are relative to the repository
    try:
        run(data_only)
    finally:
        os.chdir(cwd)
    return str(store)
