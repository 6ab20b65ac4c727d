"""Regridding (datasets/sources/regrid.py): analytic fields with stated error bounds, every source-grid form."""

import numpy as np
import pytest

from postcast.datasets import schema
from postcast.datasets.sources import regrid


def harmonic(lat, lon):
    """A low-order spherical-harmonic field: Y_1^0 + Y_2^2 (unnormalised), in [-1.5, 1.5]."""
    la, lo = np.radians(lat), np.radians(lon)
    return np.sin(la) + np.cos(la) ** 2 * np.cos(2 * lo)


def octahedral(n):
    """O<n> reduced Gaussian grid as cfgrib returns it: per-point latitude/longitude in row order
    (north to south), row i from the pole with 20 + 4i points."""
    x, _ = np.polynomial.legendre.leggauss(2 * n)
    rows = np.degrees(np.arcsin(x))[::-1]  # Gaussian latitudes, north -> south
    counts = [20 + 4 * i for i in range(n)]
    counts = counts + counts[::-1]
    lat = np.concatenate([np.full(c, r) for r, c in zip(rows, counts, strict=True)])
    lon = np.concatenate([np.arange(c) * 360.0 / c for c in counts])
    return lat, lon


def target_truth(grid):
    lon, lat = np.meshgrid(grid.longitudes(), grid.latitudes())
    return harmonic(lat, lon)


def test_regular_to_regular_bilinear_meets_the_stated_error():
    """2.5 deg -> 5 deg, bilinear: error of linear interpolation <= h^2/8 max|f''| ~ 1e-3 for m = 2."""
    src_lat, src_lon = np.linspace(-90, 90, 73), np.arange(144) * 2.5
    lo, la = np.meshgrid(src_lon, src_lat)
    out = regrid.to_grid(harmonic(la, lo), regrid.SourceGrid.regular(src_lat, src_lon), schema.Grid(5.0))
    err = np.abs(out - target_truth(schema.Grid(5.0)))
    assert err.max() < 2e-3, err.max()


@pytest.mark.parametrize("form", ["descending_-180", "dateline_start"])
def test_latitude_order_and_longitude_convention_do_not_matter(form):
    """North-to-south latitudes with -180..180 longitudes, and longitudes starting at the date line
    (170, 172.5, ..., 360+167.5 as -192.5 wraps): the same result as the canonical 0..360 ascending grid."""
    lat = np.linspace(90, -90, 73)
    lon = (
        np.arange(-180, 180, 2.5) if form == "descending_-180" else np.mod(170 + np.arange(144) * 2.5 + 180, 360) - 180
    )
    lo, la = np.meshgrid(lon, lat)
    out = regrid.to_grid(harmonic(la, lo), regrid.SourceGrid.regular(lat, lon), schema.Grid(5.0))
    ref_lat, ref_lon = np.linspace(-90, 90, 73), np.arange(144) * 2.5
    rlo, rla = np.meshgrid(ref_lon, ref_lat)
    ref = regrid.to_grid(harmonic(rla, rlo), regrid.SourceGrid.regular(ref_lat, ref_lon), schema.Grid(5.0))
    np.testing.assert_allclose(out, ref, atol=1e-6)


def test_regional_grid_across_the_date_line_fills_only_its_region():
    """A 1 deg regional grid 160E..160W (crossing 180), 10..50N: inside, bilinear error < 2e-3; outside, NaN."""
    lat, lon = np.arange(10, 50.5, 1.0), np.mod(np.arange(160, 201, 1.0) + 180, 360) - 180
    lo, la = np.meshgrid(lon, lat)
    grid = schema.Grid(5.0)
    out = regrid.to_grid(harmonic(la, lo), regrid.SourceGrid.regular(lat, lon), grid)
    tl, tn = grid.latitudes(), grid.longitudes()
    inside = ((tl >= 10) & (tl <= 50))[:, None] & ((tn >= 160) & (tn <= 200))[None]
    assert np.isfinite(out[inside]).all() and np.isnan(out[~inside]).all()
    assert np.abs(out - target_truth(grid))[inside].max() < 2e-3


def test_octahedral_reduced_gaussian_bilinear_meets_the_stated_error():
    """O32 (about 2.8 deg) -> 5 deg, bilinear along rows then between rows: error < 5e-3; poleward of
    the outermost Gaussian row (87.9 deg) the field is within its variation over 2.1 deg (< 4e-3)."""
    lat, lon = octahedral(32)
    src = regrid.SourceGrid.points(lat, lon)
    assert "reduced_gg 64 rows" in src.name and lat.size == 2 * sum(20 + 4 * i for i in range(32))
    out = regrid.to_grid(harmonic(lat, lon)[None], src, schema.Grid(5.0))[0]
    err = np.abs(out - target_truth(schema.Grid(5.0)))
    assert err[1:-1].max() < 5e-3 and err.max() < 5e-3, err.max()


def test_nearest_on_points_with_pyresample_meets_half_a_cell():
    """Nearest neighbour (pyresample KD-tree) from O32: error <= max|grad f| x half the point spacing."""
    lat, lon = octahedral(32)
    out = regrid.to_grid(
        np.stack([harmonic(lat, lon), -harmonic(lat, lon)]),
        regrid.SourceGrid.points(lat, lon),
        schema.Grid(5.0),
        "nearest",
    )
    err = np.abs(out[0] - target_truth(schema.Grid(5.0)))
    assert err.max() < 2.0 * np.radians(360 / 20 / 2 + 2.8), err.max()  # |grad f| <= 2 per radian
    np.testing.assert_array_equal(out[1], -out[0])


def test_conservative_preserves_the_area_mean_and_constants():
    """1 deg -> 2 deg cell means: a constant stays exact; the cos-lat weighted mean is kept to 1e-3."""
    lat, lon = np.linspace(-90, 90, 181), np.arange(360) * 1.0
    lo, la = np.meshgrid(lon, lat)
    src = regrid.SourceGrid.regular(lat, lon)
    np.testing.assert_allclose(
        regrid.to_grid(np.full(la.shape, 3.5), src, schema.Grid(2.0), "conservative"), 3.5, rtol=1e-6
    )
    out = regrid.to_grid(harmonic(la, lo) + 2.0, src, schema.Grid(2.0), "conservative")
    g = schema.Grid(2.0)
    w_src, w_out = np.cos(np.radians(lat))[:, None], np.cos(np.radians(g.latitudes()))[:, None]
    mean_src = float((w_src * (harmonic(la, lo) + 2)).sum() / (w_src.sum() * lon.size))
    mean_out = float((w_out * out).sum() / (w_out.sum() * g.n_lon))
    assert abs(mean_out - mean_src) < 1e-3
    with pytest.raises(ValueError, match="bilinear"):
        regrid.to_grid(
            np.zeros((19, 36)),
            regrid.SourceGrid.regular(np.linspace(-90, 90, 19), np.arange(36) * 10.0),
            schema.Grid(5.0),
            "conservative",
        )


def test_same_grid_is_returned_untouched_and_bad_method_names_the_fix():
    g = schema.Grid(10.0)
    x = np.random.default_rng(0).standard_normal(g.shape)
    np.testing.assert_array_equal(
        regrid.to_grid(x, regrid.SourceGrid.regular(g.latitudes(), g.longitudes()), g), x.astype(np.float32)
    )
    with pytest.raises(ValueError, match="use one of bilinear, nearest, conservative"):
        regrid.to_grid(x, regrid.SourceGrid.regular(g.latitudes(), g.longitudes()), g, "cubic")


def _cell_average(grid, f, n=40):
    """The area average of ``f`` over each target cell (cell = grid point +- res/2, cut at the poles),
    by a dense midpoint rule in (sin lat, lon): an independent reference for conservative remapping."""
    r = grid.resolution
    out = np.empty(grid.shape)
    u = (np.arange(n) + 0.5) / n
    for i, la in enumerate(grid.latitudes()):
        s0, s1 = np.sin(np.radians(max(la - r / 2, -90))), np.sin(np.radians(min(la + r / 2, 90)))
        lat_q = np.degrees(np.arcsin(s0 + (s1 - s0) * u))  # equal-area rows
        for j, lo in enumerate(grid.longitudes()):
            lon_q = lo - r / 2 + r * u
            out[i, j] = f(*np.meshgrid(lat_q, lon_q, indexing="ij")).mean()
    return out


def test_conservative_from_a_reduced_gaussian_grid():
    """O32 -> 10 deg conservative: constants exact; cell means of the analytic field within 0.03 (the
    spread of point positions inside a cell); the global area mean kept to 2e-3."""
    lat, lon = octahedral(32)
    src, g = regrid.SourceGrid.points(lat, lon), schema.Grid(10.0)
    np.testing.assert_allclose(regrid.to_grid(np.full(lat.size, 3.5), src, g, "conservative"), 3.5, rtol=1e-6)
    out = regrid.to_grid(harmonic(lat, lon) + 2.0, src, g, "conservative")
    ref = _cell_average(g, lambda la, lo: harmonic(la, lo) + 2.0)
    assert np.abs(out - ref).max() < 0.03, np.abs(out - ref).max()
    w = np.sin(np.radians(np.minimum(g.latitudes() + 5, 90))) - np.sin(np.radians(np.maximum(g.latitudes() - 5, -90)))
    mean_out = float((w[:, None] * out).sum() / (w.sum() * g.n_lon))
    assert abs(mean_out - 2.0) < 2e-3, mean_out  # the harmonic's area mean is 0
    with pytest.raises(ValueError, match="coarser"):
        regrid.to_grid(harmonic(lat, lon), src, schema.Grid(2.0), "conservative")
