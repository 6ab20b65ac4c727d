"""GRIB edition 1 in the ENS-10 form: written with eccodes, read back by cfgrib and by postcast."""

import eccodes
import numpy as np
import pandas as pd
import pytest
import xarray as xr

from postcast.datasets import schema
from postcast.datasets.core import checksums
from postcast.datasets.sources import messages as grib
from postcast.datasets.synth import synthetic


@pytest.fixture(scope="module")
def one_file(synth_grib, tiny_cfg):
    month, day = tiny_cfg.month_days[0]
    return synth_grib / grib.file_name("pl", month, day), synth_grib / grib.file_name("sfc", month, day)


def test_file_set_and_message_counts(synth_grib, tiny_cfg):
    names = sorted(p.name for p in synth_grib.iterdir() if p.name.startswith("output."))
    assert names == sorted(grib.file_name(k, m, d) for m, d in tiny_cfg.month_days for k in ("pl", "sfc"))
    pl, sfc = grib.index_file(synth_grib / names[0]), grib.index_file(synth_grib / names[len(names) // 2])
    n_years = tiny_cfg.years[1] - tiny_cfg.years[0] + 1
    # ENS-10 per file: years x members x steps x (levels x 7 | 11)
    assert {len(pl), len(sfc)} == {n_years * 10 * 3 * 2 * 7, n_years * 10 * 3 * 11}


def test_cfgrib_sees_ens10_attributes(one_file):
    pl, _ = one_file
    ds = xr.open_dataset(pl, engine="cfgrib", backend_kwargs={"indexpath": "", "filter_by_keys": {"shortName": "t"}})
    assert ds["t"].dims == ("number", "time", "step", "isobaricInhPa", "latitude", "longitude")
    assert ds.attrs["GRIB_edition"] == 1 and ds.attrs["GRIB_centre"] == "ecmf"
    assert ds["t"].attrs["GRIB_dataType"] == "pf" and ds["t"].attrs["GRIB_totalNumber"] == 11
    assert ds["latitude"].values[0] == 90.0  # north -> south, as ENS-10
    assert list(ds["step"].values.astype("timedelta64[h]").astype(int)) == [0, 24, 48]


def test_postcast_decode_equals_cfgrib(one_file):
    pl, _sfc = one_file
    idx = grib.index_file(pl)
    rows = idx[(idx["var"] == "t") & (idx.level == 850) & (idx.member == 3) & (idx.step_h == 48)]
    ours = grib.decode(pl, zip(rows.offset, rows.length, strict=True), (19, 36))
    ref = xr.open_dataset(pl, engine="cfgrib", backend_kwargs={"indexpath": "", "filter_by_keys": {"shortName": "t"}})
    ref = ref["t"].sel(number=3, isobaricInhPa=850, step=pd.Timedelta(hours=48))
    times = list(rows.init_time)
    np.testing.assert_array_equal(ours, ref.sel(time=times).values[:, ::-1])


def test_grib_values_equal_generator_within_packing_error(one_file, tiny_cfg):
    pl, sfc = one_file
    w = synthetic.world(tiny_cfg.seed, tiny_cfg.resolution)
    for path, var, level in ((pl, "z", 500), (pl, "q", 850), (sfc, "t2m", 0), (sfc, "sst", 0), (sfc, "tp", 0)):
        idx = grib.index_file(path)
        r = idx[(idx["var"] == var) & (idx.level == level) & (idx.member == 2) & (idx.step_h == 48)].iloc[0]
        got = grib.decode(path, [(r.offset, r.length)], (19, 36))[0]
        want = w.members_field(var, level, r.init_time, 48)[1]
        # 16-bit simple packing: error <= (max - min) / 2^16 (half a step, plus float32 rounding)
        tol = (np.nanmax(want) - np.nanmin(want)) / 2**16 + 1e-6 * np.nanmax(np.abs(want))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))  # SST missing over land survives
        assert np.nanmax(np.abs(got - want)) <= tol, var


def test_copy_messages_filters(one_file, tmp_path):
    _, sfc = one_file
    n = grib.copy_messages(sfc, tmp_path / "no_t2m", keep=lambda k: k["shortName"] != "2t")
    idx = grib.index_file(tmp_path / "no_t2m")
    assert n == len(idx) and "t2m" not in set(idx["var"]) and "tp" in set(idx["var"])


def test_corrupt_and_truncated_files_raise(one_file, tmp_path):
    pl, _ = one_file
    data = pl.read_bytes()
    cut = tmp_path / "cut"
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(Exception, match=r"truncated|corrupt"):
        grib.index_file(cut)
    empty = tmp_path / "empty"
    empty.write_bytes(b"not a grib file at all")
    with pytest.raises(Exception, match="no GRIB messages"):
        grib.index_file(empty)


def test_write_is_atomic(tmp_path, tiny_cfg):
    ds = synthetic.forecast_dataset(tiny_cfg, variables=["t2m"]).isel(init_time=[0])
    path = tmp_path / "output.sfc.20180101"
    n = grib.write_file(ds, path, "sfc")
    assert n == 30 and path.exists() and not list(tmp_path.glob(".*tmp*"))
    h = eccodes.codes_grib_new_from_file(open(path, "rb"))  # noqa: SIM115
    assert eccodes.codes_get(h, "bitsPerValue") == grib.BITS_PER_VALUE
    eccodes.codes_release(h)
    assert checksums.sha256_file(path)
    assert schema.VARIABLES["t2m"].grib_short_name == "2t"
