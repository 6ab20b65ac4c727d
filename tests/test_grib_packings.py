"""GRIB files as other centres write them (issue 38 item 7), written here with eccodes: every packing
eccodes decodes (JPEG 2000 has no single-precision decoder: "Function not yet implemented"), every
scanning mode (alternate rows included), a regular Gaussian grid with a wrong increment, NCEP's prmsl,
projected regional grids (Lambert conformal, polar stereographic, rotated lat-lon: stored by nearest
point on the largest regular grid inside their domain), and spherical harmonics, refused in one line
naming the grid type. What is ingested is compared with eccodes' own
double-precision decode placed by eccodes' own per-point latitudes and longitudes (its geoiterator),
and nothing of eccodes' reaches stderr."""

from __future__ import annotations

from pathlib import Path

import eccodes
import numpy as np
import pytest

from postcast.datasets import contract

NI, NJ, RES = 72, 37, 5.0  # a global 5 deg grid: the store keeps it as it is (no regridding)


def _message(path: Path, keys: dict[str, object], sample: str = "GRIB2", values: np.ndarray | None = None) -> Path:
    """One 2 m temperature message on the 5 deg grid with ``keys`` set (in order, before the values)."""
    h = eccodes.codes_grib_new_from_samples(sample)
    try:
        for k, v in {"paramId": 167, "dataDate": 20200102, "Ni": NI, "Nj": NJ, **keys}.items():
            eccodes.codes_set(h, k, v)
        if values is None:
            n = NI * NJ
            values = 280.0 + 15.0 * np.sin(np.arange(n) / 37.0) + np.random.default_rng(3).normal(0, 0.5, n)
        eccodes.codes_set_values(h, values)
        with open(path, "ab") as f:
            eccodes.codes_write(h, f)
    finally:
        eccodes.codes_release(h)
    return path


def _regular(scan: dict[str, int]) -> dict[str, object]:
    """The regular 5 deg grid's keys for the scanning flags ``scan`` (first and last points follow them)."""
    north, east = 90.0, 360.0 - RES
    i_neg, j_pos = scan.get("iScansNegatively", 0), scan.get("jScansPositively", 0)
    return {
        **scan,
        "latitudeOfFirstGridPointInDegrees": -north if j_pos else north,
        "latitudeOfLastGridPointInDegrees": north if j_pos else -north,
        "longitudeOfFirstGridPointInDegrees": east if i_neg else 0.0,
        "longitudeOfLastGridPointInDegrees": 0.0 if i_neg else east,
        "iDirectionIncrementInDegrees": RES,
        "jDirectionIncrementInDegrees": RES,
    }


def _decoded(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """eccodes' double-precision values of the first message and its geoiterator's latitudes and longitudes."""
    with open(path, "rb") as f:
        h = eccodes.codes_grib_new_from_file(f)
    try:
        values = eccodes.codes_get_values(h)
        return values, eccodes.codes_get_array(h, "latitudes"), eccodes.codes_get_array(h, "longitudes")
    finally:
        eccodes.codes_release(h)


def _eccodes_field(path: Path) -> np.ndarray:
    """eccodes' double-precision values of the first message, placed by its geoiterator's latitudes and
    longitudes on the grid (latitude ascending, longitude 0..355), as float32 like the store."""
    values, lat, lon = _decoded(path)
    out = np.full((NJ, NI), np.nan)
    out[np.rint((lat + 90.0) / RES).astype(int), np.rint(np.mod(lon, 360.0) / RES).astype(int) % NI] = values
    return out.astype(np.float32)


def _ingest(cli, capfd, src: Path, out: Path, *extra: str):
    proc = cli("ingest", str(src), "--out", str(out), "--threads", *extra)
    fd_err = capfd.readouterr().err  # what C libraries wrote to file descriptor 2
    assert "ECCODES" not in fd_err + proc.stderr, fd_err[-2000:] + proc.stderr[-2000:]
    return proc


def _stored(out: Path, name: str) -> np.ndarray:
    return contract.open_store(out)[name].values[0, 0, 0]  # (init, member, step, lat, lon) -> (lat, lon)


PACKINGS = ["grid_jpeg", "grid_ccsds", "grid_complex", "grid_complex_spatial_differencing", "grid_ieee", "grid_simple"]


@pytest.mark.parametrize("packing", PACKINGS)
def test_every_packing_is_ingested_as_eccodes_decodes_it(cli, capfd, tmp_path, packing):
    """grid_jpeg (and grid_ieee) gave exit 65 "cannot decode GRIB message at byte ...: Function not yet
    implemented": eccodes has no single-precision decoder for them; the double-precision one is used."""
    src = _message(tmp_path / "f.grib2", {**_regular({}), "packingType": packing})
    proc = _ingest(cli, capfd, src, tmp_path / "s.zarr", "--variables", "2t")
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_array_equal(_stored(tmp_path / "s.zarr", "t2m"), _eccodes_field(src))


SCANS = [
    {},
    {"iScansNegatively": 1},
    {"jScansPositively": 1},
    {"alternativeRowScanning": 1},
    {"iScansNegatively": 1, "jScansPositively": 1, "alternativeRowScanning": 1},
    {"jPointsAreConsecutive": 1},
    {"jPointsAreConsecutive": 1, "alternativeRowScanning": 1, "iScansNegatively": 1},
    {"alternativeRowScanning": 1, "packingType": "grid_jpeg"},
]


@pytest.mark.parametrize("scan", SCANS, ids=lambda s: "+".join(s) or "default")
def test_every_scanning_mode_is_ingested_as_eccodes_places_it(cli, capfd, tmp_path, scan):
    """Alternate rows (every other row reversed) included: the issue's file was read with "461 NaN values in
    't2m'"; the ingested field is eccodes' field, point for point (no NaN)."""
    src = _message(tmp_path / "f.grib2", _regular(scan))
    proc = _ingest(cli, capfd, src, tmp_path / "s.zarr", "--variables", "2t")
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = _eccodes_field(src)
    assert not np.isnan(want).any()
    np.testing.assert_array_equal(_stored(tmp_path / "s.zarr", "t2m"), want)


PROJECTED = {
    "lambert": {
        **{"gridType": "lambert", "Nx": 40, "Ny": 30, "DxInMetres": 50000, "DyInMetres": 50000},
        **{"latitudeOfFirstGridPointInDegrees": 40.0, "longitudeOfFirstGridPointInDegrees": 350.0},
        **{"LaDInDegrees": 50.0, "LoVInDegrees": 10.0, "Latin1InDegrees": 50.0, "Latin2InDegrees": 50.0},
    },
    "polar_stereographic": {
        **{"gridType": "polar_stereographic", "Nx": 40, "Ny": 30, "DxInMetres": 50000, "DyInMetres": 50000},
        **{"latitudeOfFirstGridPointInDegrees": 40.0, "longitudeOfFirstGridPointInDegrees": 350.0},
        **{"LaDInDegrees": 60.0, "orientationOfTheGridInDegrees": 10.0},
    },
    "rotated_ll": {
        **{"gridType": "rotated_ll", "Ni": 40, "Nj": 30, "iDirectionIncrementInDegrees": 1.0},
        **{"latitudeOfFirstGridPointInDegrees": 10.0, "latitudeOfLastGridPointInDegrees": -19.0},
        **{"longitudeOfFirstGridPointInDegrees": 340.0, "longitudeOfLastGridPointInDegrees": 19.0},
        **{"jDirectionIncrementInDegrees": 1.0, "alternativeRowScanning": 1},
        **{"latitudeOfSouthernPoleInDegrees": -40.0, "longitudeOfSouthernPoleInDegrees": 10.0},
    },
}


def _great_circle(lat1, lon1, lat2, lon2) -> np.ndarray:
    """Angles (radians) between every point 1 (rows) and every point 2 (columns): the haversine formula."""
    p1, p2 = np.radians(lat1)[:, None], np.radians(lat2)[None, :]
    dlon = np.radians(lon2)[None, :] - np.radians(lon1)[:, None]
    h = np.sin((p2 - p1) / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dlon / 2) ** 2
    return 2 * np.arcsin(np.sqrt(np.clip(h, 0, 1)))


@pytest.mark.parametrize("grid", list(PROJECTED))
def test_projected_grids_are_ingested_as_their_nearest_points(cli, capfd, tmp_path, grid):
    """Lambert conformal, polar stereographic and rotated lat/lon (alternate rows) were refused ("gridType
    lambert is not read by postcast"): they are stored on the largest regular grid inside their domain,
    each value eccodes' double-precision value at the source point nearest to it (brute-force great
    circles here, on eccodes' own per-point latitudes and longitudes), no NaN, no point outside."""
    src = tmp_path / "f.grib2"
    n = 1200
    _message(src, PROJECTED[grid], values=280.0 + 0.01 * np.arange(n))
    want, lat, lon = _decoded(src)
    proc = _ingest(cli, capfd, src, tmp_path / "s.zarr", "--variables", "2t")
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = contract.open_store(tmp_path / "s.zarr")
    got = store["t2m"].values[0, 0, 0]  # (lat, lon)
    glat, glon = np.meshgrid(store["latitude"].values, store["longitude"].values, indexing="ij")
    angle = _great_circle(glat.ravel(), glon.ravel(), lat, lon)  # (store points, source points)
    assert got.size >= 100 and not np.isnan(got).any()
    spacing = np.median(np.sort(_great_circle(lat, lon, lat, lon), axis=1)[:, 1])
    assert angle.min(axis=1).max() <= 0.75 * spacing  # every stored point lies inside the domain
    np.testing.assert_array_equal(got.ravel(), want[angle.argmin(axis=1)].astype(np.float32))


def _polar(first: tuple[float, float], n: int = 60, dx: int = 100_000) -> dict[str, object]:
    """An n x n polar stereographic grid (spacing dx metres) from the point ``first`` (lat, lon), centred on the
    North Pole when that latitude is positive, else on the South Pole."""
    south = first[0] < 0
    return {
        **{"gridType": "polar_stereographic", "Nx": n, "Ny": n, "DxInMetres": dx, "DyInMetres": dx},
        **{"latitudeOfFirstGridPointInDegrees": first[0], "longitudeOfFirstGridPointInDegrees": first[1]},
        **{"LaDInDegrees": -60.0 if south else 60.0, "orientationOfTheGridInDegrees": 0.0},
        "projectionCentreFlag": 128 if south else 0,
    }


POLAR = {  # x and y increase towards the pole from the first point: the 60 x 60 grids hold it, 23 cells in
    "north": _polar((60.0, 315.0)),
    "south": _polar((-60.0, 225.0)),
    "beside the pole": _polar((76.0, 225.0), n=61, dx=50_000),  # 52..79 N: its box's edge columns were NaN
}


@pytest.mark.parametrize("case", list(POLAR))
def test_a_polar_grid_holding_the_pole_is_stored_round_the_pole(cli, capfd, tmp_path, case):
    """A polar stereographic domain holding the pole was refused as "2835 NaN values in 't2m'" (no missing value
    in the source): the regular grid inside it runs past 540 deg east, which the nearest-point search did not
    bring back into -180..180; and pyresample's default data reduction dropped the source points just outside the
    grid's latitude/longitude box, so the box's edge columns were NaN inside the domain. Now a domain holding a
    pole is stored as a cap round it (every longitude, 360 columns, up to the pole), each value eccodes' value at
    the nearest source point, no NaN, no point outside the domain."""
    src, keys = tmp_path / "f.grib2", POLAR[case]
    n = int(keys["Nx"]) ** 2  # type: ignore[call-overload]
    _message(src, keys, values=280.0 + 0.01 * np.arange(n))
    want, lat, lon = _decoded(src)
    pole = {"north": 90.0, "south": -90.0}.get(case)
    assert pole is None or np.abs(lat - pole).min() < 1.0  # eccodes: the pole is inside
    proc = _ingest(cli, capfd, src, tmp_path / "s.zarr", "--variables", "2t")
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = contract.open_store(tmp_path / "s.zarr")
    got, slat, slon = store["t2m"].values[0, 0, 0], store["latitude"].values, store["longitude"].values
    if pole is not None:  # all round, up to the pole
        assert slon.size * (slon[1] - slon[0]) == 360.0 and pole in slat
    glat, glon = np.meshgrid(slat, slon, indexing="ij")
    angle = _great_circle(glat.ravel(), glon.ravel(), lat, lon)  # (store points, source points)
    assert got.size >= 100 and not np.isnan(got).any()
    spacing = np.median(np.sort(_great_circle(lat, lon, lat, lon), axis=1)[:, 1])
    assert angle.min(axis=1).max() <= 0.75 * spacing  # every stored point lies inside the domain
    np.testing.assert_array_equal(got.ravel(), want[angle.argmin(axis=1)].astype(np.float32))


def test_a_grid_too_coarse_for_a_small_lambert_domain_gives_one_advice(cli, capfd, tmp_path):
    """A 2 x 2 Lambert domain (50 km) ingested with --grid 1: "... choose a finer --grid; choose another --grid";
    now one line with one advice: a finer --grid."""
    src = _message(tmp_path / "f.grib2", {**PROJECTED["lambert"], "Nx": 2, "Ny": 2}, values=280.0 + np.arange(4.0))
    proc = _ingest(cli, capfd, src, tmp_path / "s.zarr", "--variables", "2t", "--grid", "1")
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("postcast: error:")]
    assert proc.returncode == 65 and len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].count("--grid") == 1 and "choose a finer --grid" in errors[0], errors[0]


def test_spherical_harmonics_are_refused_in_one_line_naming_them(cli, capfd, tmp_path):
    """Was "cannot read the header of GRIB message 0: Key/value not found" (exit 65): the header is read
    whatever the grid, and the grid type is named with what to do."""
    src = tmp_path / "f.grib2"
    h = eccodes.codes_grib_new_from_samples("GRIB2")
    try:
        eccodes.codes_set(h, "paramId", 167)
        eccodes.codes_set(h, "gridType", "sh")
        eccodes.codes_set_values(h, np.full(eccodes.codes_get_size(h, "values"), 280.0))
        with open(src, "wb") as f:
            eccodes.codes_write(h, f)
    finally:
        eccodes.codes_release(h)
    proc = _ingest(cli, capfd, src, tmp_path / "s.zarr", "--variables", "2t")
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("postcast: error:")]
    assert proc.returncode == 65 and len(errors) == 1, proc.stderr[-3000:]
    assert "gridType sh" in errors[0] and "Key/value not found" not in errors[0]
    assert "regrid" in errors[0]  # what to do


def test_regular_gaussian_grid_with_a_wrong_increment(cli, capfd, tmp_path):
    """Was exit 70 with ECCODES ERROR lines on stderr ("Failed to find index for latitude=87.8638"): the rows
    of a global Gaussian grid are its 2N Gaussian latitudes, the columns evenly spaced, whatever increments
    the header states."""
    src = tmp_path / "gg.grib2"
    h = eccodes.codes_grib_new_from_samples("regular_gg_sfc_grib2")
    try:
        eccodes.codes_set(h, "paramId", 167)
        n = eccodes.codes_get_size(h, "values")
        eccodes.codes_set_values(h, 280.0 + np.arange(n) % 11.0)
        eccodes.codes_set(h, "iDirectionIncrementInDegrees", 1.7)  # not 360 / Ni
        eccodes.codes_set(h, "N", 40)  # the j "increment" of a Gaussian grid: its 64 rows are N = 32's
        with open(src, "wb") as f:
            eccodes.codes_write(h, f)
    finally:
        eccodes.codes_release(h)
    proc = _ingest(cli, capfd, src, tmp_path / "s.zarr", "--variables", "2t", "--regrid-method", "nearest")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = _stored(tmp_path / "s.zarr", "t2m")
    assert np.isfinite(got).all() and set(np.unique(got)) <= set(280.0 + np.arange(11.0))


def test_ncep_prmsl_is_mean_sea_level_pressure(cli, capfd, tmp_path):
    """NCEP's prmsl (paramId 260074) is what ECMWF calls msl (151): taken by default as msl."""
    src = _message(tmp_path / "f.grib2", {**_regular({}), "paramId": 260074}, values=np.full(NI * NJ, 101_300.0))
    proc = _ingest(cli, capfd, src, tmp_path / "s.zarr")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert np.allclose(_stored(tmp_path / "s.zarr", "msl"), 101_300.0)
