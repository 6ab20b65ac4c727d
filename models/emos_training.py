"""The local EMOS's full-batch fit inside a training run (:class:`postcast.models.module.PostProcessor`): its
training samples written to a scratch folder by latitude band, the candidates the preset names (forms of
:mod:`emos_forms`, poolings of :mod:`emos_pool`), and the fit: one candidate fitted to its optimum
(:mod:`emos_fit`), or several and the one of lowest validation CRPS kept (:mod:`emos_select`), whose form the
checkpoint's hyperparameters then name. The memory held does not grow with the training dates.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader

from postcast.datasets.core.errors import BadInputError
from postcast.datasets.loaders.datamodule import StoreDataset
from postcast.models import emos_bands, emos_fit, emos_forms, emos_select, postprocessors
from postcast.models.emos_objective import PointData
from postcast.models.emos_pool import Pooling, Shrinkage
from postcast.models.hyperparameters import ModelMeta


class PostProcessor(Protocol):
    """What the fit reads and sets of :class:`postcast.models.module.PostProcessor` (a protocol, so that this
    module, which the LightningModule calls, does not import it back)."""

    net: torch.nn.Module

    @property
    def meta(self) -> ModelMeta: ...
    @property
    def device(self) -> torch.device: ...
    def normalise(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...
    def set_net_option(self, key: str, value: Any) -> None: ...


SCRATCH_BATCH = 4  # samples read at once for the EMOS scratch: a 0.5 deg sample's inputs are about 10 MB
ONE_BAND = 1 << 30  # latitude rows per band that put every row of any grid in one band
log = logging.getLogger(__name__)


def _emos(model: PostProcessor) -> postprocessors.LocalEMOS:
    assert isinstance(model.net, postprocessors.LocalEMOS)
    return model.net


def scratch(model: PostProcessor, data: StoreDataset, folder: Path, rows: int | None = None) -> emos_bands.BandScratch:
    """Every sample of ``data`` as a local EMOS reads it, written under ``folder`` by latitude band
    (:class:`emos_bands.BandScratch`): ``rows`` per band, or as many as one band's fit may hold in memory."""
    net = _emos(model)
    folder.mkdir(parents=True, exist_ok=True)
    out: emos_bands.BandScratch | None = None
    with torch.no_grad():
        for batch in DataLoader(data, batch_size=SCRATCH_BATCH):
            x = model.normalise({k: v.to(model.device) for k, v in batch.items()})["x"]  # (B, C, H, W)
            fields = {"xm": x[:, net.mean_channel], "xs": x[:, net.std_channel]}
            fields |= {k: batch[k] for k in ("m", "s", "y")}  # each (B, H, W)
            if net.season_channels is not None:  # the inputs' sin and cos of the day of year, (B, H, W) each
                fields |= {k: x[:, c] for k, c in zip(emos_bands.SEASON_FIELDS, net.season_channels, strict=True)}
            if out is None:
                _, h, w = fields["y"].shape
                rows = rows or emos_bands.band_rows(model.meta.family, len(data), h, w)
                out = emos_bands.BandScratch(folder, h, rows)
            out.add(fields)
    if out is None:
        msg = "the training split has no samples to fit the local EMOS to: widen data.cfg.splits.train"
        raise BadInputError(msg)
    return out


def points(model: PostProcessor, data: StoreDataset) -> PointData:
    """Every sample of ``data`` at every point at once (:class:`emos_objective.PointData`; a small grid's), with the
    standard form's unit of the model when it has one."""
    with tempfile.TemporaryDirectory(prefix="postcast-emos-") as tmp:
        d = next(scratch(model, data, Path(tmp), rows=ONE_BAND).bands(emos_fit.FitSettings.min_std, model.device))
    unit = _emos(model).unit
    return d if unit is None else d.with_unit(unit.flatten().double())


def candidates(model: PostProcessor) -> tuple[list[str], list[Pooling], tuple[Shrinkage, ...]]:
    """The forms, the poolings and the shrinkages beside the local fit that the preset names (``model.net``: form,
    radii, weights, shrink_radii, shrink_weights)."""
    opts = model.meta.net
    form = opts.get("form", "spread")
    forms = emos_forms.auto(model.meta.family) if form == "auto" else [form]
    pools = [Pooling(r, w) for r in opts.get("radii", ()) for w in opts.get("weights", ())]
    shrinks = tuple(Shrinkage(r, w) for r in opts.get("shrink_radii", ()) for w in opts.get("shrink_weights", ()))
    return forms, pools, shrinks


def fit(model: PostProcessor, cfg: Any) -> dict[str, Any]:
    """The local EMOS of ``model`` fitted on the training split of ``cfg`` (a DataConfig), a latitude band of
    points at a time (each band's samples of every date read back from a scratch folder under TMPDIR); with
    several candidates, the one of lowest validation CRPS. Returns the fit's report (checkpoint, summary.json)."""
    family, (forms, pools, shrinks), net = model.meta.family, candidates(model), _emos(model)
    cfg = dataclasses.replace(cfg, cache=False)  # each sample is read once, into the scratch: nothing to keep
    train = StoreDataset(cfg, "train")
    with tempfile.TemporaryDirectory(prefix="postcast-emos-") as tmp:
        if forms == ["spread"] and not pools and not shrinks:
            bands = scratch(model, train, Path(tmp)).bands(emos_fit.FitSettings.min_std, model.device)
            theta, report = emos_fit.fit_bands(bands, family)
            net.set_theta(theta.float())
            log.info("local EMOS fitted: %s", report)
            return report.to_dict()
        (h, w), most = model.meta.grid, max((p.neighbours for p in pools), default=1)
        rows = emos_bands.band_rows(
            family, len(train), h, w, most, emos_select.held_at_once(forms, pools, len(shrinks))
        )
        val = StoreDataset(cfg, "val")
        fields = {name: scratch(model, data, Path(tmp) / name, rows) for name, data in (("train", train), ("val", val))}
        weights = torch.from_numpy(np.cos(np.deg2rad(train.sampler.lat)))  # (H,): area per latitude row
        wrap = model.meta.grid_area is None  # a global grid: longitudes wrap round
        chosen = emos_select.select(
            fields["train"], fields["val"], family, forms, pools, weights, wrap, shrinks=shrinks
        )
    _use_form(model, chosen.chosen.form)
    _emos(model).set_theta(chosen.theta.float(), chosen.unit.float())
    log.info("local EMOS fitted: %s", chosen.report)
    return {**chosen.report.to_dict(), "selection": chosen.to_dict()}


def _use_form(model: PostProcessor, form: str) -> None:
    """The local EMOS rebuilt in ``form`` (the one the selection kept), named so in the hyperparameters."""
    net = _emos(model)
    outputs = 2 + (0 if net.extra is None else net.extra.shape[0])
    grid = (int(net.coef.shape[1]), int(net.coef.shape[2]))
    model.net = postprocessors.LocalEMOS(
        grid, net.mean_channel, net.std_channel, outputs, net.solver, form, net.season_channels
    )
    model.net.to(model.device)
    model.set_net_option("form", form)
