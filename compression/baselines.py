"""Classical error-bounded compressors on the same arrays: SZ3 (pysz, through
:mod:`postcast.compression.sz3`), ZFP (zfpy) and EBCC (JPEG2000 base + error-bounded residual, the
``numcodecs-wasm-ebcc`` package, when it is installed).

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


EBCC_MIN_SIDE = 32  # smaller latitude/longitude sides make the codec fail (measured with 0.3.0)


def ebcc_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("numcodecs_wasm_ebcc") is not None


def ebcc(data: np.ndarray, abs_bound: float, base_cr: float = 100.0) -> Result:
    """EBCC with an absolute max-error bound (JPEG2000 base at ``base_cr``, residual coded to the
    bound); arrays of more than 3 dims are coded as 3-D slices (..., H, W) by the codec itself. The
    stream records its shape (numcodecs), so nothing is added to the size."""
    from numcodecs_wasm_ebcc import Ebcc

    x = np.ascontiguousarray(data, dtype=np.float32)
    if min(x.shape[-2:]) < EBCC_MIN_SIDE:
        msg = f"ebcc: fields of {x.shape[-2:]} points; EBCC (JPEG2000 tiles) needs >= {EBCC_MIN_SIDE} per side"
        raise ValueError(msg)
    codec = Ebcc(residual="absolute", error=float(abs_bound), base_cr=base_cr)
    t0 = time.perf_counter()
    blob = np.asarray(codec.encode(x))  # the codec's byte stream (uint8)
    t1 = time.perf_counter()
    back = np.asarray(codec.decode(blob), dtype=np.float32).reshape(x.shape)
    t2 = time.perf_counter()
    return Result("ebcc", f"abs={abs_bound:g}", int(blob.nbytes), back, t1 - t0, t2 - t1)
