"""Ingest throughput: ENS-10 GRIB -> store and zarr -> store, next to eccodes' bare decode time.

For each grid (the 5 deg quickstart default and the 0.5 deg ENS-10 grid) the script writes a few
synthetic init dates as ENS-10 GRIB1 files and as zarr (not timed), then times

* ``decode``: eccodes alone, one process, reading every message of the GRIB files and decoding its
  values (``codes_grib_new_from_file`` + ``codes_get_values``): the floor for any GRIB reader;
* ``grib_ingest``: ``postcast ingest`` of the GRIB files (index, checks, ensemble statistics, zarr
  writes, training statistics) on the default 2-worker dask LocalCluster;
* ``zarr_ingest``: the same from the zarr form.

Prints a table, writes JSON (``--out``), and ends with ``RESULT grib_ingest_over_decode=<ratio>``
(at 0.5 deg when it runs, else at the default grid). Goal: <= 2.

    python benchmarks/ingest.py            # both grids (~5 min on 2 cores)
    python benchmarks/ingest.py --quick    # default grid only
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

# isort: off
import pyproj  # noqa: F401  (before eccodes: see datasets/grib.py)
import eccodes
# isort: on

from postcast.datasets import synthfiles
from postcast.datasets.ingest import IngestConfig, ingest
from postcast.datasets.synthetic import SynthConfig


def decode_all(files: list[Path]) -> tuple[float, int, int]:
    """Seconds for eccodes to decode every message; (seconds, messages, decoded float32 bytes)."""
    start, n, nbytes = time.perf_counter(), 0, 0
    for path in files:
        with open(path, "rb") as f:
            while (h := eccodes.codes_grib_new_from_file(f)) is not None:
                values = eccodes.codes_get_values(h)
                nbytes += values.size * 4
                n += 1
                eccodes.codes_release(h)
    return time.perf_counter() - start, n, nbytes


def timed_ingest(src: Path, out: Path, workers: int) -> float:
    start = time.perf_counter()
    res = ingest(IngestConfig(source=str(src), out=str(out), workers=workers, progress=False))
    assert res.n_written == res.n_dates > 0
    return time.perf_counter() - start


def run_case(name: str, cfg: SynthConfig, work: Path, workers: int) -> dict[str, float | int | str]:
    grib_dir, zarr_dir = work / f"{name}_grib", work / f"{name}_zarr"
    synthfiles.write_synthetic(SynthConfig(**{**cfg.to_dict(), "format": "grib", "years": cfg.years,
                                            "levels": cfg.levels}), grib_dir, progress=False)
    synthfiles.write_synthetic(cfg, zarr_dir, progress=False)
    files = sorted(p for p in grib_dir.iterdir() if p.name.startswith("output."))
    t_decode, n_msg, n_bytes = decode_all(files)
    t_grib = timed_ingest(grib_dir, work / f"{name}_from_grib.zarr", workers)
    t_zarr = timed_ingest(zarr_dir, work / f"{name}_from_zarr.zarr", workers)
    n_dates = len(cfg.init_times)
    mb = n_bytes / 2**20
    return {
        "grid": f"{cfg.grid.n_lat}x{cfg.grid.n_lon}", "dates": n_dates, "messages": n_msg,
        "decoded_MB": round(mb, 1), "grib_MB": round(sum(p.stat().st_size for p in files) / 2**20, 1),
        "decode_s": round(t_decode, 2), "grib_ingest_s": round(t_grib, 2), "zarr_ingest_s": round(t_zarr, 2),
        "decode_MB_per_s": round(mb / t_decode, 1), "grib_ingest_MB_per_s": round(mb / t_grib, 1),
        "zarr_ingest_MB_per_s": round(mb / t_zarr, 1), "grib_dates_per_s": round(n_dates / t_grib, 3),
        "zarr_dates_per_s": round(n_dates / t_zarr, 3), "grib_ingest_over_decode": round(t_grib / t_decode, 2),
    }


CASES = {
    # 5 deg, 2 years x 4 month-days = 8 init dates, levels 500/850, all 18 variables; 2013 is a
    # training year, so the timed ingest includes the statistics pass
    "default_5deg": SynthConfig(resolution=5.0, years=(2013, 2014), dates_per_year=4, levels=(500, 850)),
    # 0.5 deg (361 x 720), 2 years x 1 month-day = 2 init dates, levels 500/850: 1500 messages
    "ens10_0.5deg": SynthConfig(resolution=0.5, years=(2013, 2014), dates_per_year=1, levels=(500, 850)),
}


def regrid_cost(fields: int = 20) -> dict[str, float]:
    """Regridding cost per 2-D field (ms) from 0.25 deg (721 x 1440) to 0.5 deg, per method, one core
    (a batch of ``fields`` fields of a smooth random field; the median of 3 runs)."""
    import numpy as np

    from postcast.datasets import regrid, schema

    src = schema.Grid(0.25)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((fields, *src.shape)).cumsum(axis=-1).astype(np.float32)
    grid = regrid.SourceGrid.regular(src.latitudes(), src.longitudes())
    out: dict[str, float] = {}
    for method in ("bilinear", "nearest", "conservative"):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            regrid.to_grid(x, grid, schema.Grid(0.5), method)
            times.append(time.perf_counter() - t0)
        out[f"regrid_{method}_ms_per_field"] = round(1e3 * sorted(times)[1] / fields, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="default grid only")
    ap.add_argument("--workers", type=int, default=2, help="dask LocalCluster workers for ingest")
    ap.add_argument("--out", default="benchmarks/results/ingest.json", help="JSON results path")
    ap.add_argument("--keep", help="keep the data under this directory instead of a temporary one")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="postcast-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = {}
    try:
        for name, cfg in CASES.items():
            if args.quick and name != "default_5deg":
                continue
            rows[name] = run_case(name, cfg, work, args.workers)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    cols = ["grid", "dates", "messages", "decoded_MB", "decode_s", "grib_ingest_s", "zarr_ingest_s",
            "grib_ingest_MB_per_s", "zarr_ingest_MB_per_s", "grib_dates_per_s", "grib_ingest_over_decode"]
    print(f"{'case':<14}" + "".join(f"{c:>22}" for c in cols))
    for name, row in rows.items():
        print(f"{name:<14}" + "".join(f"{row[c]!s:>22}" for c in cols))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cost = regrid_cost()
    print(f"{'regrid 0.25 -> 0.5 deg (ms per field, 1 core)':<48}" + "".join(f"{k}={v} " for k, v in cost.items()))
    out.write_text(json.dumps({"cases": rows, "workers": args.workers, "regrid": cost}, indent=2) + "\n")
    headline = rows.get("ens10_0.5deg", rows["default_5deg"])
    print(f"RESULT grib_ingest_over_decode={headline['grib_ingest_over_decode']} "
          f"regrid_ms_per_field={cost['regrid_bilinear_ms_per_field']}")


if __name__ == "__main__":
    main()
