"""The LightningModule every post-processor trains in: physical fields in, Gaussian parameters out.

:class:`PostProcessor` owns its normalisation (as anemoi builds its pre/post-processors into the
model): ``forward`` takes a batch of samples in physical units (see :mod:`postcast.datasets.sample`),
scales the ``fields`` and ``members`` with the per-grid-point statistics it carries as buffers
(``norm_mean``, ``norm_std``: (n_fields, H, W), copied from the training store at fit start), runs
its network and returns (mu, sigma) in the target's units. ``forecast`` and ``evaluate`` therefore
call the model and rebuild no scaling.

The network is an architecture (:mod:`postcast.models.registry`): ``family`` names it (the preset key
``model.family`` and the checkpoints' hyperparameter keep that name) and ``net`` holds its own options;
``distribution`` names the predictive family (:mod:`postcast.datasets.laws`). A checkpoint carries
everything inference needs: the hyperparameters (architecture, its options, the distribution, the sample
spec, grid, members), the statistics buffers and
``checkpoint["postcast"]`` with the format version, the default exceedance thresholds and a content
checksum verified on load (:func:`content_checksum`). Only the current format is read: earlier ones
carried no checksum, so they are refused with the fix (retrain), never loaded unchecked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import logging
import os
import pickle
import re
import warnings
from typing import Any

import lightning as L
import torch

from postcast.datasets import laws
from postcast.datasets.core.errors import BadInputError, ConfigError, MissingInputError
from postcast.datasets.sample import NORMALISATIONS, SampleSpec
from postcast.models import distributions, emos_training, postprocessors, registry, rng, spread_blend
from postcast.models.distributions import Distribution
from postcast.models.hyperparameters import ModelMeta
from postcast.models.kernels import crps_gaussian
from postcast.models.losses import distribution_head
from postcast.models.smoe import SMoEHead

SCHEDULES = ("plateau", "cosine", "none")  # the learning-rate schedule (PostProcessor's ``schedule``)
CHECKPOINT_FORMAT_VERSION = 5  # 3: a content checksum in checkpoint["postcast"]["checksum"]; 4: the U-Net's
# convolutions pad round the globe and the SMoE's latent gate is `smoe.gate.map` (a format-3 U-Net would load and
# predict differently, unsaid; an SMoE would not load): format 3 is refused with the fix, retrain; 5: the local
# EMOS's sh form reads the raw ensemble mean where format 4's read the normalised mean channel clamped at 0
# (emos_forms): a format-4 sh EMOS is refused with the fix, every other format-4 model means the same and loads
Batch = dict[str, torch.Tensor]
NO_STEP_WARNING = "`training_step` returned `None`"  # Lightning's, for a step without optimisation: on purpose here
log = logging.getLogger(__name__)
# Parameters with one value per grid point (a network's embedding, the blend's exponents, a latent gate's map):
# they learn at lr * point_lr, as each point's own coefficients learn from its own dates only.
PER_POINT = re.compile(r"(^|\.)(embedding(\.weight)?|blend\.exponent|gate\.map)$")


class PostProcessor(L.LightningModule):
    """Trains one post-processor with the closed-form Gaussian CRPS.

    Args:
        family: the network architecture (``postcast.models.registry.architectures()``: emos, emos_global,
            mlp, lenet, unet, unet_smoe, smoe, transformer); the key keeps this name in presets and checkpoints.
        net: the architecture's options, e.g. ``{base_filters: 32}`` for unet, ``{hidden: 128}`` for mlp,
            ``{smoe: {experts: 3, gate: latent}}`` for smoe/unet_smoe, ``{width: 16, heads: 4}`` for
            the transformer.
        sample, grid, grid_area, n_members: linked from the data module by ``postcast train`` (the
            sample spec as a mapping, the grid (H, W), the area (south, north, west, east) of a
            regional store or None for a global one, the ensemble size); set them only when building
            a model by hand.
        lr, weight_decay: AdamW. ``schedule``: ``plateau`` (default) halves the learning rate when the
            validation CRPS has not improved for ``lr_patience`` epochs (``max_epochs`` is a ceiling, early
            stopping ends the run: ``postcast.pipeline.train``); ``cosine`` anneals it over ``max_epochs``;
            ``none`` keeps it constant. A local EMOS with ``net.solver: newton`` is fitted to its CRPS
            optimum before the first epoch (:mod:`postcast.models.emos_fit`) and takes no optimiser steps.
        distribution: the predictive family (``postcast.models.distributions.names()``: gaussian,
            truncnormal, clogistic, csg, bernstein); the loss is its CRPS (docs/distributions.md).
        scale: ``spread`` (the ENS-10 head: outputs in units of the date's spread) or ``blend`` (in units of
            u^lambda s^(1 - lambda), a learned exponent per point: :mod:`postcast.models.spread_blend`).
        point_lr: the learning rate of the per-point parameters (:data:`PER_POINT`) relative to ``lr``.
        normalisation: the inputs' statistics, ``point`` (each grid point's own training mean and std) or
            ``channel`` (one mean and std per channel over the grid, as anemoi's per-variable normaliser: the
            inputs keep their absolute values, which a network needs where the error depends on the weather's
            absolute state, such as a wind speed above a threshold; docs/models.md).
    """

    def __init__(
        self,
        family: str = "mlp",
        net: dict[str, Any] | None = None,
        sample: dict[str, Any] | None = None,
        grid: tuple[int, int] = (37, 72),
        n_members: int = 10,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        schedule: str = "plateau",
        lr_patience: int = 2,
        grid_area: tuple[float, float, float, float] | None = None,
        distribution: str | None = None,
        scale: str = "spread",
        point_lr: float = 1.0,
        normalisation: str = "point",
    ):
        super().__init__()
        spec = SampleSpec.from_dict(sample or {})
        distribution = distribution or spec.resolved_target.family  # None: the target's (datasets/schema.py)
        if schedule not in SCHEDULES:
            msg = f"model.schedule {schedule!r}: choose one of {list(SCHEDULES)}"
            raise ConfigError(msg)
        if distribution not in distributions.names():
            msg = f"model.distribution {distribution!r}: choose one of {distributions.names()}"
            raise ConfigError(msg)
        if normalisation not in NORMALISATIONS:
            msg = f"model.normalisation {normalisation!r}: choose one of {list(NORMALISATIONS)}"
            raise ConfigError(msg)
        if scale not in spread_blend.SCALES:
            msg = f"model.scale {scale!r}: choose one of {list(spread_blend.SCALES)}"
            raise ConfigError(msg)
        arch = registry.make(family, net)
        if arch.needs_members and not spec.members:
            msg = f"the {family} model reads the raw members: set data.cfg.sample.members: true in the training config"
            raise ConfigError(msg)
        net = _plain(dataclasses.asdict(arch))
        sample = spec.to_dict()
        grid = (int(grid[0]), int(grid[1]))
        self.save_hyperparameters()
        self.hparams["distribution"] = distribution  # resolved (under the CLI, hparams are its config)
        self.spec = spec
        io = registry.NetIO(
            in_channels=spec.n_channels,
            grid=grid,
            n_members=n_members,
            n_variables=spec.n_member_variables,
            target_variable=spec.target_variable_index,
            outputs=distributions.get(distribution).n_raw,
            season_channels=(spec.n_channels - 2, spec.n_channels - 1) if spec.season_features else None,
        )
        self.net = arch.build(io)
        self.std_channel = io.target_channels[1]  # the target's ensemble-std field: its norm_mean is the unit
        location = laws.get(distribution).location_scale
        self.blend = spread_blend.SpreadBlend(grid, location) if scale == "blend" else None
        self.smoe_layer: SMoEHead | None = getattr(self.net, "smoe", None)
        self.norm_mean: torch.Tensor
        self.norm_std: torch.Tensor
        self.register_buffer("norm_mean", torch.zeros(spec.n_fields, *grid))
        self.register_buffer("norm_std", torch.ones(spec.n_fields, *grid))
        # default exceedance thresholds of forecasts (target units): quantiles of the training truth, set
        # at fit start and carried in the checkpoint's metadata
        self.thresholds: list[float] = []
        self.fit_report: dict[str, Any] | None = None  # how the full-batch EMOS fit ended (in the checkpoint)

    @property
    def meta(self) -> ModelMeta:
        """What this model is (network kind, predictive family, grid, ...), typed, from its hyperparameters."""
        return ModelMeta.of(self.hparams)

    def set_net_option(self, key: str, value: Any) -> None:
        """One of the network's options (``model.net``) set in the hyperparameters the checkpoint saves."""
        self.hparams["net"] = {**dict(self.hparams["net"] or {}), key: value}

    def set_normalisation(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Record the statistics the inputs are normalised with (they travel in the checkpoint)."""
        with torch.no_grad():
            self.norm_mean.copy_(mean)  # (n_fields, H, W)
            self.norm_std.copy_(std)

    def on_fit_start(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        if dm is not None and hasattr(dm, "normalisation"):
            mean, std = dm.normalisation(self.hparams["normalisation"])
            self.set_normalisation(torch.from_numpy(mean), torch.from_numpy(std))
        if dm is not None and hasattr(dm, "climate_thresholds"):
            self.thresholds = list(dm.climate_thresholds())

    def on_train_start(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        if isinstance(self.net, postprocessors.LocalEMOS) and self._newton() and dm is not None:
            self.fit_report = emos_training.fit(self, dm.cfg)
            # at its optimum: the epoch validates and saves it, its training_step returns None (no optimiser step)
            warnings.filterwarnings("ignore", message=NO_STEP_WARNING)

    def _newton(self) -> bool:
        """Whether the local EMOS is fitted to its optimum (``solver: newton``, or ``auto`` for a
        location-scale family: :attr:`laws.Family.location_scale`) rather than by the epochs' optimiser."""
        solver = getattr(self.net, "solver", "gradient")
        return solver == "newton" or (solver == "auto" and laws.get(self.hparams["distribution"]).location_scale)

    def normalise(self, batch: Batch) -> Batch:
        """The network's view of a physical batch: ``x`` (B, C, H, W) = normalised fields (NaN, e.g.
        SST over land, -> 0) then features; ``members`` (B, M, V, H, W) normalised with the
        ensemble-mean statistics of each variable (a derived target's members, at V, with those of its own
        mean channel); ``m``, ``s`` passed through for the head."""
        x = torch.nan_to_num((batch["fields"] - self.norm_mean) / self.norm_std)  # (B, 2V, H, W)
        out = {"x": torch.cat([x, batch["features"]], dim=1), "m": batch["m"], "s": batch["s"]}
        if "members" in batch:
            v = 2 * self.spec.n_member_variables  # a derived target's mean channel (2V) follows the inputs'
            mean, std = self.norm_mean[0:v:2], self.norm_std[0:v:2]  # (V', H, W): the ens_mean channels
            out["members"] = torch.nan_to_num((batch["members"] - mean) / std)
        return out

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(mu, sigma) in physical units, each (B, H, W), from a batch of physical samples (Gaussian models;
        any family: :meth:`predictive`)."""
        dist = self.predictive(batch)
        if not isinstance(dist, distributions.Gaussian):
            msg = (
                f"this model predicts a {dist.name!r} distribution, not (mu, sigma); forecasting and "
                f"evaluation read Gaussian models only so far: train with model.distribution: gaussian"
            )
            raise BadInputError(msg)
        return dist.mu, dist.sigma

    def predictive(self, batch: Batch) -> Distribution:
        """The predictive distribution (``hparams.distribution``), parameters (B, H, W), in physical units."""
        view = self.normalise(batch)
        outs = self.net(view)  # K x (B, H, W)
        if self.blend is not None:
            outs = self.blend(outs, view["s"], self.norm_mean[self.std_channel])
        return distribution_head(outs, view["m"], view["s"], self.hparams["distribution"])

    def _step(self, batch: Batch, split: str) -> torch.Tensor:
        dist = self.predictive(batch)
        ok = torch.isfinite(batch["y"])  # (B, H, W): where the truth exists
        _check_finite(batch, ok, split)
        loss = dist.select(ok).crps(batch["y"][ok]).mean()  # parameters masked first: no NaN in the gradients
        self.log(f"{split}_crps", loss, prog_bar=split != "train", batch_size=batch["y"].shape[0])
        if split != "train":
            raw = crps_gaussian(batch["m"][ok], batch["s"][ok].clamp_min(1e-6), batch["y"][ok]).mean()
            self.log(f"{split}_raw_crps", raw, batch_size=batch["y"].shape[0])
            oracle = self._oracle(batch)
            if oracle is not None:
                orc = oracle.select(ok).crps(batch["y"][ok]).mean()
                self.log(f"{split}_oracle_crps", orc, batch_size=batch["y"].shape[0])
        return loss

    def _oracle(self, batch: Batch) -> Distribution | None:
        """The synthetic world's own law of the target on the batch (parameters (B, H, W)), when the samples
        carry it: ``oracle_mean``/``oracle_std`` of a Gaussian target, ``oracle_<parameter>`` of another
        family's (the censored shifted gamma of tp24)."""
        if "oracle_mean" in batch:
            return distributions.Gaussian(batch["oracle_mean"], batch["oracle_std"])
        family = self.spec.resolved_target.family
        names = laws.get(family).names
        if any(f"oracle_{p}" not in batch for p in names):
            return None
        return distributions.get(family)(**{p: batch[f"oracle_{p}"] for p in names})

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor | None:
        loss = self._step(batch, "train")
        if self.fit_report is not None:
            return None  # fitted to its optimum at train start: no optimiser step
        layer = self.smoe_layer
        if layer is not None and layer.cfg.rc_loss:
            rc = layer.rc_loss(loss)  # the gate learns from this only
            self.log("train_rc_loss", rc, batch_size=batch["y"].shape[0])
            share = layer.expert_share()
            for i in range(share.numel()):
                self.log(f"train_expert{i}_share", share[i], batch_size=batch["y"].shape[0])
            return loss + layer.cfg.rc_weight * rc
        return loss

    def validation_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "val")

    def test_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "test")

    def predict_step(self, batch: Batch, batch_idx: int) -> dict[str, torch.Tensor]:
        return self.predictive(batch).params  # gaussian: {"mu", "sigma"}

    def on_train_epoch_end(self) -> None:
        if self.fit_report is not None:
            self.trainer.should_stop = True  # the optimum is reached: one epoch validates and saves it

    def configure_optimizers(self) -> Any:
        lr = self.hparams["lr"]
        point = [p for n, p in self.named_parameters() if PER_POINT.search(n)]
        rest = [p for n, p in self.named_parameters() if not PER_POINT.search(n)]
        groups = [{"params": rest}, {"params": point, "lr": lr * self.hparams["point_lr"]}]
        opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, weight_decay=self.hparams["weight_decay"])
        epochs = self.trainer.max_epochs if self._trainer is not None else None
        schedule = self.hparams["schedule"]
        if schedule == "plateau":
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=self.hparams["lr_patience"])
            return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_crps"}}
        if schedule == "none" or not epochs or epochs < 0:
            return opt
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning calls this hook last, once "state_dict" and "hyper_parameters" are in place
        meta = {
            "format_version": CHECKPOINT_FORMAT_VERSION,
            "family": self.hparams["family"],
            "sample": self.spec.to_dict(),
            "thresholds": self.thresholds,
            **({"fit": self.fit_report} if self.fit_report is not None else {}),
        }
        checkpoint["postcast"] = {**meta, "checksum": content_checksum(checkpoint, meta)}
        checkpoint["rng_states"] = rng.states()  # training state, like the optimiser's: not in the checksum

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.thresholds = list(checkpoint.get("postcast", {}).get("thresholds", []))
        if "rng_states" in checkpoint:  # a resumed fit draws what the uninterrupted one would have drawn
            rng.restore_states(checkpoint["rng_states"])


def _check_finite(batch: Batch, ok: torch.Tensor, split: str) -> None:
    """Stop (one line, exit 65) when the raw ensemble's mean or spread is not finite where the truth is:
    a missing or damaged store chunk reads as NaN and would otherwise train to ``val_crps=nan``."""
    bad = {k: int((~torch.isfinite(batch[k][ok])).sum()) for k in ("m", "s")}  # one sync per step
    if any(bad.values()):
        where = ", ".join(f"{n} non-finite {k}" for k, n in bad.items() if n)
        msg = (
            f"{split} batch: the raw ensemble holds {where} value(s) where the truth is finite (a missing or "
            f"damaged store chunk?); check the store with `postcast inspect STORE --verify`"
        )
        raise BadInputError(msg)


def content_checksum(ckpt: dict[str, Any], meta: dict[str, Any]) -> str:
    """SHA-256 of what inference reads from a checkpoint: every state_dict tensor (name, dtype, shape,
    bytes, in name order), the hyperparameters and the ``postcast`` metadata (without the checksum),
    the last two as canonical JSON. Recorded at save, recomputed at load: one flipped bit changes it."""
    h = hashlib.sha256()
    for name in sorted(ckpt.get("state_dict") or {}):
        t = ckpt["state_dict"][name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # raw bytes of any dtype
    described = {
        "hyper_parameters": ckpt.get("hyper_parameters") or {},
        "postcast": {k: v for k, v in meta.items() if k != "checksum"},
    }
    h.update(json.dumps(_plain(described), sort_keys=True, default=str).encode())
    return "sha256:" + h.hexdigest()


def verify_checksum(ckpt: dict[str, Any], path: str) -> None:
    """Refuse a checkpoint whose contents differ from the checksum recorded when it was saved (bit rot,
    tampering), or that carries none (every checkpoint of the current format is saved with one)."""
    meta = ckpt["postcast"]
    recorded = meta.get("checksum")
    if recorded is None:
        msg = f"{path}: checkpoint has no content checksum; it was altered after saving: retrain it"
        raise BadInputError(msg)
    if content_checksum(ckpt, meta) != recorded:
        msg = (
            f"{path}: checkpoint contents do not match the checksum recorded when it was saved (corrupted or "
            f"altered); restore it from a copy or retrain it with `postcast train fit`"
        )
        raise BadInputError(msg)


def _plain(value: Any) -> Any:
    """Tuples -> lists, recursively (plain YAML/JSON types in the checkpoint)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _refused_pickle(path: str, torch_text: str) -> str:
    """Why a checkpoint's pickle was refused, naming what it holds (a Python object other than tensors and
    plain containers, e.g. ``posix.system``); torch's hint to load it unrestricted is left out."""
    found = re.search(r"GLOBAL ([\w.]+)", torch_text)
    what = (
        f"it holds a Python object ({found.group(1)}) where a checkpoint holds only tensors and plain values"
        if found
        else "not a torch checkpoint file"
    )
    return (
        f"{path}: not a readable checkpoint: not a postcast checkpoint ({what}; crafted or tampered with, "
        "it was not loaded); use a checkpoint saved by `postcast train`"
    )


def read_checkpoint(path: str) -> dict[str, Any]:
    """A checkpoint's contents, verified: loaded with ``weights_only=True`` (tensors and plain containers
    only, so a crafted file cannot run code; Lightning's own checkpoints hold nothing else), of the
    current format, its content checksum matching. The one gate for every use of a checkpoint:
    forecasting and evaluation (:func:`load_checkpoint`) and ``postcast train ... --ckpt_path``."""
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        msg = f"{path}: an empty file, not a checkpoint (an interrupted copy?); use one saved by `postcast train`"
        raise BadInputError(msg)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as err:
        msg = f"{path}: no such checkpoint"
        raise MissingInputError(msg) from err
    except pickle.UnpicklingError as err:  # torch's text advises unpickling anyway: not repeated
        raise BadInputError(_refused_pickle(path, str(err))) from err
    except (OSError, RuntimeError, EOFError, ValueError) as err:
        reason = str(err).split("\n")[0]
        msg = f"{path}: not a readable checkpoint ({reason}); only checkpoints saved by `postcast train` load"
        raise BadInputError(msg) from err
    meta = ckpt.get("postcast") if isinstance(ckpt, dict) else None
    if not isinstance(meta, dict):
        msg = f"{path}: not a postcast checkpoint (no 'postcast' metadata); train it with `postcast train fit`"
        raise BadInputError(msg)
    version = meta.get("format_version")
    if not isinstance(version, int | None) or isinstance(version, bool):
        msg = (
            f"{path}: checkpoint format {version!r} (a {type(version).__name__}, not a format number): not a "
            "checkpoint saved by `postcast train`; retrain it with `postcast train fit`"
        )
        raise BadInputError(msg)
    _check_format(version, ckpt, path)
    verify_checksum(ckpt, path)
    _check_sample_agrees(ckpt, path)
    return ckpt


def _check_format(version: int | None, ckpt: dict[str, Any], path: str) -> None:
    """The current format loads, and format 4 but for the sh-form EMOS, whose coefficients mean another law now."""
    net = (ckpt.get("hyper_parameters") or {}).get("net")
    sh = isinstance(net, dict) and net.get("form") == "sh"
    if version == CHECKPOINT_FORMAT_VERSION or (version == 4 and not sh):
        return
    if version == 4:
        msg = (
            f"{path}: checkpoint format 4 holds an sh-form local EMOS, whose location read the normalised ensemble "
            "mean clamped at 0 (every date drier than a point's mean predicted alike); this postcast reads the raw "
            "ensemble mean: retrain it with `postcast train fit`"
        )
        raise BadInputError(msg)
    fix = (
        "upgrade postcast"
        if isinstance(version, int) and version > CHECKPOINT_FORMAT_VERSION
        else "retrain it with `postcast train fit` (earlier formats carry no checksum and are not read)"
    )
    msg = f"{path}: checkpoint format {version}, this postcast reads format {CHECKPOINT_FORMAT_VERSION}: {fix}"
    raise BadInputError(msg)


def _check_sample_agrees(ckpt: dict[str, Any], path: str) -> None:
    """The sample the metadata describes (target, lead, inputs) is the one the model was built for."""
    said, built = ckpt["postcast"].get("sample"), (ckpt.get("hyper_parameters") or {}).get("sample")
    if isinstance(said, dict) and isinstance(built, dict) and said != built:
        differ = sorted(k for k in said.keys() | built.keys() if said.get(k) != built.get(k))
        shown = ", ".join(f"{k}: {said.get(k)!r} in its metadata, {built.get(k)!r} in its model" for k in differ)
        msg = f"{path}: the checkpoint contradicts itself ({shown}); use the checkpoint `postcast train` saved"
        raise BadInputError(msg)


def load_checkpoint(path: str) -> tuple[PostProcessor, dict[str, Any]]:
    """A trained post-processor (eval mode, CPU) and its ``postcast`` metadata from a checkpoint alone
    (read through :func:`read_checkpoint`)."""
    ckpt = read_checkpoint(path)
    known = set(inspect.signature(PostProcessor.__init__).parameters) - {"self"}
    model = PostProcessor(**{k: v for k, v in ckpt["hyper_parameters"].items() if k in known})
    model.load_state_dict(ckpt["state_dict"])
    return model.eval(), ckpt["postcast"]
