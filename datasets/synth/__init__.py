"""Synthetic ENS-10 with a known oracle: ``synthetic`` (the world, forecasts, truth) and ``synthfiles``
(the same written as zarr, GRIB or netCDF files for ``postcast synth``)."""
