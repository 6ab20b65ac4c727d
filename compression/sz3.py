"""SZ3 through pysz, in one place: absolute-error-bounded float32 streams and their decode.

Every SZ3 call in postcast goes through :func:`encode` and :func:`decode` (the baseline comparison in
:mod:`postcast.compression.baselines` and the error-bounded residual layer of
:mod:`postcast.compression.artefact`). pysz is the optional dependency ``postcast[compress]``; it is
imported on first use. An SZ3 stream records neither shape nor dtype: the caller keeps the shape, and
the dtype is always float32 here.
"""

from __future__ import annotations

import numpy as np


def encode(data: np.ndarray, abs_bound: float) -> np.ndarray:
    """The SZ3 stream (uint8) of ``data`` as C-contiguous float32, with max |error| <= ``abs_bound``
    (interpolation + Lorenzo predictors, SZ3's default; measure the error after decoding all the same)."""
    from pysz import sz, szConfig, szErrorBoundMode

    conf = szConfig()
    conf.errorBoundMode = szErrorBoundMode.ABS
    conf.absErrorBound = float(abs_bound)
    blob, _ = sz.compress(np.ascontiguousarray(data, dtype=np.float32), conf)
    return np.asarray(blob, dtype=np.uint8)


def decode(blob: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 array of ``shape`` that :func:`encode` stored in ``blob``."""
    from pysz import sz

    back, _ = sz.decompress(np.asarray(blob, dtype=np.uint8), np.float32, tuple(shape))
    return np.asarray(back, dtype=np.float32).reshape(shape)
