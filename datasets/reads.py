"""zarr read utilities without torch: concurrent row reads, chunk checks and a read-counting store wrapper.

:func:`read_rows` is how :class:`postcast.datasets.loaders.datamodule.StoreDataset` reads the
variables of one sample; a chunk that cannot be decoded (truncated, overwritten) is a
:class:`BadInputError` naming the variable and the chunk (``ARRAY/c/i/j/k``), raised wherever the read
runs (a loader thread or worker hands it on). zarr reads a deleted chunk as the fill value (NaN), so
:func:`check_chunks` compares the chunk files a reader needs with the manifest ingest recorded
(:mod:`postcast.datasets.integrity`): present and of the recorded size, else Missing/BadInputError
naming the chunk. :class:`CountingStore` measures backing-store reads (the clairvoyant loader's tests
and benchmarks). ``read_rows`` and ``CountingStore`` are re-exported by
:mod:`postcast.datasets.loaders.prefetch`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.core.sync import sync
from zarr.storage import WrapperStore

from postcast.datasets import integrity
from postcast.datasets.core.errors import BadInputError, MissingInputError

FIX = "check the store with `postcast inspect STORE --verify`; rebuild it with `postcast ingest --overwrite`"

# ---------------------------------------------------------------- zarr reads


def read_rows(arrays: Mapping[str, zarr.Array[Any]], row: int) -> dict[str, np.ndarray]:
    """Index ``row`` along the first axis of every array, all fetched and decoded concurrently in
    one zarr call (one round trip to zarr's event loop instead of one per array: on a filesystem
    with per-read latency, the latencies overlap)."""
    names = list(arrays)

    async def fetch() -> list[Any]:
        return await asyncio.gather(*(arrays[n].async_array.getitem(row) for n in names))

    try:
        values = sync(fetch())
    except Exception as err:  # (zarr's codecs raise RuntimeError, ValueError, ...: any means undecodable)
        raise undecodable(arrays, row, err) from err
    return {n: np.asarray(v) for n, v in zip(names, values, strict=True)}


def undecodable(arrays: Mapping[str, zarr.Array[Any]], row: int, err: Exception) -> BadInputError:
    """The error naming the first chunk of ``row`` that does not decode (each chunk read on its own)."""
    for name, arr in arrays.items():
        found = _row_error(name, arr, row)
        if found is not None:
            return found
    return BadInputError(f"init-date row {row} of {sorted(arrays)} cannot be read ({err}); {FIX}")


def _row_error(name: str, arr: zarr.Array[Any], row: int) -> BadInputError | None:
    """The error naming the first chunk of ``arr`` at ``row`` that does not decode, else None."""
    for idx in itertools.product([row // arr.chunks[0]], *(range(n) for n in arr.cdata_shape[1:])):
        try:
            arr.blocks[idx]
        except Exception as err:  # (which codec error does not matter)
            key = f"{name}/{arr.metadata.encode_chunk_key(idx)}"
            return BadInputError(f"variable {name!r}: chunk {key} cannot be decoded ({err}); {FIX}")
    return None


def first_undecodable(store_path: str | os.PathLike[str], names: Iterable[str]) -> BadInputError | None:
    """The error naming the first chunk of arrays ``names`` that does not decode, None if all do: what a
    reader that failed inside xarray or dask (which name neither variable nor chunk) reports instead."""
    group = zarr.open_group(store_path, mode="r")
    for name in names:
        arr = group.get(name)
        if not isinstance(arr, zarr.Array):
            continue
        for row in range(0, arr.shape[0], arr.chunks[0]):
            err = _row_error(name, arr, row)
            if err is not None:
                return err
    return None


def check_chunks(store_path: str | os.PathLike[str], names: Iterable[str], rows: Iterable[int]) -> None:
    """Every chunk file of ``names`` at init-date ``rows`` (arrays chunked one date per chunk along the
    first axis, as ingest writes them) that the store's chunk manifest records is present and of the
    recorded size: a deleted one is a MissingInputError, one of another size a BadInputError, each naming
    the chunk. A stat per chunk, no read; stores without a manifest are not checked."""
    root = Path(store_path)
    manifest = root / integrity.MANIFEST
    if not manifest.is_file():
        return
    wanted, heads = set(rows), set(names)
    for key, rec in integrity._read_manifest(manifest).items():
        name, _, rest = key.partition("/c/")
        if name not in heads or int(rest.split("/", 1)[0]) not in wanted:
            continue
        _check_chunk(root, name, key, rec["size"])


def _check_chunk(root: Path, name: str, key: str, size: int) -> None:
    path = root / key
    if not path.is_file():
        msg = f"variable {name!r}: chunk {key} of {root} is missing (deleted after ingest); {FIX}"
        raise MissingInputError(msg, missing=[key])
    if path.stat().st_size != size:
        msg = (
            f"variable {name!r}: chunk {key} of {root} is damaged ({path.stat().st_size} bytes, ingest wrote "
            f"{size}); {FIX}"
        )
        raise BadInputError(msg)


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
