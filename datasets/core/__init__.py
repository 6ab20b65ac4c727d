"""The neutral floor every layer stands on: errors with exit codes, typed YAML configs, the version, geometry,
checksums, the dask cluster (ingest, evaluate and forecast run their tasks on it).

Nothing here imports another postcast module outside :mod:`postcast.datasets.core`, so any layer (the data
core, models, pipeline, serve, the CLI) imports from here without climbing.
"""
