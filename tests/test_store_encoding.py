"""The store's encoding (datasets/io.py, chosen by benchmarks/store_codecs.py; docs/store.md "Encoding"):
blosc-lz4 with byte shuffle for every array kind, the zarrs codec pipeline when installed, and a
graceful fallback to zarr-python's own pipeline."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from zarr.codecs import BloscCodec

from postcast.datasets import io, schema
from postcast.datasets.synthetic import World

DEFAULT_PIPELINE = "zarr.core.codec_pipeline.BatchedCodecPipeline"


def _dataset() -> xr.Dataset:
    """Synthetic member values (5 deg) and their ensemble mean: one array of each kind."""
    grid = schema.Grid(5.0)
    x = World(0, grid).members_field("t", 850, pd.Timestamp("2013-01-03"), 24).astype(np.float32)  # (m, lat, lon)
    members = xr.DataArray(x[None], dims=(schema.INIT_TIME, schema.MEMBER, schema.LAT, schema.LON))
    return xr.Dataset({"t": members, "ens_mean_t": members.mean(schema.MEMBER)})


def _blosc(path: str, name: str) -> BloscCodec:
    (codec,) = zarr.open_array(f"{path}/{name}", mode="r").compressors
    assert isinstance(codec, BloscCodec), codec
    return codec


def test_every_array_kind_is_written_blosc_lz4_shuffled(tmp_path):
    ds = _dataset()
    path = str(tmp_path / "s.zarr")
    io.write_zarr(ds, path, chunks={"t": (1, 10, 37, 72), "ens_mean_t": (1, 37, 72)})
    for name in ("t", "ens_mean_t"):
        codec = _blosc(path, name)
        assert (codec.cname.value, codec.shuffle.value) == ("lz4", "shuffle"), name
    back = io.open_zarr(path).load()
    xr.testing.assert_identical(back[["t", "ens_mean_t"]], ds)


def test_unknown_array_kind_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="'member' or 'field'"):
        io.compressors_for("members")


@pytest.mark.skipif(importlib.util.find_spec("zarrs") is None, reason="zarrs is not installed")
def test_zarrs_is_in_use_and_zarr_python_reads_what_it_wrote(tmp_path):
    """Written through zarrs (postcast's default), read back through zarr-python's own pipeline: the
    same values (an independent decoder)."""
    assert io.ZARRS_IN_USE and zarr.config.get("codec_pipeline.path") == io.ZARRS_PIPELINE
    ds = _dataset()
    path = str(tmp_path / "s.zarr")
    io.write_zarr(ds, path, chunks={"t": (1, 10, 37, 72)})
    with zarr.config.set({"codec_pipeline.path": DEFAULT_PIPELINE}):
        got = zarr.open_array(f"{path}/t", mode="r")[...]
    np.testing.assert_array_equal(got, ds["t"].values)


def test_postcast_zarrs_0_falls_back_to_zarr_python_and_still_writes(tmp_path):
    """The fallback path (as when zarrs is not installed): zarr-python's own pipeline, same store."""
    code = ("import numpy as np, xarray as xr, zarr\nfrom postcast.datasets import io\n"
            "assert not io.ZARRS_IN_USE, 'zarrs in use'\n"
            f"assert zarr.config.get('codec_pipeline.path') == {DEFAULT_PIPELINE!r}\n"
            "ds = xr.Dataset({'x': (('a', 'b'), np.arange(12, dtype=np.float32).reshape(3, 4))})\n"
            f"io.write_zarr(ds, {str(tmp_path / 'f.zarr')!r})\n"
            f"assert (io.open_zarr({str(tmp_path / 'f.zarr')!r}).x.values == ds.x.values).all()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "POSTCAST_ZARRS": "0"}, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
