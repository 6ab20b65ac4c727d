"""What an ingest will write, planned from its source before any date is read: the GRIB files indexed on the
workers, the variables, levels, members and steps the store will hold (or the completeness report of what is
missing), and a warning when the store will have no 48 h lead."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from postcast.datasets import contract, io, schema, sources
from postcast.datasets.core.errors import MissingInputError
from postcast.datasets.sources import messages as grib

log = logging.getLogger("postcast.datasets.ingest.run")  # the ingest's own log (tests and users read it there)


def plan(
    source: str, out: str, expectation: sources.Expectation, found: sources.Discovered, client: Any
) -> sources.Plan:
    """What the store ``out`` will hold of ``source`` (GRIB files indexed on the workers first); a source
    without something ``expectation`` asks for leaves a completeness report next to ``out``."""
    if isinstance(found.forecast, sources.GribSource):
        log.info("indexing %d GRIB files", len(found.forecast.files))
        found.forecast.set_index(client.gather(client.map(grib.index_file, found.forecast.files)))
    try:
        planned = found.forecast.plan(expectation)
    except MissingInputError as err:
        report = contract.missing_report_path(Path(out))
        io.write_json(report, {"source": source, "missing": err.missing})
        log.error("completeness report written to %s", report)
        raise
    _warn_lead(planned.steps_h, source)
    return planned


def _warn_lead(steps_h: tuple[int, ...], source: str) -> None:
    """Say it when the store will have no 48 h lead (ENS-10's target lead): its models are trained and scored
    at its longest step instead, which for a source of step 0 only is the analysis time, not a forecast."""
    if schema.TARGET_STEP_H in steps_h:
        return
    lead = schema.target_step_h(steps_h)
    log.warning(
        "%s holds steps %s h, no %d h lead: the store's target lead is %d h%s; give a source with step %d h "
        "for a %d h forecast",
        source,
        ",".join(map(str, steps_h)),
        schema.TARGET_STEP_H,
        lead,
        " (the initial time: no forecast to post-process)" if lead == 0 else "",
        schema.TARGET_STEP_H,
        schema.TARGET_STEP_H,
    )
