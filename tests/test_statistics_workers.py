"""Issue 37 item 4: the two-pass training statistics are reduced on the workers (a pairwise tree of merges
per field, whose last task writes the field's statistics), so the ingest process never holds the fields'
partials; the figures are those of `compute_statistics` over the same chunks, bit for bit.

The ingest process's memory is measured with tracemalloc (numpy arrays and the bytes dask receives are
Python allocations); the store is 2.5 deg so that the partials (tens of MB) dwarf everything else the
process allocates."""

from __future__ import annotations

import dataclasses
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from dask_plugins import TasksHeld

from postcast.datasets import contract, io, schema, sources, statistics
from postcast.datasets.core import moments
from postcast.datasets.ingest import budget as ingest_budget
from postcast.datasets.ingest import run as ingest
from postcast.datasets.ingest.run import IngestConfig
from postcast.datasets.synth import synthfiles
from postcast.datasets.synth.synthetic import SynthConfig


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two training dates (2012) on a 2.5 deg grid, one level: raw synthetic zarr."""
    out = tmp_path_factory.mktemp("wide") / "raw"
    synthfiles.write_synthetic(
        SynthConfig(seed=11, resolution=2.5, years=(2012, 2012), dates_per_year=2, levels=(850,)), out, progress=False
    )
    return out


@pytest.mark.slow
def test_two_pass_statistics_stay_on_the_workers_and_equal_compute_statistics(wide, tmp_path):
    cfg = IngestConfig(
        source=str(wide), out=str(tmp_path / "s.zarr"), workers=1, processes=True, progress=False, statistics="two-pass"
    )
    plan = sources.discover(cfg.source, truth=cfg.truth).forecast.plan(cfg.expectation)
    partials = ingest_budget.partial_bytes(plan)  # the merged partials of every field
    assert partials > 20e6
    tracemalloc.start()
    try:
        ingest.ingest(cfg)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # gathered here, the merged partials alone would be `partials` (the rest of the process: ~14 MB here)
    assert peak < partials / 2, (peak, partials)
    got = contract.open_statistics(cfg.out)
    ds = io.open_zarr(cfg.out, chunks=ingest_budget.statistics_read_chunks(plan))
    want = statistics.compute_statistics(ds, schema.Splits())
    assert got is not None and set(got.data_vars) == set(want.data_vars) and got.attrs == want.attrs
    for name in want.data_vars:
        np.testing.assert_array_equal(got[name].values, want[name].values, err_msg=str(name))


def test_the_running_merge_folds_the_dates_in_date_order_whatever_finishes_first(store, tmp_path):
    """Issue 38 item 4: two ingests of one source gave statistics 1 ulp apart (the dates were merged as they
    finished; float64 merges are not associative). Here the date tasks finish in reverse order (each waits for
    a dask Event the test sets last-first); the running merge equals the fold in date order bit for bit, and
    the fold in finishing order (what ingest did before) does not."""
    from dask.distributed import Client, Event, LocalCluster
    from dask.distributed import as_completed as completing

    from postcast.datasets.ingest import merge

    n = 6
    with (
        LocalCluster(n_workers=1, threads_per_worker=n, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        futures = [client.submit(_partials_after_event, str(store), i, f"date-{i}", pure=False) for i in range(n)]
        finishing = completing(futures)
        for i in reversed(range(n)):
            Event(f"date-{i}", client=client).set()
            futures[i].result()  # finished before the next (earlier) date is let go
        done = list(finishing)
        assert [f.key for f in done] == [f.key for f in reversed(futures)]
        merger = merge.Merger(client, tmp_path, [], every=10**6)
        for fut in merge.in_order(done, [f.key for f in futures]):
            merger.add(fut, [fut.key])
        merged = merger.acc.result()
        parts = [f.result() for f in futures]
    in_date_order = _fold(parts)
    assert _same_bits(merged, in_date_order)
    assert not _same_bits(_fold(parts[::-1]), in_date_order)  # the order matters: this test can fail


def _partials_after_event(store: str, index: int, event: str) -> moments.FieldPartials:
    from dask.distributed import Event

    from postcast.datasets.ingest import merge

    Event(event).wait()
    return merge.stored_partials(store, index)


def _fold(parts: list[moments.FieldPartials]) -> moments.FieldPartials:
    acc = None
    for p in parts:
        acc = moments.combine_fields(acc, p)
    assert acc is not None
    return acc


def _same_bits(a: moments.FieldPartials, b: moments.FieldPartials) -> bool:
    return a.keys() == b.keys() and all(
        a[f].keys() == b[f].keys() and all(np.array_equal(a[f][k], b[f][k]) for k in a[f]) for f in a
    )


@pytest.fixture(scope="module")
def tasks_held(synth_zarr: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[TasksHeld, TasksHeld]:
    """Ingest ``synth_zarr`` (18 dates of one date per task, a checkpoint of the merge after every date) on a
    one-thread worker; (the date tasks, the merges and checkpoints) as the scheduler held them."""
    from dask.distributed import Client, LocalCluster

    tmp_path = tmp_path_factory.mktemp("held")

    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        seen = TasksHeld(("ingest_dates",))
        merges = TasksHeld(("combine_fields", "checkpoint_partials"))
        cluster.scheduler.add_plugin(merges)
        cluster.scheduler.add_plugin(seen)
        cfg = IngestConfig(
            source=str(synth_zarr), out=str(tmp_path / "s.zarr"), scheduler=cluster.scheduler_address, progress=False
        )
        res = ingest.ingest(dataclasses.replace(cfg, dates_per_task=1, checkpoint_dates=1))
        assert len(client.scheduler_info()["workers"]) == 1
    assert res.n_written == 18
    assert not seen.held  # every date task let go by the end
    return seen, merges


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
def test_ingest_holds_a_window_of_date_tasks_however_many_dates(tasks_held):
    """Issue 37 item 4: ingest submitted every date task at once, so the partials of the dates finished before
    the client folded them in waited on the workers, more of them the more dates. Now a date task is submitted
    when the one before it is merged: the scheduler holds at most DATES_AHEAD_PER_THREAD per worker thread ahead
    and the date being merged. Submitted as soon as a date was folded (not merged), a merge waited for the one
    before it while the worker ran a date task between each, so merges fell behind and their dates' partials
    piled up (at 0.5 deg the worker held 5 dates' partials after 30 dates; here 4 merges and checkpoints waited
    at once, and 5 date tasks were held)."""
    seen, merges = tasks_held
    assert merges.most_waiting <= 1, (merges.most_waiting, seen.most)
    assert 1 <= seen.most <= ingest_budget.DATES_AHEAD_PER_THREAD + 2, seen.most


@pytest.mark.system  # minutes of CPU: a whole-process run or training (tests/tiers.py)
def test_a_merged_date_is_let_go_before_the_next_date_is_submitted(tasks_held):
    """The loop that hands finished date tasks to the merge (``progress.Finishing`` and ``merge.in_order``, two
    generators) kept the last future it handed over in a local variable until the next task finished, so the
    worker kept that date's partials, already merged, while it ran the next date task: one date's partials more
    than the window (at 0.5 deg, 112 MB per task of two dates, and the worker's peak at 64 dates 0.80 GB against
    0.71 at 16, 0.74 after). Now a merged date is let go before the next is submitted: the scheduler holds at most
    the window and the date being merged (before: one more, here 4)."""
    seen, _ = tasks_held
    assert 1 <= seen.most <= ingest_budget.DATES_AHEAD_PER_THREAD + 1, seen.most
