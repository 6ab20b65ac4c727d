"""What an ingest holds in memory, and the choices made from it: dates per task, read chunks of the
two-pass statistics, and whether the training statistics fit one pass (docs/ingest.md, *Memory* and
*When one pass does not fit*)."""

from __future__ import annotations

import logging
from typing import Protocol

from postcast.datasets import schema, sources

log = logging.getLogger(__name__)


class StatisticsOptions(Protocol):
    """The ingest options the statistics decision reads (:class:`~.run.IngestConfig` has them)."""

    @property
    def statistics(self) -> str: ...  # auto | one-pass | two-pass

    @property
    def one_pass_max_gb(self) -> float | None: ...


TASK_BYTES = 64 * 2**20  # member data per date task, and per read chunk of the two-pass statistics
# date tasks submitted and not yet folded into the running merge, per worker thread: enough that a thread
# finds the next date waiting, few enough that the partials waiting to be folded stay a constant
DATES_AHEAD_PER_THREAD = 2


def _fields(plan: sources.Plan) -> int:
    """Member fields per (member, step): a pressure-level variable counts once per level."""
    return sum(
        len(plan.levels) if plan.variable(v).level_type is schema.LevelType.PRESSURE else 1 for v in plan.variables
    )


def variable_groups(plan: sources.Plan, dates: int) -> list[tuple[str, ...]]:
    """The plan's variables in consecutive groups of at most TASK_BYTES of member data over ``dates`` init dates
    (or one variable), which a date task loads and writes one group at a time: every variable in one group where
    the dates are small (5 deg), one or two per group at 0.5 deg."""
    ny, nx = plan.grid.shape
    per_field = 4 * ny * nx * len(plan.members) * len(plan.steps_h) * dates
    groups: list[tuple[str, ...]] = []
    held = 0
    for v in plan.variables:
        size = per_field * (len(plan.levels) if plan.variable(v).level_type is schema.LevelType.PRESSURE else 1)
        if groups and held + size <= TASK_BYTES:
            groups[-1] += (v,)
            held += size
        else:
            groups.append((v,))
            held = size
    return groups


def date_bytes(plan: sources.Plan) -> int:
    """Decoded bytes of member fields per init date (float32): what MB/s counts."""
    ny, nx = plan.grid.shape
    return 4 * ny * nx * len(plan.members) * len(plan.steps_h) * _fields(plan)


def batch_size(plan: sources.Plan, target_bytes: int = TASK_BYTES) -> int:
    """Dates per task: about ``target_bytes`` of member data (1 date per task at 0.5 deg), at most 16."""
    return max(1, min(16, target_bytes // max(date_bytes(plan), 1)))


def statistics_read_chunks(plan: sources.Plan, target_bytes: int = TASK_BYTES) -> dict[str, int]:
    """Read chunks for the two-pass statistics: many init dates per dask task (few, large tasks)."""
    per_date = 4 * plan.grid.shape[0] * plan.grid.shape[1] * len(plan.members) * len(plan.steps_h)
    return {schema.INIT_TIME: int(max(1, min(len(plan.init_times), target_bytes // per_date)))}


def partial_bytes(plan: sources.Plan) -> int:
    """Memory of the merged partial statistics (the accumulator a worker holds): per grid point of every
    statistics field slice (members, ensemble mean and std per variable, level and step; truth per step),
    mean and M2 in float64, min and max in float32 (a count that is the same everywhere is one number)."""
    slices = _fields(plan) * 3 * len(plan.steps_h) + len(schema.TARGETS) * len(plan.steps_h)
    return slices * plan.grid.shape[0] * plan.grid.shape[1] * (8 + 8 + 4 + 4)


def one_pass_bytes(plan: sources.Plan) -> int:
    """Peak memory of a worker on the one-pass path: the accumulator twice (while a merge makes the next
    one), and a date's decoded fields with their ensemble statistics and partials (twice the date)."""
    return 2 * partial_bytes(plan) + 2 * date_bytes(plan)


def one_pass(cfg: StatisticsOptions, plan: sources.Plan, worker_gb: float | None = None) -> bool:
    """Whether the training statistics come from the date tasks' partials (one pass) or from a dask
    reduction over the finished store (two passes, bounded memory): in auto mode, one pass while
    :func:`one_pass_bytes` fits ``one_pass_max_gb``, by default 60% of the smallest worker's memory
    limit ``worker_gb`` (dask's own target fraction; see :func:`cluster.worker_memory_gb`); two passes
    when neither is known."""
    if cfg.statistics != "auto":
        return cfg.statistics == "one-pass"
    need = one_pass_bytes(plan) / 1e9
    budget = (
        cfg.one_pass_max_gb if cfg.one_pass_max_gb is not None else (0.6 * worker_gb if worker_gb is not None else None)
    )
    if budget is None or need > budget:
        source = "one_pass_max_gb" if cfg.one_pass_max_gb is not None else "60% of a worker's memory"
        why = "no worker reports its memory" if budget is None else f"over {budget:.1f} GB ({source})"
        log.info(
            "statistics in a second pass over the store: one-pass statistics would take %.1f GB per worker, "
            "%s; workers with more memory (or a larger one_pass_max_gb) take the one-pass path",
            need,
            why,
        )
        return False
    return True
