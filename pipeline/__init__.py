"""The stages that use trained models, and the pipeline that runs them in order: training through
the Lightning CLI, evaluation against the raw ensemble, batch forecasts.

Modules: ``train`` (``postcast train``, the Lightning CLI), ``metrics`` (CRPS estimators, EFI,
EECRPS on numpy), ``evaluate`` and ``report`` (scores and the HTML/Markdown report), ``forecast``
(checkpoint + raw ensemble -> CF forecast files), ``apply`` (a model applied to an xarray ensemble in memory,
no file written: docs/api.md), ``run`` (the staged, resumable ``postcast run``).
"""
