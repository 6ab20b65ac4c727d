"""zarr read utilities without torch: concurrent row reads and a read-counting store wrapper.

:func:`read_rows` is how :class:`postcast.datasets.loaders.datamodule.StoreDataset` reads the
variables of one sample; :class:`CountingStore` measures backing-store reads (the clairvoyant
loader's tests and benchmarks). Both are re-exported by :mod:`postcast.datasets.loaders.prefetch`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.core.sync import sync
from zarr.storage import WrapperStore

# ---------------------------------------------------------------- zarr reads


def read_rows(arrays: Mapping[str, zarr.Array[Any]], row: int) -> dict[str, np.ndarray]:
    """Index ``row`` along the first axis of every array, all fetched and decoded concurrently in
    one zarr call (one round trip to zarr's event loop instead of one per array: on a filesystem
    with per-read latency, the latencies overlap)."""
    names = list(arrays)

    async def fetch() -> list[Any]:
        return await asyncio.gather(*(arrays[n].async_array.getitem(row) for n in names))

    return {n: np.asarray(v) for n, v in zip(names, sync(fetch()), strict=True)}


# ---------------------------------------------------------------- zarr store wrappers (measurement)


class CountingStore(WrapperStore[Store]):
    """A zarr store that counts ``get`` calls and bytes per key (to measure backing-store reads)."""

    def __init__(self, store: Store):
        super().__init__(store)
        self.gets: dict[str, int] = {}
        self.bytes_read = 0
        self._lock = threading.Lock()

    def _with_store(self, store: Store) -> CountingStore:
        return type(self)(store)

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        buf = await self._store.get(key, prototype, byte_range)
        with self._lock:
            self.gets[key] = self.gets.get(key, 0) + 1
            self.bytes_read += len(buf) if buf is not None else 0
        return buf
