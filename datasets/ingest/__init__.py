"""``postcast ingest``: raw ensembles and truth -> the training store (docs/ingest.md).

``run`` holds the options and the stages; by concern beside it: ``tasks`` (the per-date work the
workers run), ``merge`` (training partials merged on the workers), ``budget`` (memory sizes and the
one-pass statistics decision), ``progress`` (the meter), ``layout`` (the store's template and chunks),
and ``lock`` (one ingest per store). The dask client and worker set-up are ``postcast.datasets.core.cluster``,
shared with evaluate and forecast.
"""
