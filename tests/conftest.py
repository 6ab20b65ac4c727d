"""Shared fixtures: small synthetic ENS-10 datasets written once per session through the real writers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Triton kernels run on the CPU through the interpreter; the variable is read when a kernel is
# decorated, so it is set before anything imports postcast.models.kernels.triton_impl.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from postcast.datasets import synthfiles
from postcast.datasets.ingest import IngestConfig, ingest
from postcast.datasets.synthetic import SynthConfig

# Small but complete: 10 deg grid (19 x 36), 2 levels, 6 years x 3 month-days (Feb, Jul, Oct) = 18 dates,
# covering the train (2012-2013), val (2014-2015) and test (2016-2017) splits.
TINY = SynthConfig(seed=3, resolution=10.0, years=(2012, 2017), dates_per_year=3, levels=(500, 850))


def run_cli(*args: str, check: bool = False, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the real ``postcast`` console entry point in a subprocess."""

    proc = subprocess.run([sys.executable, "-m", "postcast", "--no-progress", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"}, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"postcast {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="session")
def tiny_cfg() -> SynthConfig:
    return TINY


@pytest.fixture(scope="session")
def synth_zarr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "zarr"
    synthfiles.write_synthetic(TINY, out, progress=False)
    return out


@pytest.fixture(scope="session")
def synth_grib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "grib"
    synthfiles.write_synthetic(SynthConfig(**{**TINY.to_dict(), "format": "grib", "years": tuple(TINY.years),
                                            "levels": tuple(TINY.levels)}), out, progress=False)
    return out


@pytest.fixture(scope="session")
def synth_netcdf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TINY as ENS-10 netCDF files (one pair per month-day, each holding six years of dates)."""
    out = tmp_path_factory.mktemp("synth") / "netcdf"
    synthfiles.write_synthetic(SynthConfig(**{**TINY.to_dict(), "format": "netcdf", "years": tuple(TINY.years),
                                            "levels": tuple(TINY.levels)}), out, progress=False)
    return out


@pytest.fixture(scope="session")
def store(synth_zarr: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("store") / "store.zarr"
    ingest(IngestConfig(source=str(synth_zarr), out=str(out), processes=False, progress=False))
    return out


@pytest.fixture(scope="session")
def cli():
    """``cli("ingest", ...)`` runs the real ``postcast`` command in a subprocess."""
    return run_cli
