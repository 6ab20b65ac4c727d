"""``postcast download``: the real ENS-10 files and the ERA5 truth of its baselines
(:mod:`postcast.datasets.download`)."""

from __future__ import annotations

import argparse

from postcast.common import Subparsers, int_tuple, str_tuple
from postcast.datasets.core.errors import ConfigError


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "download",
        help="fetch the real ENS-10 files (and the ERA5 truth of its baselines)",
        description="Download ENS-10 GRIB files by date range and group (pl/sfc), several at once, resuming "
        "interrupted transfers with HTTP range requests; sizes (and MD5 ETags) are checked and only "
        "complete files get their final names, so reruns skip them.",
        epilog="examples:\n  postcast download ens10 --start 2018-01-01 --end 2018-01-08 --dry-run\n"
        "  postcast download ens10 --start 2018-01-01 --end 2018-12-31 --group pl --out /data/ens10\n"
        "  postcast download ens10 --start 2018-01-01 --end 2018-01-08 --era5-years 2016,2017 --out d",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dataset", choices=["ens10"], help="what to download")
    p.add_argument("--start", required=True, help="first init date (its month-day selects the ENS-10 file)")
    p.add_argument("--end", help="last init date, inclusive (default: --start)")
    p.add_argument("--group", type=str_tuple, default=("pl", "sfc"), help="pl and/or sfc (default both)")
    p.add_argument("--era5-years", type=int_tuple, default=(), help="also the ERA5 analyses of these years")
    p.add_argument("--out", default="data/ens10", help="directory for the files (default data/ens10)")
    p.add_argument("--jobs", type=int, default=4, help="transfers at once (default 4)")
    p.add_argument("--base-url", help="ENS-10 address (default: ECMWF's object store)")
    p.add_argument("--era5-url", help="ERA5 address (default: the SPCL mirror)")
    p.add_argument("--dry-run", action="store_true", help="list files, addresses and (where a server answers) sizes")


def run(a: argparse.Namespace) -> int:
    from postcast.datasets import download

    if not 1 <= a.jobs <= 64:
        msg = f"--jobs {a.jobs}: use 1..64"
        raise ConfigError(msg)
    files = download.ens10_files(a.start, a.end or a.start, tuple(a.group), a.base_url or download.ENS10_URL)
    if a.era5_years:
        files += download.era5_files(tuple(a.era5_years), tuple(a.group), a.era5_url or download.ERA5_URL)
    if a.dry_run:
        for f in download.with_sizes(files, a.jobs, timeout=3.0):
            size = f"{f.size} B" if f.size is not None else "size unknown"
            print(f"{f.name}\t{f.url}\t{size}")
        print(f"{len(files)} files")
        return 0
    res = download.download(files, a.out, jobs=a.jobs, progress=a.progress)
    print(f"{a.out}: fetched {len(res['fetched'])}, kept {len(res['skipped'])} complete files")
    return 0
