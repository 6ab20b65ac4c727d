"""Classical error-bounded compressors on the same arrays: SZ3 (pysz, through
:mod:`postcast.compression.sz3`) and ZFP (zfpy).

Each returns the compressed size in bytes (including what the format needs to decode: pysz does not
store shape and dtype, so 16 bytes of our own metadata are counted), the decoded array and the encode
and decode seconds."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from postcast.compression import sz3 as sz3_stream


@dataclass
class Result:
    codec: str
    setting: str
    nbytes: int
    decoded: np.ndarray
    encode_s: float
    decode_s: float


def sz3(data: np.ndarray, abs_bound: float) -> Result:
    """SZ3 (interpolation + Lorenzo predictors) with an absolute error bound."""
    x = np.ascontiguousarray(data, dtype=np.float32)
    t0 = time.perf_counter()
    blob = sz3_stream.encode(x, abs_bound)
    t1 = time.perf_counter()
    back = sz3_stream.decode(blob, x.shape)
    t2 = time.perf_counter()
    return Result("sz3", f"abs={abs_bound:g}", int(blob.nbytes) + 16, back, t1 - t0, t2 - t1)


def zfp(data: np.ndarray, *, tolerance: float | None = None, rate: float | None = None) -> Result:
    """ZFP fixed-accuracy (``tolerance``) or fixed-rate (``rate`` bits per value) mode; exactly one."""
    import zfpy

    if (tolerance is None) == (rate is None):
        msg = "zfp: give exactly one of tolerance= or rate="
        raise ValueError(msg)
    x = np.ascontiguousarray(data, dtype=np.float32)
    kw = {"tolerance": tolerance} if tolerance is not None else {"rate": rate}
    t0 = time.perf_counter()
    blob = zfpy.compress_numpy(x, **kw)
    t1 = time.perf_counter()
    back = zfpy.decompress_numpy(blob)
    t2 = time.perf_counter()
    setting = f"tol={tolerance:g}" if tolerance is not None else f"rate={rate:g}"
    return Result("zfp", setting, len(blob), back, t1 - t0, t2 - t1)
