"""Issue 58 (ingest speed): ``plausibility.infinite`` passes an all-finite field after one sum instead of a
mask of every value, and still finds every infinity (next to NaNs, of both signs, with sums that overflow)."""

import numpy as np
import pytest
import xarray as xr

from postcast.datasets import plausibility


def _ds(values: np.ndarray) -> xr.Dataset:
    return xr.Dataset({"f": (("step", "latitude", "longitude"), values)}, coords={"step": [0, 1]})


@pytest.mark.parametrize(
    ("place", "expect"),
    [
        ({}, None),
        ({(1, 2, 3): np.inf}, "1 infinite values in 'f' (the first +inf"),
        ({(0, 0, 0): -np.inf, (1, 1, 1): np.inf}, "2 infinite values in 'f' (the first -inf"),
        ({(0, 0, 0): np.nan, (1, 0, 1): np.inf}, "1 infinite values"),
        ({(0, 0, 0): np.nan}, None),
    ],
)
def test_infinite_finds_every_infinity(place, expect):
    values = np.ones((2, 4, 5), dtype=np.float32)
    for at, v in place.items():
        values[at] = v
    found = plausibility.infinite(_ds(values))
    if expect is None:
        assert found is None
    else:
        assert found is not None and found[0] == "f" and found[1].startswith(expect), found


def test_infinite_when_the_sum_overflows():
    values = np.full((2, 4, 5), 3e38, dtype=np.float32)  # finite values whose sum is not
    assert plausibility.infinite(_ds(values)) is None
    values[1, 3, 4] = np.inf
    found = plausibility.infinite(_ds(values))
    assert found is not None and "1 infinite values" in found[1]
