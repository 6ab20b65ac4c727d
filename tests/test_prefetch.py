"""The clairvoyant loader: replayed streams equal the real samplers', backing-store reads are
exactly predicted, batches are bit-identical to the plain loader's, and the data module switch."""

from __future__ import annotations

import dataclasses
import re
import sys
import threading

import lightning as L
import pytest
import torch
from lightning.pytorch.trainer.connectors.data_connector import _get_distributed_sampler
from torch.utils.data import DataLoader, DistributedSampler
from zarr.storage import LocalStore

from postcast.datasets.loaders import prefetch
from postcast.datasets.loaders.datamodule import DataConfig, StoreDataModule, StoreDataset, to_tensors
from postcast.datasets.sample import SampleSpec

EPOCHS, WORLD = 3, 2


@pytest.fixture(scope="module")
def cfg(store):
    return DataConfig(store=str(store), sample=SampleSpec(target="t850", variables=("t", "z")), batch_size=2)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a float32 tensor (NaN == NaN, -0 != 0)."""
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize(("n", "drop_last"), [(13, False), (13, True), (6, False), (1, False)])
def test_planned_stream_equals_the_samplers(n, drop_last, monkeypatch):
    """2 ranks x 3 epochs, padding (13 and 1 samples on 2 ranks) and drop_last included: the
    replayed stream equals torch's DistributedSampler and the one Lightning injects."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "1234")
    data = list(range(n))
    for rank in range(WORLD):
        spec = prefetch.StreamSpec(n, seed=prefetch.lightning_seed(), rank=rank, world=WORLD, drop_last=drop_last)
        torch_sampler = DistributedSampler(
            data, num_replicas=WORLD, rank=rank, shuffle=True, seed=1234, drop_last=drop_last
        )
        injected = _get_distributed_sampler(
            DataLoader(data, shuffle=True),
            shuffle=True,
            overfit_batches=0,
            num_replicas=WORLD,
            rank=rank,
            drop_last=drop_last,
        )
        assert isinstance(injected, DistributedSampler) and injected.seed == 1234
        for epoch in range(EPOCHS):
            torch_sampler.set_epoch(epoch)
            injected.set_epoch(epoch)
            planned = prefetch.access_stream(spec, epoch)
            assert planned == list(torch_sampler) == list(injected)
            assert len(planned) == spec.per_epoch == len(torch_sampler)


def test_backing_reads_equal_accesses_minus_predicted_hits(cfg, store):
    """Reads of the real zarr store (counted per chunk by a wrapper store) are exactly the planned
    ones: one per cached sample, one per access of an uncached sample."""
    for rank in range(WORLD):
        counting = prefetch.CountingStore(LocalStore(str(store), read_only=True))
        base = StoreDataset(cfg, "train", source=counting)
        counting.gets.clear()
        spec = prefetch.StreamSpec(len(base), seed=7, rank=rank, world=WORLD)
        nbytes = base.sample_nbytes()
        plan = prefetch.plan_cache(spec, sample_bytes=nbytes, ram_bytes=2 * nbytes + 1, epochs=EPOCHS)
        assert plan.capacity == (2, 0)
        # the hottest samples are cached: no uncached sample is accessed more often than a cached one
        cached = [plan.counts[i] for i in plan.slots]
        assert min(cached) >= max([c for i, c in plan.counts.items() if i not in plan.slots], default=0)
        data = prefetch.ClairvoyantDataset(base, plan, threads=2, lookahead=2)
        sampler = prefetch.ReplaySampler(data, spec, data.begin_epoch)
        loader = DataLoader(data, batch_size=2, sampler=sampler)
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            for _ in loader:
                pass
        data.close()
        accesses = EPOCHS * spec.per_epoch
        assert sum(st.accesses for st in data.stats) == accesses
        assert data.backing_reads == accesses - plan.predicted_hits() < accesses
        # per sample, from the store's own chunk reads (truth_t850 is read once per sample)
        reads: dict[int, int] = {}
        for key, k in counting.gets.items():
            if key.startswith("truth_t850/c/"):
                store_row = int(key.split("/")[2])
                reads[int(list(base.indices).index(store_row))] = k
        want = {i: (1 if i in plan.slots else c) for i, c in plan.counts.items()}
        assert reads == want
        assert sum(st.off_plan for st in data.stats) == 0


def test_batches_are_bit_identical_to_the_plain_loader(cfg, tmp_path):
    """RAM tier, disk tier and staging together, 2 ranks x 3 epochs, batch size 2."""
    base = StoreDataset(cfg, "train")
    nbytes = base.sample_nbytes()
    for rank in range(WORLD):
        spec = prefetch.StreamSpec(len(base), seed=3, rank=rank, world=WORLD)
        loader = prefetch.clairvoyant_loader(
            base,
            spec,
            batch_size=2,
            sample_bytes=nbytes,
            ram_bytes=nbytes,
            disk_bytes=nbytes,
            disk_dir=tmp_path / f"r{rank}",
            epochs=EPOCHS,
            threads=2,
            lookahead=1,
        )
        data = loader.dataset
        assert isinstance(data, prefetch.ClairvoyantDataset) and data.plan.capacity == (1, 1)
        plain_sampler = DistributedSampler(base, num_replicas=WORLD, rank=rank, shuffle=True, seed=3)
        plain = DataLoader(base, batch_size=2, sampler=plain_sampler)
        for epoch in range(EPOCHS):
            plain_sampler.set_epoch(epoch)
            assert isinstance(loader.sampler, DistributedSampler)
            loader.sampler.set_epoch(epoch)
            n = 0
            for a, b in zip(plain, loader, strict=True):
                assert a.keys() == b.keys()
                for k in a:
                    assert a[k].shape == b[k].shape and torch.equal(bits(a[k]), bits(b[k])), k
                n += 1
            assert n == len(plain)
        data.close()
        hits = {k: sum(st.hits[k] for st in data.stats) for k in ("ram", "disk", "staging")}
        assert (
            hits["ram"] > 0 and hits["disk"] > 0 and hits["staging"] + sum(st.consumer_reads for st in data.stats) > 0
        )


def test_config_switch_and_loader_kinds(cfg):
    with pytest.raises(ValueError, match=re.escape("loader 'fast'") + r".*'auto', 'plain', 'clairvoyant', 'fixed'"):
        DataConfig(store="x", loader="fast")
    with pytest.raises(ValueError, match="disk_cache_dir"):
        DataConfig(store="x", disk_cache_bytes=10)
    assert StoreDataModule(cfg).train_loader_kind == "clairvoyant"
    workers = dataclasses.replace(cfg, num_workers=2)
    assert StoreDataModule(workers).train_loader_kind == "plain"
    plain = StoreDataModule(dataclasses.replace(cfg, loader="plain")).train_dataloader()
    assert not isinstance(plain.dataset, prefetch.ClairvoyantDataset)
    fixed = StoreDataModule(dataclasses.replace(cfg, loader="fixed")).train_dataloader()
    batches = list(fixed)
    assert len(batches) == len(fixed) == 3 and all(b is batches[0] for b in batches)


class _Linear(L.LightningModule):
    def __init__(self, channels: int):
        super().__init__()
        self.net = torch.nn.Conv2d(channels, 1, 1)

    def training_step(self, batch: dict[str, torch.Tensor], _: int) -> torch.Tensor:
        pred = self.net(torch.cat([batch["fields"], batch["features"]], dim=1))[:, 0]  # (B, H, W)
        return torch.nn.functional.mse_loss(pred, batch["y"] - batch["m"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def test_trainer_uses_the_clairvoyant_loader_and_logs_its_stats(cfg, tmp_path):
    """auto -> clairvoyant under a real Trainer: the callback is added, epoch 2 is all RAM hits."""
    dm = StoreDataModule(cfg)
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(_Linear(cfg.sample.n_channels), datamodule=dm)
    stats = next(c for c in trainer.callbacks if isinstance(c, prefetch.PrefetchStats))  # type: ignore[attr-defined]
    assert [h["epoch"] for h in stats.history] == [0, 1]
    first, second = stats.history
    assert first["backing_reads"] == 6 and second["backing_reads"] == 0
    assert second["hit_rate_ram"] == 1.0 and second["stall_s"] == 0.0
    assert trainer.callback_metrics["loader/hit_rate_ram"] == 1.0


def test_concurrent_read_path_equals_xarray_selection(store):
    """StoreDataset reads a sample's variables in one concurrent zarr call: same bits as building
    the sample from xarray's own selection of the date (members and an explicit level included)."""
    from postcast.datasets import io, schema

    cfg = DataConfig(store=str(store), sample=SampleSpec(target="t850", variables=("t", "u@500"), members=True))
    data = StoreDataset(cfg, "val")
    ds = io.open_zarr(store)
    for i in range(len(data)):
        want = to_tensors(data.sampler.sample(ds.isel({schema.INIT_TIME: int(data.indices[i])}).load()))
        got = data[i]
        assert got.keys() == want.keys()
        for k in got:
            assert torch.equal(bits(got[k]), bits(want[k])), k


def _read_in_thread(data: StoreDataset, i: int, out: list[object]) -> threading.Thread:
    def run() -> None:
        try:
            out.append(data[i])
        except Exception as err:  # the test compares it with the sample
            out.append(err)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_read_racing_the_first_read_gets_the_same_sample(cfg, store):
    """Prefetch threads and the consumer read one StoreDataset at once. Whatever line of its own code the first
    read is at, a second thread's read of another sample then gives that sample's bits. The first read used to
    open the arrays, publish them, then set the coordinates: a read in between built its sample without them
    and failed ("this model predicts +48 h; the data holds +0, +0, +0 h")."""
    want = StoreDataset(cfg, "train")[1]
    here = sys.modules[StoreDataset.__module__].__file__
    for line in range(60):  # a fresh dataset each time: the first read stops at its line-th line for the racer
        data = StoreDataset(cfg, "train", source=LocalStore(str(store), read_only=True))
        seen, results = [0], []

        def trace(frame, event, arg, data=data, seen=seen, results=results, line=line):
            if event == "line":
                seen[0] += 1
                if seen[0] == line + 1:
                    _read_in_thread(data, 1, results).join(timeout=60)
            return trace

        def first_read(data=data) -> None:
            sys.settrace(lambda f, e, a: trace if f.f_code.co_filename == here and f.f_code.co_name[0] != "<" else None)
            try:
                data[0]
            finally:
                sys.settrace(None)

        first = threading.Thread(target=first_read)
        first.start()
        first.join(timeout=120)
        if seen[0] <= line:  # the first read has fewer lines: every one had its racer
            break
        assert len(results) == 1, (line, results)
        got = results[0]
        assert isinstance(got, dict), (line, got)
        assert got.keys() == want.keys()
        for k in want:
            assert torch.equal(bits(got[k]), bits(want[k])), (line, k)
    assert line > 3
