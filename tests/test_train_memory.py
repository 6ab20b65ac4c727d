"""Training streams: every sample cache of a training process is bounded by ``cache_bytes``, whatever the
store's size, and a run whose cache is far smaller than the store gives the losses of an unlimited run.

Memory is measured with tracemalloc: the samples are numpy buffers (``torch.from_numpy``), which numpy
reports to tracemalloc in its own domain, so the bytes a cache keeps show up there, apart from the
Python objects of everything else; each test first checks that the measurement sees an unbounded cache
(the store's whole split) before it asserts the bound."""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc
from collections.abc import Callable
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch

from postcast.datasets.loaders.datamodule import DataConfig, StoreDataModule, StoreDataset
from postcast.datasets.loaders.prefetch import sample_nbytes
from postcast.datasets.sample import SampleSpec
from postcast.models import emos_training
from postcast.models.module import PostProcessor

UNLIMITED = 2**40


@pytest.fixture(scope="module")
def cfg(store) -> DataConfig:
    """Samples with the raw members (the presets that read members hold the most per sample)."""
    return DataConfig(store=str(store), sample=SampleSpec(target="t850", members=True), cache=True)


def _numpy_bytes() -> int:
    """Bytes of the numpy buffers tracemalloc has seen allocated and not freed."""
    only = tracemalloc.DomainFilter(inclusive=True, domain=np.lib.tracemalloc_domain)
    return sum(t.size for t in tracemalloc.take_snapshot().filter_traces([only]).traces)


def _held(run: Callable[[], Any]) -> tuple[Any, int]:
    """(what ``run`` returns, the bytes of numpy buffers it left allocated once it returned)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = _numpy_bytes()
        out = run()
        gc.collect()
        return out, _numpy_bytes() - before
    finally:
        tracemalloc.stop()


def _epochs(data: StoreDataset, n: int = 2) -> StoreDataset:
    for _ in range(n):
        for _batch in torch.utils.data.DataLoader(data, batch_size=2):
            pass
    return data


def test_a_cached_validation_split_holds_at_most_cache_bytes(cfg):
    one = StoreDataset(dataclasses.replace(cfg, cache=False), "val").sample_nbytes()
    n = len(StoreDataset(cfg, "val"))
    # the measurement sees a cache that keeps the whole split (the unlimited cache)
    _, unlimited = _held(lambda: _epochs(StoreDataset(dataclasses.replace(cfg, cache_bytes=UNLIMITED), "val")))
    assert unlimited >= 0.9 * n * one
    # a cap of two samples: at most two are kept, however often the split is read
    data, limited = _held(lambda: _epochs(StoreDataset(dataclasses.replace(cfg, cache_bytes=2 * one), "val")))
    assert sample_nbytes(data[0]) == one  # the size the budget counts is the size of a sample
    assert n >= 6 and limited <= 3 * one, (limited, one)


class _Losses(L.Callback):
    """Every training step's loss and every validation epoch's CRPS."""

    def __init__(self) -> None:
        self.train: list[float] = []
        self.val: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, idx: int) -> None:
        self.train.append(float(outputs["loss"]))

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self.val.append(float(trainer.callback_metrics["val_crps"]))


def _fit(cfg: DataConfig) -> tuple[_Losses, L.Trainer]:
    """Two epochs of a local EMOS on ``cfg``'s store, clairvoyant training loader, seeded; the trainer is
    returned so that its loaders (and what their caches hold) are still alive when the memory is measured."""
    L.seed_everything(5, verbose=False)
    dm = StoreDataModule(cfg)
    spec = cfg.sample
    model = PostProcessor("emos", sample=spec.to_dict(), grid=dm.grid, lr=0.05)
    model.set_normalisation(*(torch.from_numpy(a) for a in dm.normalisation()))
    losses = _Losses()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[losses],
    )
    trainer.fit(model, datamodule=dm)
    return losses, trainer


@pytest.mark.slow
def test_training_with_a_cache_far_smaller_than_the_store_gives_the_unlimited_losses(cfg):
    """Three seeded fits (after one to warm up), with the trainer (its loaders, their caches) alive when the
    memory is measured: no cache (what the process holds anyway), a cache of 2 samples (the store's splits
    are 18: 9x the cap) and an unlimited one. The capped run holds at most the cap over the uncached one,
    and all three give the same losses, step for step."""
    one = StoreDataset(dataclasses.replace(cfg, cache=False), "val").sample_nbytes()
    split = len(StoreDataset(cfg, "val"))
    base = dataclasses.replace(cfg, batch_size=2, prefetch_threads=0)
    _fit(dataclasses.replace(base, cache=False))  # once unmeasured: what the first fit of a process sets up
    (none, _), uncached = _held(lambda: _fit(dataclasses.replace(base, cache=False)))
    (free, _), unlimited = _held(lambda: _fit(dataclasses.replace(base, cache_bytes=UNLIMITED)))
    assert unlimited - uncached >= 0.9 * split * one  # the measurement sees the unlimited cache
    (capped, _), limited = _held(lambda: _fit(dataclasses.replace(base, cache_bytes=2 * one)))
    assert limited - uncached <= 2.5 * one, (limited, uncached, one)
    assert capped.train == free.train == none.train and capped.val == free.val == none.val
    assert len(capped.train) == 6 and len(capped.val) == 2


def test_the_clairvoyant_staging_window_is_within_cache_bytes(cfg):
    """The training loader's read-ahead (samples staged for the next batches, which the RAM tier does not
    keep) takes its bytes from the same budget as the caches: with cache_bytes of 3 samples, staging window
    plus RAM tier hold at most 3, and no more are ever staged (it staged 16 whatever the cap: about 0.2 GB
    of 0.5 deg samples beyond cache_bytes, part of the training growth in benchmarks/scale.py)."""
    one = StoreDataset(dataclasses.replace(cfg, cache=False), "val").sample_nbytes()
    dm = StoreDataModule(dataclasses.replace(cfg, cache_bytes=3 * one, prefetch_threads=2, batch_size=2))
    loader = dm.train_dataloader()
    data = dm.clairvoyant
    assert data is not None and len(data) >= 6
    staged = []
    for _ in range(2):
        for _batch in loader:
            with data._cv:
                staged.append(sum(e.sample is not None for e in data._staged.values()))
    assert data.lookahead + data.plan.capacity[0] <= 3, (data.lookahead, data.plan.capacity)
    assert max(staged) <= data.lookahead
    dm.teardown("fit")
    assert dm.budget.used == 0  # all of it given back


def test_the_local_emos_fit_keeps_no_sample_beyond_its_scratch(cfg, monkeypatch):
    """The local EMOS's fit reads every training and validation sample once, into its scratch folder on disk,
    then fits the candidates band by band from there. It read the samples through datasets of its own with the
    split's `cache: true` and budgets of their own, so they all stayed in memory through the fits: up to twice
    cache_bytes (2 GiB each by default) beside the process's one budget (0.5 deg, 64 MB caches: the fit's peak
    2.63 -> 2.04 GB at 8 training dates, 3.02 -> 2.70 GB at 32). What numpy holds when the fits start is measured
    by watching `emos_select.select` (the real one runs)."""
    dm = StoreDataModule(cfg)
    model = PostProcessor("emos", sample=cfg.sample.to_dict(), grid=dm.grid, lr=0.05, net={"form": "auto"})
    model.set_normalisation(*(torch.from_numpy(a) for a in dm.normalisation()))
    plain = dataclasses.replace(cfg, cache=False)
    one, n = StoreDataset(plain, "train").sample_nbytes(), len(StoreDataset(plain, "train"))
    held: list[int] = []
    select = emos_training.emos_select.select

    def watched(*args: Any, **kwargs: Any) -> Any:
        held.append(_numpy_bytes())
        return select(*args, **kwargs)

    monkeypatch.setattr(emos_training.emos_select, "select", watched)
    gc.collect()
    tracemalloc.start()
    try:
        start = _numpy_bytes()
        emos_training.fit(model, dataclasses.replace(cfg, cache_bytes=UNLIMITED))
    finally:
        tracemalloc.stop()
    assert n >= 6 and len(held) == 1, (n, held)
    assert held[0] - start < 2 * one, (held[0] - start, one, n)
