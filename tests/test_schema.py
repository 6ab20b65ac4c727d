import numpy as np
import pandas as pd
import pytest

from postcast.datasets import schema


def test_variable_tables_match_ens10():
    assert [v.name for v in schema.PL_VARIABLES] == ["z", "t", "q", "w", "d", "u", "v"]
    assert [v.param_id for v in schema.PL_VARIABLES] == [129, 130, 133, 135, 155, 131, 132]
    assert [v.name for v in schema.SFC_VARIABLES] == [
        "sst",
        "tcw",
        "tcwv",
        "cp",
        "tp",
        "msl",
        "tcc",
        "u10",
        "v10",
        "t2m",
        "skt",
    ]
    assert {v.name: v.param_id for v in schema.SFC_VARIABLES} == {
        "sst": 34,
        "tcw": 136,
        "tcwv": 137,
        "cp": 143,
        "tp": 228,
        "msl": 151,
        "tcc": 164,
        "u10": 165,
        "v10": 166,
        "t2m": 167,
        "skt": 235,
    }
    assert schema.variable("2t").name == "t2m" and schema.variable("10u").name == "u10"
    assert schema.variable("167").name == "t2m"
    assert schema.VARIABLES["z"].units == "m**2 s**-2"  # geopotential, not height
    assert schema.VARIABLES["cp"].accumulated and schema.VARIABLES["tp"].accumulated
    assert schema.VARIABLES["sst"].missing_over_land
    with pytest.raises(KeyError, match="unknown ENS-10 variable"):
        schema.variable("nope")


def test_cf_attrs():
    assert schema.cf_attrs(schema.VARIABLES["t2m"]) == {
        "units": "K",
        "long_name": "2 metre temperature",
        "GRIB_shortName": "2t",
        "GRIB_paramId": 167,
        "standard_name": "air_temperature",
    }
    tcw = schema.cf_attrs(schema.VARIABLES["tcw"])  # no CF standard name: none written
    assert tcw == {"units": "kg m**-2", "long_name": "Total column water", "GRIB_shortName": "tcw", "GRIB_paramId": 136}


def test_levels_steps_members():
    assert schema.LEVELS == (10, 50, 100, 200, 300, 400, 500, 700, 850, 925, 1000)
    assert schema.STEPS_H == (0, 24, 48) and schema.N_MEMBERS == 10
    assert schema.REFORECAST_YEARS[0] == 1998 and schema.REFORECAST_YEARS[-1] == 2017


def test_calendar_is_mondays_and_thursdays_of_2018():
    md = schema.ens10_month_days()
    assert len(md) == 105
    assert md[:4] == [(1, 1), (1, 4), (1, 8), (1, 11)] and md[-3:] == [(12, 24), (12, 27), (12, 31)]
    assert all(pd.Timestamp(2018, m, d).day_of_week in (0, 3) for m, d in md)
    assert len(schema.month_days_subset(8)) == 8 and schema.month_days_subset(200) == md
    times = schema.init_times([1998, 1999], md)
    assert len(times) == 210 and times.is_monotonic_increasing
    assert schema.file_date_label(1, 4) == "20180104"


def test_grid():
    g = schema.Grid(0.5)
    assert g.shape == (361, 720)
    assert g.latitudes()[0] == -90 and g.latitudes()[-1] == 90  # canonical: ascending
    assert g.longitudes()[-1] == 359.5
    assert schema.Grid.from_coords(np.linspace(90, -90, 361), np.arange(720) * 0.5) == g
    with pytest.raises(ValueError, match="does not divide"):
        schema.Grid(0.7)
    with pytest.raises(ValueError, match="not a global"):
        schema.Grid.from_coords(np.linspace(-80, 80, 33), np.arange(72) * 5.0)


def test_splits():
    s = schema.Splits()
    assert s.as_dict() == {"train": [1998, 2013], "val": [2014, 2015], "test": [2016, 2017]}
    times = pd.DatetimeIndex(["2013-12-31", "2014-01-01", "2017-06-01", "1990-01-01"])
    assert s.mask(times, "train").tolist() == [True, False, False, False]
    assert [s.split_of(t.year) for t in times] == ["train", "val", "test", None]
    custom = schema.Splits.from_dict({"train": [1998, 2011], "val": [2012, 2013]})
    assert custom.val == (2012, 2013) and custom.test == (2016, 2017)
    with pytest.raises(ValueError, match="overlap"):
        schema.Splits(train=(1998, 2014), val=(2014, 2015))
    with pytest.raises(ValueError, match="unknown split"):
        schema.Splits.from_dict({"holdout": [2000, 2001]})
