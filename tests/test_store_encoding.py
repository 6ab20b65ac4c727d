"""The store's encoding (datasets/io.py, chosen by benchmarks/store_codecs.py; docs/store.md "Encoding"):
blosc-lz4 with byte shuffle for every array kind, the zarrs codec pipeline when installed, and a
graceful fallback to zarr-python's own pipeline."""

from __future__ import annotations

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
from postcast.datasets.synth.synthetic import World

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
    code = (
        "import numpy as np, xarray as xr, zarr\nfrom postcast.datasets import io\n"
        "assert not io.ZARRS_IN_USE, 'zarrs in use'\n"
        f"assert zarr.config.get('codec_pipeline.path') == {DEFAULT_PIPELINE!r}\n"
        "ds = xr.Dataset({'x': (('a', 'b'), np.arange(12, dtype=np.float32).reshape(3, 4))})\n"
        f"io.write_zarr(ds, {str(tmp_path / 'f.zarr')!r})\n"
        f"assert (io.open_zarr({str(tmp_path / 'f.zarr')!r}).x.values == ds.x.values).all()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "POSTCAST_ZARRS": "0"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def _stats_like() -> tuple[xr.Dataset, dict[str, tuple[int, ...]]]:
    """A small statistics-group-like template: many arrays sharing three layouts (lazy NaNs, one shared
    dask array per layout, as ``statistics.template`` makes them), with coordinates."""
    import dask.array

    lat, lon = np.linspace(90, -90, 7), np.arange(0, 360, 40.0)
    coords = {
        schema.STEP: np.array([0, 24, 48]),
        schema.LEVEL: np.array([500, 850]),
        schema.LAT: lat,
        schema.LON: lon,
        schema.MEMBER: np.arange(3),
    }  # member: a coordinate no array uses
    layouts = [
        ((schema.STEP,), (3,), np.float64, (3,)),
        ((schema.STEP, schema.LEVEL), (3, 2), np.float64, (3, 2)),
        ((schema.STEP, schema.LAT, schema.LON), (3, 7, 9), np.float32, (1, 7, 9)),
    ]
    data, chunks = {}, {}
    for k, (dims, shape, dtype, chunk) in enumerate(layouts):
        lazy = dask.array.full(shape, np.nan, dtype=dtype, chunks=chunk)
        for name in ("t", "z", "u", "ens_mean_t"):
            data[f"{name}_{k}"] = xr.Variable(dims, lazy)
            chunks[f"{name}_{k}"] = chunk
    return xr.Dataset(data, coords=coords), chunks


def _metadata(path) -> dict[str, dict]:
    import json
    from pathlib import Path

    root = Path(path)
    return {p.parent.relative_to(root).as_posix(): json.loads(p.read_text()) for p in root.rglob("zarr.json")}


def test_write_template_creates_exactly_the_arrays_xarray_creates(tmp_path):
    """The fast template (a prototype per layout through xarray, the rest from its metadata through
    zarr.create_hierarchy) leaves every zarr.json as xarray's own compute=False write does."""
    ds, chunks = _stats_like()
    for path in (tmp_path / "a.zarr", tmp_path / "b.zarr"):  # an existing root group, as in an ingest
        io.write_zarr(xr.Dataset({"x": ("n", np.zeros(2))}), path)
    io.write_zarr(ds, tmp_path / "a.zarr", chunks=chunks, group="statistics", compute=False)
    io.write_template(ds, tmp_path / "b.zarr", chunks=chunks, group="statistics")
    want, got = _metadata(tmp_path / "a.zarr"), _metadata(tmp_path / "b.zarr")
    assert len(got) == 1 + 1 + 1 + 12 + 5  # root, its array x, the group, 12 arrays, 5 coordinates
    assert got == want
    back = io.open_zarr(tmp_path / "b.zarr", group="statistics")
    assert set(back.data_vars) == set(ds.data_vars) and np.isnan(back["t_2"].values).all()


def test_write_into_writes_what_xarray_writes_and_refuses_a_shape_mismatch(tmp_path):
    """The concurrent write into template arrays gives the same chunk files, byte for byte, and the same
    values and attributes as xarray's write of the same data; data of another shape is refused by name."""
    ds, chunks = _stats_like()
    rng = np.random.default_rng(0)
    filled = xr.Dataset(
        {n: (v.dims, rng.normal(size=v.shape).astype(v.dtype)) for n, v in ds.data_vars.items()},
        coords=ds.coords,
        attrs={"train_init_times": 3},
    )
    filled["t_2"][0, 0, 0] = np.nan  # a never-valid point
    for path in (tmp_path / "a.zarr", tmp_path / "b.zarr"):
        io.write_template(ds, path, chunks=chunks, group="statistics")
    io.write_zarr(filled, tmp_path / "a.zarr", chunks=chunks, group="statistics", mode="w")
    io.write_into(filled, tmp_path / "b.zarr", group="statistics")
    files = sorted(p.relative_to(tmp_path / "a.zarr") for p in (tmp_path / "a.zarr").rglob("c/**/*") if p.is_file())
    assert len(files) == 4 * (1 + 1 + 3) + 5  # and the five coordinates
    for rel in files:
        assert (tmp_path / "b.zarr" / rel).read_bytes() == (tmp_path / "a.zarr" / rel).read_bytes(), rel
    xr.testing.assert_identical(
        io.open_zarr(tmp_path / "b.zarr", group="statistics").load(),
        io.open_zarr(tmp_path / "a.zarr", group="statistics").load(),
    )
    with pytest.raises(ValueError, match=r"t_1.*recreate the template"):
        io.write_into(xr.Dataset({"t_1": (("a", "b"), np.zeros((2, 2)))}), tmp_path / "b.zarr", group="statistics")


def test_write_into_round_trips_data_that_are_not_floating_point(tmp_path):
    """Times (stored by xarray as integers with CF units) and integers take xarray's encoding path of
    ``write_into``; read back they are the values written."""
    import dask.array

    times = pd.date_range("2013-01-03", periods=4, freq="D").values.astype("datetime64[ns]")
    counts = np.arange(4, dtype=np.int32)
    tmpl = xr.Dataset(
        {"when": ("n", dask.array.from_array(times, chunks=4)), "count": ("n", dask.array.from_array(counts, chunks=4))}
    )
    io.write_template(tmpl, tmp_path / "s.zarr", chunks={"when": (4,), "count": (4,)})
    io.write_into(xr.Dataset({"when": ("n", times), "count": ("n", counts)}), tmp_path / "s.zarr")
    back = io.open_zarr(tmp_path / "s.zarr")
    np.testing.assert_array_equal(back["when"].values, times)
    np.testing.assert_array_equal(back["count"].values, counts)
