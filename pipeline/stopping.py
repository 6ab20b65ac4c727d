"""When and why a training run stopped: early stopping on the validation CRPS, and the run's summary.json.

Every ``postcast train fit`` stops on the first of: the local EMOS's full-batch fit converged (one epoch
validates and saves it, :mod:`postcast.models.emos_fit`), early stopping (``val_crps`` has not improved by
``early_stopping.min_delta`` for ``early_stopping.patience`` validations; Lightning's
:class:`~lightning.pytorch.callbacks.EarlyStopping`), or ``trainer.max_epochs`` (a ceiling). The
:class:`StopSummary` callback logs the reason and writes it with the validation history to
``LOGDIR/summary.json``; a run whose best validation CRPS is its last epoch (still improving when it
stopped) gets a warning in both.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from postcast.datasets import io

log = logging.getLogger(__name__)
MONITOR = "val_crps"
UNSETTLED = "the EMOS fit reached its iteration ceiling with points short of the convergence criterion (see fit)"
STILL_IMPROVING = "the best val_crps is the last epoch's: the model may not have converged; raise trainer.max_epochs"


def stop_reason(trainer: L.Trainer, model: Any) -> str:
    """Why the run ended: converged (the EMOS's full-batch fit, every point), fit_max_iter (the fit's iteration
    ceiling, some points short of the criterion), early_stopping, max_epochs or interrupted."""
    fit = getattr(model, "fit_report", None)
    if fit is not None:
        settled = sum(fit.get(k, 0) for k in ("converged_points", "stalled_points", "limit_points", "kept_points"))
        return "converged" if settled == fit["points"] else "fit_max_iter"
    stopper = trainer.early_stopping_callback
    if stopper is not None and stopper.stopped_epoch > 0:
        return "early_stopping"
    if trainer.max_epochs is not None and 0 < trainer.max_epochs <= trainer.current_epoch:
        return "max_epochs"
    return "interrupted"


class StopSummary(Callback):
    """Records ``val_crps`` after each epoch's validation; at the end of fit, logs why the run stopped and
    writes ``summary.json`` in the run's log directory."""

    def __init__(self) -> None:
        self.history: list[float] = []  # val_crps per epoch

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = trainer.callback_metrics.get(MONITOR)
        if not trainer.sanity_checking and value is not None:
            self.history.append(float(value))

    def summary(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        finite = [v if math.isfinite(v) else math.inf for v in self.history]
        best = min(range(len(finite)), key=finite.__getitem__) if finite else None
        reason = stop_reason(trainer, pl_module)
        stopper = trainer.early_stopping_callback
        fitted = getattr(pl_module, "fit_report", None) is not None
        warnings = [STILL_IMPROVING] if not fitted and best is not None and best == len(finite) - 1 else []
        if reason == "fit_max_iter":
            warnings.append(UNSETTLED)
        return {
            "reason": reason,
            "epochs_run": len(self.history),
            "stopped_epoch": trainer.current_epoch - 1 if self.history else None,
            "max_epochs": trainer.max_epochs,
            "best_epoch": best,
            "best_val_crps": finite[best] if best is not None else None,
            "val_crps": self.history,
            "patience": stopper.patience if stopper is not None else None,
            "min_delta": abs(stopper.min_delta) if stopper is not None else None,
            "fit": getattr(pl_module, "fit_report", None),
            "warnings": warnings,
        }

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        folder = Path(trainer.log_dir or trainer.default_root_dir)  # under DDP a broadcast: every rank asks
        if not trainer.is_global_zero:
            return
        out = self.summary(trainer, pl_module)
        log.info(
            "training stopped after %d epoch(s): %s (best val_crps %s at epoch %s)",
            out["epochs_run"],
            out["reason"],
            out["best_val_crps"],
            out["best_epoch"],
        )
        for warning in out["warnings"]:
            log.warning("%s", warning)
        io.write_json(folder / "summary.json", out)


def early_stopping_defaults() -> dict[str, Any]:
    """The parser defaults of the ``early_stopping`` callback every fit runs with."""
    return {
        "early_stopping.monitor": MONITOR,
        "early_stopping.mode": "min",
        "early_stopping.patience": 5,
        "early_stopping.min_delta": 1e-5,
        "early_stopping.check_finite": True,
    }
