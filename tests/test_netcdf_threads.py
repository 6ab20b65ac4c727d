"""netCDF4's bundled HDF5 is not thread-safe, and xarray locks only its own array reads, not the
metadata read while a file is opened: two threads opening netCDF files at once crash the process
(SIGSEGV or SIGBUS inside libhdf5). The service reads products from its thread pool and its event loop
at once, and a segfault in a test took a pytest-xdist worker down with it. Every netCDF read and write
goes through ``postcast.datasets.io``'s lock; the stress runs in a subprocess so that a crash is a
failed assertion here, not a lost worker."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

STRESS = textwrap.dedent(
    """
    import sys, threading
    from pathlib import Path
    from postcast.pipeline.products import archive
    from postcast.serve.testing import write_forecasts

    root = Path(sys.argv[1])
    paths = write_forecasts(root, n=4)
    products, _ = archive.scan(root)
    assert len(products) == 4, products

    def reader(k: int) -> None:
        for n in range(40):
            p = products[(k + n) % 4]
            archive.read_field(p)
            archive.product_identity(p.path)

    def writer() -> None:  # forecast writing a product while the service reads the others
        for n in range(20):
            write_forecasts(root / "more", n=1, seed=n)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)] + [threading.Thread(target=writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("done")
    """
)


def test_threads_reading_and_writing_netcdf_products_at_once_do_not_crash(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-c", STRESS, str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "done" in run.stdout, (run.returncode, run.stderr[-2000:])
