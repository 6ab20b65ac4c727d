"""Reads of a store whose memory does not grow with its dates.

zarr decodes the chunks of a selection together (in zarrs, outside Python's allocators, so tracemalloc does not
see them): a read that spans every init date holds every date's chunk at once. The memory is measured as the
reading process's resident high-water mark (VmHWM), reset just before the read, in a process of its own."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import contract, io, schema

N_LAT, N_LON, N_STEPS = 361, 720, 3  # 0.5 deg, three leads: a truth chunk (one date) of 3.1 MB
CHUNK_MB = N_STEPS * N_LAT * N_LON * 4 / 2**20

READ = """
import sys
from postcast.datasets import contract, io, schema

def hwm_mb():
    with open("/proc/self/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("VmHWM:"))) / 1024

store = io.open_zarr(sys.argv[1])
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the high-water mark starts again from the resident memory now
before = hwm_mb()
rows = contract.split_rows(store, "train", target=schema.target("t850"), step_h=48)
print(len(rows), hwm_mb() - before)
"""


def _store(path, dates: int) -> None:
    """A store of ``dates`` training dates whose truth is a chunk per date, NaN at date 5 (no truth there)."""
    truth = np.zeros((dates, N_STEPS, N_LAT, N_LON), np.float32)
    truth[5] = np.nan
    ds = xr.Dataset(
        {contract.truth_name("t850"): ((schema.INIT_TIME, schema.STEP, schema.LAT, schema.LON), truth)},
        coords={
            schema.INIT_TIME: pd.date_range("2000-01-01", periods=dates, freq="7D"),
            schema.STEP: pd.to_timedelta([0, 24, 48], unit="h"),
            schema.LAT: np.linspace(-90, 90, N_LAT),
            schema.LON: np.arange(N_LON) * 0.5,
            contract.SPLIT: (schema.INIT_TIME, np.zeros(dates, np.int8)),
        },
    )
    io.write_zarr(ds, path, chunks={contract.truth_name("t850"): (1, N_STEPS, N_LAT, N_LON)})


def test_the_rows_with_truth_are_found_in_memory_that_does_not_grow_with_the_dates(tmp_path):
    """split_rows reads the truth's first point at every date of a split. It read them in one selection, so at
    96 dates of 0.5 deg it held 96 chunks (about 300 MB); in the scale benchmark evaluate's driver grew 0.96 ->
    1.05 GB from 16 to 64 store dates, +215 MB for three splits at 64 dates. Now ROWS_PER_READ dates at a time."""
    dates = 96
    _store(tmp_path / "store.zarr", dates)
    out = subprocess.run(
        [sys.executable, "-c", READ, str(tmp_path / "store.zarr")], capture_output=True, text=True, check=True
    )
    rows, grew_mb = out.stdout.split()
    assert int(rows) == dates - 1  # the date without truth is left out
    assert float(grew_mb) < dates / 3 * CHUNK_MB, (grew_mb, CHUNK_MB)
