"""The clairvoyant loader's batched reads: RowReader gives zarr's own rows (bit for bit, whatever the layout,
a chunk the store lacks included) and names a chunk that does not decode; the clairvoyant loader reading its
next samples a batch at a time yields the plain loader's batches, reading each sample from the store once."""

from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest
import torch
import zarr
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from zarr.codecs import BloscCodec, BytesCodec, ZstdCodec
from zarr.storage import LocalStore

from postcast.datasets.core.errors import BadInputError
from postcast.datasets.loaders import prefetch
from postcast.datasets.loaders.datamodule import DataConfig, StoreDataset
from postcast.datasets.sample import SampleSpec

HANG_CEILING_S = 120  # against a hang only, generous for a busy machine

STORE_ARRAYS = ("ens_mean_t", "ens_std_z", "truth_t850", "oracle_mean_t850", "t", "split")


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_row_reader_gives_zarrs_rows_for_every_layout(store, tmp_path):
    """The store's arrays (one blosc chunk per date: decoded by RowReader; the 1-D split: by zarr) and arrays
    of other layouts (uncompressed, big-endian, zstd, a date over several chunks, a date never written)."""
    group = zarr.open_group(store, mode="r")
    arrays = {n: group[n] for n in STORE_ARRAYS}
    other = zarr.open_group(tmp_path / "other.zarr", mode="w")
    rng = np.random.default_rng(0)
    values = rng.normal(size=(5, 4, 3)).astype(np.float32)
    values[1, 0, 0] = np.nan
    layouts = {
        "plain": {"chunks": (1, 4, 3), "compressors": None},
        "big_endian": {"chunks": (1, 4, 3), "compressors": None, "serializer": BytesCodec(endian="big")},
        "zstd": {"chunks": (1, 4, 3), "compressors": ZstdCodec()},
        "split_date": {"chunks": (1, 2, 3), "compressors": BloscCodec()},
        "unwritten": {"chunks": (1, 4, 3), "compressors": BloscCodec()},
    }
    for name, kw in layouts.items():
        arr = other.create_array(name, shape=values.shape, dtype="float32", fill_value=np.nan, **kw)
        if name == "unwritten":
            arr[:2] = values[:2]  # rows 2-4 have no chunk: zarr reads the fill value
        else:
            arr[:] = values
        arrays[name] = arr
    reader = prefetch.RowReader(arrays)
    assert {n for n, lay in reader.layout.items() if lay is None} == {"split", "zstd", "split_date"}
    rows = [4, 0, 3, 3, 1]
    for row, got in zip(rows, reader.read(rows), strict=True):
        assert got.keys() == arrays.keys()
        for n, arr in arrays.items():
            want = np.asarray(arr[row])
            assert same_bits(got[n], want), (n, row)
            assert got[n].flags.writeable


def test_row_reader_names_the_chunk_that_does_not_decode(store, tmp_path):
    """A damaged chunk (same size, so the manifest check passes) is the BadInputError naming it, raised when
    its date's turn comes: the dates before it are read."""
    copy = tmp_path / "damaged.zarr"
    shutil.copytree(store, copy)
    group = zarr.open_group(copy, mode="r")
    chunk = copy / "truth_t850" / "c" / "3" / "0" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[:32] = bytes(32)
    chunk.write_bytes(bytes(data))
    reader = prefetch.RowReader({n: group[n] for n in ("ens_mean_t", "truth_t850")})
    rows = reader.read([1, 2, 3, 4])
    assert [next(rows)["truth_t850"].shape for _ in range(2)] == [group["truth_t850"].shape[1:]] * 2
    with pytest.raises(BadInputError, match=r"truth_t850/c/3/0/0/0 cannot be decoded"):
        next(rows)


@pytest.mark.parametrize("cache", [1.0, 0.5])
def test_batched_prefetch_yields_the_plain_loaders_batches(store, cache):
    """2 epochs, 3 threads each reading its next 4 samples at once, the split cached whole or half (the rest
    staged in a window of 6): the plain loader's batches bit for bit, every cached sample read once."""
    cfg = DataConfig(store=str(store), sample=SampleSpec(target="t850", variables=("t", "z")), batch_size=3)
    counting = prefetch.CountingStore(LocalStore(str(store), read_only=True))
    base = StoreDataset(cfg, "train", source=counting)
    plain_base = StoreDataset(cfg, "train")
    counting.gets.clear()
    spec = prefetch.StreamSpec(len(base), seed=5)
    nbytes = base.sample_nbytes()
    loader = prefetch.clairvoyant_loader(
        base,
        spec,
        batch_size=3,
        sample_bytes=nbytes,
        ram_bytes=int(cache * len(base)) * nbytes,
        epochs=2,
        threads=3,
        lookahead=6,
        read_batch=4,
    )
    data = loader.dataset
    assert isinstance(data, prefetch.ClairvoyantDataset) and isinstance(loader.sampler, DistributedSampler)
    plain_sampler = DistributedSampler(plain_base, num_replicas=1, rank=0, shuffle=True, seed=5)
    plain = DataLoader(plain_base, batch_size=3, sampler=plain_sampler)
    for epoch in range(2):
        plain_sampler.set_epoch(epoch)
        loader.sampler.set_epoch(epoch)
        n = 0
        for a, b in zip(plain, loader, strict=True):
            assert a.keys() == b.keys()
            for k in a:
                assert torch.equal(a[k].view(torch.int32), b[k].view(torch.int32)), (epoch, k)
            n += 1
        assert n == len(plain)
    data.close()
    assert data.backing_reads == 2 * len(base) - data.plan.predicted_hits()
    truth_reads = sorted(k for key, k in counting.gets.items() if key.startswith("truth_t850/c/"))
    want = sorted(1 if i in data.plan.slots else c for i, c in data.plan.counts.items())
    assert truth_reads == want
    assert sum(st.off_plan for st in data.stats) == 0


class _FailsOnce(Dataset):
    """8 samples of one small array; the first read of index ``bad`` raises OSError (a read that fails)."""

    def __init__(self, bad: int):
        self.bad, self.failed = bad, False

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if i == self.bad and not self.failed:
            self.failed = True
            raise OSError(f"sample {i}: read failed")
        return {"x": np.full(3, float(i))}


def test_an_access_after_the_consumers_own_read_failed_raises_instead_of_waiting_forever():
    """No prefetch thread: the consumer reads each cached sample itself. Its read of sample 2 fails; the next
    access of sample 2 used to wait forever on the entry the failed read had claimed (the entry was never
    marked done). It must raise the read's error at once."""
    plan = prefetch.plan_cache(prefetch.StreamSpec(n=8), sample_bytes=24, ram_bytes=10_000)
    data = prefetch.ClairvoyantDataset(_FailsOnce(bad=2), plan, threads=0)
    with pytest.raises(OSError, match="sample 2"):
        data[2]
    outcome: list[BaseException] = []

    def again() -> None:
        try:
            data[2]
        except BaseException as err:  # the error is the outcome
            outcome.append(err)

    t = threading.Thread(target=again, daemon=True)
    t.start()
    t.join(timeout=HANG_CEILING_S)  # a ceiling against a hang only: the access returns at once when correct
    assert not t.is_alive(), "the second access of a sample whose read failed waits forever"
    assert isinstance(outcome[0], OSError)
    data.close()
