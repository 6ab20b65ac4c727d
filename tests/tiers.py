"""The test tiers beyond the markers written on tests: the ``unit`` tier for the edit-test loop and the
``system`` tier of whole-process runs.

``pytest -m unit`` runs the tests of the files listed here (in-process tests of functions and small
objects: no server, no training process, no dask cluster) that need none of the session's data
(``SESSION_DATA``: the synthetic inputs, the ingested store and what is trained on it, which cost a
minute to build); together they take under 2 minutes on an idle 2-core machine (measured and quoted in
the README). A test that carries ``slow``, ``distributed``, ``gpu`` or ``browser`` stays out of the unit tier. The
default tier (``pytest``) runs everything but those markers and ``system``, the unit tests included.

``pytest -m system`` runs the tests of ``SYSTEM_FILES`` (and the tests marked ``system`` where they are
written): real processes killed, interrupted, starved of disk or fed the bad-input battery, the pipeline
rerun, the wheel installed into a new environment, the GPU script's dry run, the trainings of minutes
(models trained to convergence to show what they learn, compressors fitted twice, every docs/api.md block), and
the slowest cross-checks of the default tier (GRIB files against cfgrib and eccodes, the Triton kernels under the
interpreter, the download dry runs against a local server, every family through evaluate, a model at every
lead).
They run as their own tier, after the default tier in ``.ci/run``, which keeps the default tier within 10
minutes on an idle 2-core machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

UNIT_FILES = frozenset(
    {
        "test_battery_files.py",
        "test_config_kinds.py",
        "test_distributions.py",
        "test_laws.py",
        "test_models.py",
        "test_regime_world.py",
        "test_regrid.py",
        "test_reliability_data.py",
        "test_schema.py",
        "test_serve_archive.py",
        "test_smoe_paper.py",
        "test_spread_blend.py",
        "test_synthetic.py",
        "test_verification.py",
    }
)
SYSTEM_FILES = frozenset(
    {
        "test_any_lead.py",
        "test_apply.py",
        "test_bad_input.py",
        "test_battery.py",
        "test_battery_ops.py",
        "test_battery_ops56.py",
        "test_battery_ops56_more.py",
        "test_battery_training.py",
        "test_cluster.py",
        "test_docs_api.py",
        "test_download.py",
        "test_download_rerun.py",
        "test_emos_standard.py",
        "test_evaluate_determinism.py",
        "test_evaluate_families.py",
        "test_exit_codes_more.py",
        "test_fused.py",
        "test_gpu_script.py",
        "test_grib.py",
        "test_kernels.py",
        "test_loader_faults.py",
        "test_location_aware.py",
        "test_netcdf_threads.py",
        "test_packaging.py",
        "test_pipeline.py",
        "test_pipeline_record.py",
        "test_report_page.py",
        "test_resume.py",
        "test_serve_hardening.py",
    }
)
OPT_IN = ("slow", "distributed", "gpu", "browser")
SESSION_DATA = frozenset({"synth_zarr", "synth_grib", "synth_netcdf", "store", "derived_store", "t2m_ckpt", "artefact"})


@pytest.hookimpl(tryfirst=True)  # before -m selects: the marker must be on the items by then
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        name = Path(str(item.fspath)).name
        if any(item.get_closest_marker(m) for m in OPT_IN):
            continue
        if name in SYSTEM_FILES:
            item.add_marker(pytest.mark.system)
        elif name in UNIT_FILES and not SESSION_DATA.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.unit)
