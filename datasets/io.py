"""The one place postcast writes: atomic files and directories, zarr templates and region writes; and
the lock every netCDF open and write holds (HDF5 is not thread-safe).

Rules every writer follows:

* a file or directory appears at its final path only when it is complete: write to a temporary
  sibling (``.<name>.tmp-<pid>``), then ``os.replace`` (atomic on POSIX within a filesystem);
* zarr stores are created from a template (metadata only, ``compute=False``) and filled by region
  writes that each cover whole chunks, so concurrent workers never touch the same chunk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import threading
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr
from xarray.backends.netCDF4_ import NETCDF4_PYTHON_LOCK
from zarr.codecs import BloscCodec

from postcast.datasets import schema
from postcast.datasets.core.errors import OutputError

# Every array is blosc-lz4 with byte shuffle, written through the zarrs Rust codec pipeline when it is
# installed: measured per array kind by benchmarks/store_codecs.py (docs/store.md "Encoding"). At 0.5 deg
# lz4 writes member fields 1.8-2x faster than zstd level 1 and reads them ~2x faster, for 2.08x
# compression instead of 2.35x; zarrs writes the 1-3 MB ensemble-statistics and truth chunks 1.3-2x faster.
ZARR_COMPRESSOR = BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")
ZARRS_PIPELINE = "zarrs.ZarrsCodecPipeline"


def zarrs_available() -> bool:
    """Whether the zarrs Rust codec pipeline can be imported."""
    try:
        import zarrs  # noqa: F401
    except ImportError:
        return False
    return True


def use_zarrs() -> bool:
    """Make zarr-python encode and decode through zarrs when it is installed (zarrs itself falls back
    to zarr-python's pipeline for anything it does not support); True when it is in use.
    ``POSTCAST_ZARRS=0`` in the environment keeps zarr-python's own pipeline (to compare, or to
    rule zarrs out). The one place postcast configures zarr: called when this module is imported,
    so every process that reads or writes a store (dask workers included) uses the same pipeline.
    Either pipeline reads what the other wrote: the store does not record which one wrote it."""
    if os.environ.get("POSTCAST_ZARRS", "1") == "0" or not zarrs_available():
        return False
    zarr.config.set({"codec_pipeline.path": ZARRS_PIPELINE})
    return True


ZARRS_IN_USE = use_zarrs()


def compressors_for(kind: str) -> list[Any]:
    """The compressors of an array kind: ``member`` (member fields) or ``field`` (ensemble
    statistics, truth, oracle). Both are blosc-lz4 today; the kinds are kept apart because the
    measurements are made per kind."""
    if kind not in ("member", "field"):
        msg = f"array kind {kind!r}: use 'member' or 'field'"
        raise ValueError(msg)
    return [ZARR_COMPRESSOR]


def codec_name(compressors: list[Any]) -> str:
    """A short name of a compressor list: blosc-zstd1, blosc-lz4, zstd1, none."""
    if not compressors:
        return "none"
    c = compressors[0]
    if isinstance(c, BloscCodec):
        return f"blosc-{c.cname.value}{c.clevel}" if c.cname.value == "zstd" else f"blosc-{c.cname.value}"
    return f"{type(c).__name__.removesuffix('Codec').lower()}{getattr(c, 'level', '')}"


def _tmp_sibling(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temporaries(final: Path) -> list[Path]:
    """Remove the temporaries (``.NAME.tmp-PID``, ``.NAME.old-PID``) that killed processes left in
    ``final``'s folder (beside any file, including ones a rerun skips); those of live processes are
    kept. Returns what was removed."""
    removed = []
    for p in final.parent.glob(".*-*"):
        kind, _, pid = p.name.rpartition("-")
        if kind.endswith((".tmp", ".old")) and pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            remove(p)
            removed.append(p)
    return removed


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary sibling path; on success move it onto ``path`` atomically, else remove it.

    Works for files and directories (an existing directory at ``path`` is replaced).
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(final)
    tmp = _tmp_sibling(final)
    remove(tmp)
    try:
        yield tmp
        replace(tmp, final)
    finally:
        remove(tmp)


def replace(src: Path, dst: Path) -> None:
    """Move ``src`` onto ``dst`` atomically; an existing directory ``dst`` is first moved aside."""
    if dst.is_dir() and not dst.is_symlink():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        os.replace(dst, old)
        os.replace(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """``obj`` as standard JSON, atomically: NaN and infinities (which JSON lacks) as null, numpy scalars as
    numbers, anything else unknown as its string."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(_json_ready(obj), indent=2, sort_keys=True, default=str, allow_nan=False) + "\n")


def _json_ready(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_ready(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


# The HDF5 library inside the netCDF4 wheel is not thread-safe, and xarray locks only its own array reads,
# not the metadata it reads while opening a file: two threads opening netCDF files at once crash the
# process (SIGSEGV/SIGBUS in libhdf5; the service reads products from its thread pool and its event loop).
# Every netCDF open and write in postcast holds this lock (tests/test_netcdf_threads.py).
NETCDF_LOCK = threading.RLock()


@contextlib.contextmanager
def open_netcdf(path: str | os.PathLike[str], **kw: Any) -> Iterator[xr.Dataset]:
    """An eager netCDF read: ``path`` open (netcdf4 engine) for the ``with`` block, which loads what it
    needs; nothing else touches HDF5 meanwhile (xarray's own lock for lazy dask reads is held too)."""
    with NETCDF_LOCK, NETCDF4_PYTHON_LOCK, xr.open_dataset(path, engine="netcdf4", lock=False, **kw) as ds:
        yield ds


def open_netcdf_lazy(path: str | os.PathLike[str], **kw: Any) -> xr.Dataset:
    """A lazy (dask-chunked or lazily indexed) netCDF dataset: opened under :data:`NETCDF_LOCK`; its array
    reads later take xarray's own lock."""
    with NETCDF_LOCK:
        return xr.open_dataset(path, engine="netcdf4", **kw)


def write_netcdf(ds: xr.Dataset, path: str | os.PathLike[str], *, compress: bool = True) -> None:
    """Write ``ds`` as netCDF4 atomically (zlib level 4 on float variables when ``compress``)."""
    encoding = {}
    if compress:
        encoding = {
            name: {"zlib": True, "complevel": 4}
            for name, v in ds.data_vars.items()
            if np.issubdtype(v.dtype, np.floating)
        }
    with atomic_path(path) as tmp, NETCDF_LOCK:
        try:
            ds.to_netcdf(tmp, engine="netcdf4", format="NETCDF4", encoding=encoding)
        except RuntimeError as err:  # netCDF4 reports a full disk or file size limit as "NetCDF: HDF error"
            msg = f"cannot write {path}: {err} (disk full or file size limit?); free space and rerun"
            raise OutputError(msg) from err


TARGET_CHUNK_BYTES = 4 * 2**20  # grow small chunks towards ~4 MB (zarr-python 3 pays per chunk)


def chunk_shape(
    dims: tuple[str, ...],
    shape: tuple[int, ...],
    *,
    whole: tuple[str, ...],
    grow: tuple[str, ...],
    itemsize: int = 4,
    target: int = TARGET_CHUNK_BYTES,
) -> tuple[int, ...]:
    """Chunk shape holding ``whole`` dims entirely and 1 along others, then ``grow`` dims (in order)
    taken whole while the chunk stays under ``target`` bytes."""
    chunk = {d: (n if d in whole else 1) for d, n in zip(dims, shape, strict=True)}
    size = dict(zip(dims, shape, strict=True))
    for d in grow:
        if d in chunk and np.prod(list(chunk.values())) * itemsize * size[d] <= target:
            chunk[d] = size[d]
    return tuple(chunk[d] for d in dims)


def zarr_encoding(ds: xr.Dataset, chunks: Mapping[str, tuple[int, ...]]) -> dict[str, dict[str, Any]]:
    """Chunking + compression for every data variable (``chunks`` maps name -> chunk shape)."""
    enc: dict[str, dict[str, Any]] = {}
    for name in ds.data_vars:  # Variables, not DataArrays: building one scans every variable (hundreds of arrays)
        v = ds.variables[name]
        kind = "member" if schema.MEMBER in v.dims else "field"
        e: dict[str, Any] = {"compressors": compressors_for(kind)}
        if str(name) in chunks:
            e["chunks"] = chunks[str(name)]
        if np.issubdtype(v.dtype, np.floating):
            e["_FillValue"] = np.nan
        enc[str(name)] = e
    return enc


@contextlib.contextmanager
def os_errors(path: str | os.PathLike[str]) -> Iterator[None]:
    """Give an operating-system error the zarrs (Rust) codec pipeline reports as a ``RuntimeError``
    ("File too large (os error 27)") back its ``OSError`` form, so a full disk is told apart from a
    bug (exit 74, not a traceback) whichever pipeline writes."""
    try:
        yield
    except RuntimeError as err:
        settle_zarr_io()
        found = re.search(r"\(os error (\d+)\)", str(err))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), str(path)) from err
    except Exception:
        settle_zarr_io()
        raise


def settle_zarr_io(timeout: float = 30.0) -> None:
    """Wait for the chunk writes a failed zarr-python call left running on zarr's event loop (its
    ``asyncio.gather`` returns at the first failure; the other writes go on). Left pending, they are
    destroyed when zarr closes its loop at exit, each printing a traceback after the one error line
    (hundreds on a full disk)."""
    import asyncio

    from zarr.core import sync as zarr_sync

    loop = zarr_sync.loop[0]
    if loop is None or loop.is_closed():
        return

    async def settle() -> None:
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if others:
            await asyncio.wait(others, timeout=timeout)

    with contextlib.suppress(Exception):  # best effort: the error being raised is what matters
        asyncio.run_coroutine_threadsafe(settle(), loop).result(timeout + 5)


def write_zarr(
    ds: xr.Dataset,
    path: str | os.PathLike[str],
    *,
    chunks: Mapping[str, tuple[int, ...]] | None = None,
    group: str | None = None,
    mode: str = "w",
    compute: bool = True,
) -> None:
    """Write a whole dataset (or a template with ``compute=False``) as zarr format 3."""
    with warnings.catch_warnings(), os_errors(path):
        warnings.simplefilter("ignore", category=UserWarning)
        ds.to_zarr(
            path,
            mode=mode,
            group=group,
            zarr_format=3,
            consolidated=False,
            compute=compute,  # type: ignore[call-overload]
            encoding=zarr_encoding(ds, chunks or {}),
        )


def write_template(
    ds: xr.Dataset, path: str | os.PathLike[str], *, chunks: Mapping[str, tuple[int, ...]], group: str | None = None
) -> None:
    """Create the arrays of a template (metadata only) exactly as ``write_zarr(..., compute=False)`` does, at a
    fraction of its cost: xarray builds and tokenizes a dask graph per array and creates the arrays one after
    another (~10 ms each: 5 s of CPU for the 456 arrays of a 0.5 deg statistics group). Here xarray writes
    the coordinates and one prototype array per layout (dimensions, shape, dtype, chunks, encoding; plain
    attributes may differ), and zarr's ``create_hierarchy`` creates the others concurrently from their
    prototype's metadata with their own attributes. The data variables' values are not used."""
    enc = zarr_encoding(ds, chunks)
    protos: dict[str, str] = {}  # name -> the prototype of its layout
    first: dict[str, str] = {}  # layout -> prototype name
    for name in ds.data_vars:
        v = ds.variables[name]
        plain = all(_plain_json(a) for a in v.attrs.values())
        key = repr(
            (
                v.dims,
                v.shape,
                str(v.dtype),
                None if plain else sorted(v.attrs.items(), key=str),
                sorted(enc[str(name)].items(), key=str),
            )
        )
        protos[str(name)] = first.setdefault(key, str(name))
    others = [n for n, p in protos.items() if n != p]  # drop_vars keeps every coordinate (ds[names] would not)
    write_zarr(ds.drop_vars(others), path, chunks=chunks, group=group, mode="w", compute=False)
    root = zarr.open_group(str(path), mode="r+", zarr_format=3)
    prefix = f"{group.strip('/')}/" if group else ""
    nodes = {}
    made = {}  # prototype -> (its metadata, the attributes zarr added to it: e.g. _FillValue), read once each
    variables = ds.variables  # by name in O(1): ds[name] builds a DataArray, scanning every variable for coords
    for name in others:
        proto = protos[name]
        if proto not in made:
            meta = root[prefix + proto].metadata
            made[proto] = meta, {k: a for k, a in meta.attributes.items() if k not in variables[proto].attrs}
        meta, own = made[proto]
        nodes[prefix + name] = dataclasses.replace(meta, attributes={**variables[name].attrs, **own})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)
        for _ in zarr.create_hierarchy(store=root.store, nodes=nodes):
            pass


def _plain_json(value: Any) -> bool:
    """An attribute value xarray stores unchanged (numpy values it converts; those keep their own layout)."""
    if isinstance(value, list | tuple):
        return isinstance(value, list) and all(_plain_json(v) for v in value)
    return isinstance(value, str | bool | int | float) and not isinstance(value, np.generic)


def write_region(ds: xr.Dataset, path: str | os.PathLike[str], region: Mapping[str, slice]) -> None:
    """Write the variables of ``ds`` into an existing store at ``region`` (whole chunks only)."""
    dims = set(region)
    keep = [n for n, v in ds.data_vars.items() if dims & set(v.dims)]
    sub = ds[keep]
    sub = sub.drop_vars([c for c in sub.coords])
    with warnings.catch_warnings(), os_errors(path):
        warnings.simplefilter("ignore", category=UserWarning)
        sub.to_zarr(path, region=dict(region), mode="r+", zarr_format=3, consolidated=False)


def write_into(ds: xr.Dataset, path: str | os.PathLike[str], *, group: str | None = None) -> None:
    """Write the data variables of ``ds`` into arrays that already exist with the same shapes (created from
    a template with :func:`write_template` or ``write_zarr(..., compute=False)``), and its attributes onto the
    group. The arrays are written concurrently through zarr's asynchronous API: hundreds of arrays (the
    statistics group) take 1.8 s instead of 2.6 s through xarray, which writes them one after another. The
    values go in as they are (NaN stays NaN: the arrays' fill value; float data carry no CF encoding); data
    with other dtypes go through xarray, which encodes them."""
    with warnings.catch_warnings(), os_errors(path):
        warnings.simplefilter("ignore", category=UserWarning)
        variables = {str(n): ds.variables[n] for n in ds.data_vars}  # (ds[n] would scan every variable per name)
        if all(np.issubdtype(v.dtype, np.floating) for v in variables.values()):
            values = {n: np.asarray(v.values) for n, v in variables.items()}
            zarr.core.sync.sync(_write_arrays(str(path), group or "", values))  # on zarr's own event loop
        else:  # values CF encoding may change (times, integers): through xarray
            ds.drop_vars(list(ds.coords)).to_zarr(path, group=group, mode="r+", zarr_format=3, consolidated=False)
    if ds.attrs:  # only then: tasks writing other arrays of the group at once never rewrite its metadata
        target = zarr.open_group(str(path), mode="r+", zarr_format=3, path=group or "")
        target.attrs.update(dict(ds.attrs))


async def _write_arrays(path: str, group: str, values: Mapping[str, np.ndarray]) -> None:
    import asyncio

    target = await zarr.api.asynchronous.open_group(store=path, mode="r+", path=group, zarr_format=3)

    async def one(name: str, v: np.ndarray) -> None:
        arr = await target.getitem(name)
        if not isinstance(arr, zarr.AsyncArray) or tuple(arr.shape) != v.shape:
            found = getattr(arr, "shape", "a group")
            msg = f"{path}/{group}/{name}: the store holds {found}, the data {v.shape}: recreate the template"
            raise ValueError(msg)
        await arr.setitem(slice(None), v)

    await asyncio.gather(*(one(n, v) for n, v in values.items()))


def update_zarr_attrs(path: str | os.PathLike[str], attrs: Mapping[str, Any]) -> None:
    group = zarr.open_group(str(path), mode="r+", zarr_format=3)
    group.attrs.update(dict(attrs))


def consolidate(path: str | os.PathLike[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)
        zarr.consolidate_metadata(str(path), zarr_format=3)


def open_zarr(path: str | os.PathLike[str], *, group: str | None = None, chunks: Any = None) -> xr.Dataset:
    """Open a postcast zarr store (consolidated when possible), silencing zarr-3 advisory warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)
        warnings.simplefilter("ignore", category=RuntimeWarning)
        return xr.open_zarr(path, group=group, chunks=chunks, zarr_format=3)
