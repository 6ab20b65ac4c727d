"""The training statistics of an ingest, reduced on the workers. One pass: the running merge of the date tasks'
partial statistics, its checkpoints to ``OUT.partial/stats/merged.npz``, what a resumed run takes from an
interrupted one, and the statistics group written from the merge (docs/ingest.md, *Resume*). Two passes:
a tree reduction per field over the written store whose last task writes the field's statistics
(:func:`statistics_on_workers`). Either way the partials stay on the workers: the ingest process holds
none of them, whatever the dates and the width."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import numpy as np
import xarray as xr

from postcast.datasets import contract, io, schema, sources, statistics
from postcast.datasets.core import moments
from postcast.datasets.core.cluster import keep_freed_memory
from postcast.datasets.ingest import partials
from postcast.datasets.ingest.tasks import marker_name

STATS_DIR = "stats"  # OUT.partial/stats/merged.npz: the merged partials of the training dates it lists
MERGED = "merged.npz"
MERGE_PRIORITY = 10  # dask task priority of merges and checkpoints (date tasks: 0)


@dataclass(frozen=True)
class Resume:
    """What an earlier, interrupted run left (nothing, for a fresh run)."""

    todo: list[int]  # indices of the init dates to ingest
    prior: list[int]  # training dates done after the last checkpoint: their partials are read back from the store
    covered: list[str]  # the dates merged.npz covers (marker names)


def resume_state(plan: sources.Plan, done_dir: Path, stats_dir: Path, train: frozenset[int]) -> Resume:
    """The dates left to ingest, and the training dates (indices in ``train``) whose partials are done but
    not in merged.npz, from the done-markers and merged.npz."""
    done = {p.name for p in done_dir.iterdir()}
    merged = stats_dir / MERGED
    covered = set(partials.partial_dates(merged)) if merged.exists() else set()
    todo, prior = [], []
    for i, t in enumerate(plan.init_times):
        stamp = marker_name(t)
        if stamp not in done:
            todo.append(i)
        elif i in train and stamp not in covered:
            prior.append(i)
    return Resume(todo, prior, sorted(covered))


class Merger:
    """The running merge of training partials, as a dask future on the workers; every ``every`` dates it
    is saved to merged.npz with the dates it covers (a checkpoint: a resumed ingest reads back from the
    store only the training dates finished after it)."""

    def __init__(self, client: Any, stats_dir: Path, covered: list[str], every: int) -> None:
        self.client, self.stats_dir, self.every = client, stats_dir, every
        self.covered = list(covered)  # dates in self.acc
        self.unsaved = 0  # dates in self.acc since the last checkpoint
        self.acc: Any = None  # a future of the merged partials (None: nothing merged yet)
        if covered:
            self.acc = client.submit(partials.load_partials, str(stats_dir / MERGED), pure=False)

    def add(self, fut: Any, stamps: list[str]) -> None:
        """Fold the partials of future ``fut`` (covering the dates ``stamps``) into the merge."""
        if not stamps:
            return
        # merges and checkpoints run before waiting date tasks (priority): a finished date's partials are
        # folded in at once, not held until the queue drains
        self.acc = (
            fut
            if self.acc is None
            else self.client.submit(moments.combine_fields, self.acc, fut, pure=False, priority=MERGE_PRIORITY)
        )
        self.covered += stamps
        self.unsaved += len(stamps)
        if self.unsaved >= self.every:
            self.acc = self.client.submit(
                checkpoint_partials,
                self.acc,
                str(self.stats_dir / MERGED),
                sorted(self.covered),
                pure=False,
                priority=MERGE_PRIORITY,
            )
            self.unsaved = 0


def in_order(done: Iterable[Any], keys: list[str]) -> Iterator[Any]:
    """The futures of ``done`` (given as they finish) in the order of ``keys`` (the order of the dates): the
    merge folds the dates in one fixed order, so two ingests of one source write the same bits (float64 merges
    are not associative). A finished future waits here, its partials on its worker, only while an earlier
    date is still running."""
    order = iter(keys)
    wanted = next(order, None)
    waiting: dict[str, Any] = {}
    for fut in done:
        waiting[fut.key] = fut
        del fut
        while wanted in waiting:
            yield waiting.pop(wanted)
            wanted = next(order, None)


def checkpoint_partials(
    parts: moments.FieldPartials | None, path: str, dates: list[str]
) -> moments.FieldPartials | None:
    """Save merged partials (and the dates they cover) atomically; returns ``parts`` (a pass-through link
    in the chain of merges)."""
    if parts is not None:
        with io.atomic_path(path) as tmp:
            partials.save_partials(parts, tmp, dates=dates)
    return parts


def stored_partials(store_path: str, index: int) -> moments.FieldPartials:
    """The partial statistics of init date ``index`` read back from the store: a resumed ingest's training
    dates finished after its last checkpoint of merged partials (the same float32 values, the same
    partials as the task that wrote them computed)."""
    ds = io.open_zarr(store_path)
    day = ds[statistics.statistic_fields(ds)].isel({schema.INIT_TIME: [index]}).load(scheduler="synchronous")
    return statistics.date_partials(day)


def statistics_template(store_path: Path) -> None:
    """Create the statistics group's arrays (metadata only: hundreds of arrays, ~1 s), here in the client
    while the workers ingest the dates."""
    tmpl, chunks = statistics.template(io.open_zarr(store_path))
    io.write_template(tmpl, store_path, chunks=chunks, group=contract.STATISTICS_GROUP)


def write_statistics(
    parts: moments.FieldPartials | None, store_path: str, train_times: np.ndarray, splits: schema.Splits
) -> None:
    """Write the statistics group from the merged partials (a task: it runs where they are) into the arrays
    :func:`statistics_template` created."""
    keep_freed_memory()
    stats = statistics.from_partials(io.open_zarr(store_path), parts or {}, train_times, splits)
    io.write_into(stats, store_path, group=contract.STATISTICS_GROUP)


def statistics_on_workers(store_path: Path, read_chunks: dict[str, int], splits: schema.Splits) -> None:
    """The two-pass statistics group of the store at ``store_path``, on the active dask scheduler: per field a
    pairwise tree of merges over the blocks of its training dates (:func:`statistics.field_partials`, read in
    ``read_chunks``) ending in a task that writes the field's statistics into the group's arrays (created here
    first, metadata only). Only None comes back to this process; the figures are
    :func:`statistics.compute_statistics`' over the same chunks, bit for bit."""
    ds = io.open_zarr(store_path, chunks=read_chunks)
    train = statistics.training_dates(ds, splits)
    statistics_template(store_path)
    dask.compute(
        *[
            dask.delayed(write_field, pure=False)(
                statistics.field_partials(train[n]), n, tuple(map(str, train[n].dims)), str(store_path)
            )
            for n in statistics.statistic_fields(ds)
        ]
    )
    attrs = statistics.attributes(train[schema.INIT_TIME].values, splits)
    io.write_into(xr.Dataset(attrs=attrs), store_path, group=contract.STATISTICS_GROUP)


def write_field(parts: moments.Partial, name: str, dims: tuple[str, ...], store_path: str) -> None:
    """Write field ``name``'s statistics from its merged partial into the group's arrays (a task on the worker
    holding ``parts``; the group's attributes are written once, by the caller)."""
    io.write_into(
        xr.Dataset(statistics.field_variables(name, dims, parts)), store_path, group=contract.STATISTICS_GROUP
    )
