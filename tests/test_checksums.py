"""The files' SHA-256 (``datasets/core/checksums.py``): equal to hashlib over the whole bytes, and read through one
reused buffer, so that hashing a store's chunks or the GRIB sources does not fault fresh memory in per block."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np

from postcast.datasets.core import checksums


def test_a_files_sha256_equals_hashlib_over_its_bytes_whole_and_its_first_bytes(tmp_path):
    data = np.random.default_rng(0).bytes((9 << 20) + 123)  # more than two of any block size, and a tail
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    assert checksums.sha256_file(path) == hashlib.sha256(data).hexdigest()
    for limit in (0, 1, 5 << 20, len(data), len(data) + 10):
        assert checksums.sha256_file(path, limit=limit) == hashlib.sha256(data[:limit]).hexdigest(), limit


def test_hashing_a_large_file_reads_into_one_reused_buffer_not_fresh_memory_per_block(tmp_path):
    """An ingest hashes every chunk it writes (a 0.5 deg member chunk is 62 MB) and its GRIB sources (748 MB in the
    benchmark). Read 4 MB at a time into new bytes objects, each block was just above glibc's mmap threshold
    under ingest's allocator setting (4 MB): a fresh mapping whose pages the kernel faulted in and zeroed again,
    a thousand faults per block (130,000 per 0.5 deg date of chunks). Counted by the kernel, not timed."""
    path = tmp_path / "big.bin"
    path.write_bytes(np.random.default_rng(1).bytes(64 << 20))
    code = (
        "import resource, sys\n"
        "from postcast.datasets.core import checksums, cluster\n"
        "cluster.keep_freed_memory()\n"  # what every ingest task sets first
        "checksums.sha256_file(sys.argv[1])\n"  # warm: imports, the buffer
        "n = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "checksums.sha256_file(sys.argv[1])\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - n)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    faults = int(out.stdout)
    assert faults < 1000, f"{faults} page faults hashing 64 MB (16,384 would be every page of it fresh)"
