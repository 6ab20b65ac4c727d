"""Rows of zarr arrays read a batch at a time: the chunk bytes of several samples fetched in one round trip
to zarr's event loop (every read in flight at once, so per-read latencies overlap), decoded in the caller's
thread (:class:`RowReader`).

A sample is one row (one init date) of each of its arrays, and ingest writes one chunk per row. Through
zarr-python each such chunk costs ~1 ms of Python on zarr's single event-loop thread (indexers, codec
pipeline, a thread hop per decode): more than the sample's decoding and assembly together, and serialised
across the prefetch threads. For an array whose row is exactly one chunk encoded ``bytes`` (+ ``blosc``),
:class:`RowReader` gets the chunk's bytes from the array's own store and decompresses them with numcodecs'
blosc (the library zarr's BloscCodec calls) into the row's array: the same bits, a quarter of the
cost. Any other layout (sharding, other codecs, a row over several chunks, zarr 2 metadata) is read
through zarr, as is a chunk the store does not hold (zarr's fill value). A chunk that does not decode is
the :class:`~postcast.datasets.core.errors.BadInputError` naming it that
:func:`postcast.datasets.reads.read_rows` raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import zarr
from numcodecs import blosc
from zarr.codecs import BloscCodec, BytesCodec
from zarr.core.buffer import Buffer, default_buffer_prototype
from zarr.core.sync import sync

from postcast.datasets import reads

Row = dict[str, np.ndarray]


def direct_layout(arr: zarr.Array[Any]) -> tuple[np.dtype[Any], bool] | None:
    """(stored dtype, blosc-compressed) when a row of ``arr`` is one chunk this module decodes itself, else None."""
    meta = arr.metadata
    if meta.zarr_format != 3 or arr.ndim < 1 or arr.chunks[0] != 1 or tuple(arr.chunks[1:]) != tuple(arr.shape[1:]):
        return None
    codecs = tuple(meta.codecs)
    if not 1 <= len(codecs) <= 2 or type(codecs[0]) is not BytesCodec:
        return None
    if any(type(c) is not BloscCodec for c in codecs[1:]):
        return None
    native = np.dtype(arr.dtype)
    if native.kind not in "biufc":
        return None
    endian = codecs[0].endian
    stored = native.newbyteorder("<" if endian is None or endian.value == "little" else ">")
    return stored, len(codecs) == 2


class RowReader:
    """Reads whole rows (the first axis) of ``arrays``: ``read(rows)`` yields, per row, ``{name: row
    values}`` equal to ``arrays[name][row]``; all chunks of all rows are fetched concurrently."""

    def __init__(self, arrays: Mapping[str, zarr.Array[Any]]):
        self.arrays = dict(arrays)
        self.layout = {n: direct_layout(a) for n, a in self.arrays.items()}

    def read(self, rows: Sequence[int]) -> Iterator[Row]:
        """The rows in order; each row decoded only when it is asked for (the caller builds the previous
        sample meanwhile). A row that cannot be read raises when its turn comes (earlier rows are yielded)."""
        fetched = sync(self._fetch([int(r) for r in rows]))
        for k, row in enumerate(rows):
            yield self._decode(int(row), fetched[k])

    async def _fetch(self, rows: list[int]) -> list[dict[str, Any]]:
        """Per row, per array: the chunk's bytes (direct arrays), the decoded row (others), None (no chunk) or
        the exception the read raised."""
        proto = default_buffer_prototype()

        async def one(name: str, row: int) -> Any:
            arr = self.arrays[name].async_array
            if self.layout[name] is None:
                return await arr.getitem(row)
            key = arr.metadata.encode_chunk_key((row,) + (0,) * (arr.ndim - 1))
            return await (arr.store_path / key).get(prototype=proto)

        jobs = [one(n, r) for r in rows for n in self.arrays]
        out = await asyncio.gather(*jobs, return_exceptions=True)
        per = len(self.arrays)
        return [dict(zip(self.arrays, out[k * per : (k + 1) * per], strict=True)) for k in range(len(rows))]

    def _decode(self, row: int, got: dict[str, Any]) -> Row:
        values: Row = {}
        try:
            for name, item in got.items():
                if isinstance(item, BaseException):
                    raise item
                values[name] = self._value(name, row, item)
        except Exception as err:  # (zarr's codecs and blosc raise RuntimeError, ValueError, ...: undecodable)
            raise reads.undecodable(self.arrays, row, err) from err
        return values

    def _value(self, name: str, row: int, item: Any) -> np.ndarray:
        layout = self.layout[name]
        arr = self.arrays[name]
        if layout is None:  # read by zarr
            return np.asarray(item)
        if item is None:  # no chunk in the store: zarr's fill value
            return np.asarray(arr[row])
        assert isinstance(item, Buffer)
        stored, compressed = layout
        raw = blosc.decompress(item.as_numpy_array()) if compressed else item.to_bytes()
        if len(raw) != np.dtype(stored).itemsize * int(np.prod(arr.shape[1:])):
            msg = f"chunk of {len(raw)} bytes decoded, want a {stored} row of shape {arr.shape[1:]}"
            raise ValueError(msg)
        out = np.frombuffer(raw, dtype=stored).reshape(arr.shape[1:]).copy()  # writable, as zarr's
        return out if stored == np.dtype(arr.dtype) else out.astype(np.dtype(arr.dtype))
