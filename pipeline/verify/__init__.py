"""The verification stage, ``postcast evaluate``: the raw ensemble, trained post-processors and the oracle scored
side by side, and the report (docs/verification.md).

``evaluate`` holds the options and the run (:class:`~postcast.pipeline.verify.evaluate.EvalConfig`, checkpoints +
store -> ``results.nc``, ``metrics.json``, the report); by concern beside it: ``forecasts`` (what is scored: the
truth, the raw members, each entry's forecast and a checkpoint's predictions over the store), ``tasks`` (the work
on chunks of init dates, here or on dask workers), ``chunk`` (one forecast on one lead as scoring sees it),
``metrics`` (the metrics and regions scored, as objects: :data:`~postcast.pipeline.verify.metrics.METRICS`;
decomposition, reliability, PIT), ``scores`` (the score formulas on numpy arrays: CRPS estimators, EFI, Brier),
``accumulate`` (one lead's results summed over chunks of dates), ``outcomes`` (the outcomes' sample that the
decomposition needs, spilled to disk), ``significance`` (paired tests over init dates), ``summary`` (the JSON
summary, ``metrics.json``) and ``report`` (the Markdown/HTML report).
"""
