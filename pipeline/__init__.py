"""The stages that use trained models, and the pipeline that runs them in order: training through
the Lightning CLI, evaluation against the raw ensemble, batch forecasts.

Modules: ``train`` (``postcast train``, the Lightning CLI) and ``stopping`` (early stopping, the schedule),
``checkpoints`` (a checkpoint opened once per process, for evaluate and forecast), ``forecast`` (checkpoint + raw
ensemble -> CF forecast files), ``apply`` (a model applied to an xarray ensemble in memory, no file written:
docs/api.md), ``run`` (the staged, resumable ``postcast run``; ``pipeline_config`` and ``jobs`` its preset and
jobs). Sub-packages: ``verify`` (``postcast evaluate``: scores, significance, the report) and ``products`` (the
forecast files' contract and the maps, which ``postcast serve`` imports and nothing else of the pipeline).
"""
