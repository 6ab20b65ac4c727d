"""The test tiers beyond the markers written on tests: the ``unit`` tier for the edit-test loop.

``pytest -m unit`` runs the tests of the files listed here (in-process tests of functions and small
objects: no server, no training process, no dask cluster) that need none of the session's data
(``SESSION_DATA``: the synthetic inputs, the ingested store and what is trained on it, which cost a
minute to build); together they take under 2 minutes on an idle 2-core machine (measured and quoted in
the README). A test that carries ``slow``, ``distributed``, ``gpu`` or ``browser`` stays out of the unit tier. The
default tier (``pytest``) runs everything but those three markers, the unit tests included.
"""

from __future__ import annotations

from pathlib import Path

import pytest

UNIT_FILES = frozenset(
    {
        "test_battery_files.py",
        "test_config_kinds.py",
        "test_distributions.py",
        "test_download.py",
        "test_download_rerun.py",
        "test_grib.py",
        "test_laws.py",
        "test_models.py",
        "test_regrid.py",
        "test_schema.py",
        "test_serve_archive.py",
        "test_synthetic.py",
        "test_verification.py",
    }
)
OPT_IN = ("slow", "distributed", "gpu", "browser")
SESSION_DATA = frozenset({"synth_zarr", "synth_grib", "synth_netcdf", "store", "derived_store", "t2m_ckpt", "artefact"})


@pytest.hookimpl(tryfirst=True)  # before -m selects: the marker must be on the items by then
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).name not in UNIT_FILES or any(item.get_closest_marker(m) for m in OPT_IN):
            continue
        if not SESSION_DATA.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.unit)
