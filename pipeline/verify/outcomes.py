"""The outcomes' weighted sample of one region over a whole split, in memory that does not grow with the dates.

The uncertainty term of the Hersbach (2000) decomposition is the CRPS of the outcomes' own climatology,
1/2 sum_kl w_k w_l |y_k - y_l| (weights summing to 1): it needs every outcome, not a sum. At 0.5 deg that is
about 4 MB per test date and region (distinct float64 values and their weights). :class:`OutcomeSample`
holds at most ``spill_values`` distinct values in memory; beyond that it writes them, sorted, as a *run* to a
scratch folder under TMPDIR, and :meth:`OutcomeSample.crps` merges the runs in windows of ascending values
(at most ``spill_values`` values read at once), accumulating the same sum as
:func:`postcast.pipeline.verify.metrics.sample_crps` over the merged sample. Tied values need not be merged:
each tied entry's term, with the cumulative weight up to it, adds up to the merged value's term.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from postcast.pipeline.verify.metrics import ValueWeights, merge_value_weights, sample_crps, value_weights

SPILL_VALUES = 1 << 18  # distinct values held in memory per region (2 x 8 B each: 4 MB) before a run is written
EMPTY: ValueWeights = (np.empty(0), np.empty(0))


class OutcomeSample:
    """A weighted sample that :meth:`add` grows and :meth:`crps` scores (the climatological CRPS)."""

    def __init__(self, spill_values: int | None = None) -> None:
        self.spill_values = SPILL_VALUES if spill_values is None else spill_values
        self.held: ValueWeights = EMPTY
        self.runs: list[tuple[Path, int]] = []  # (file of (n, 2) float64 rows: value, weight; n), values sorted
        self.total_weight = 0.0
        self._scratch: tempfile.TemporaryDirectory[str] | None = None  # removed with the object

    def add(self, sample: ValueWeights) -> None:
        """Add a sample of sorted distinct values (:func:`value_weights`). What is held never exceeds the cap, and a
        sample that would take it past the cap is not merged with it: the held values go to a run, and a sample
        larger than the cap goes to its own run (a 0.5 deg part's global sample is about 0.8 M values), so adding
        a part takes the same memory however many came before."""
        self.total_weight += float(np.sum(sample[1]))
        if self.held[0].size + sample[0].size <= self.spill_values:
            self.held = merge_value_weights(self.held, sample)
            return
        if self.held[0].size:
            self._spill(self.held)
        self.held = EMPTY
        if sample[0].size > self.spill_values:
            self._spill(sample)
        else:
            self.held = sample

    def _spill(self, sample: ValueWeights) -> None:
        if bool((sample[0][1:] < sample[0][:-1]).any()):
            msg = "an outcome sample must be sorted (verification.value_weights) before it is written as a run"
            raise ValueError(msg)
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="postcast-outcomes-")
        path = Path(self._scratch.name) / f"run-{len(self.runs)}.bin"
        rows = np.empty((sample[0].size, 2))  # (n, 2) float64: value, weight
        rows[:, 0], rows[:, 1] = sample
        rows.tofile(path)
        self.runs.append((path, sample[0].size))

    def crps(self) -> float:
        """The climatological CRPS of everything added (sample_crps of the merged sample)."""
        if not self.runs:
            return sample_crps(self.held)
        if self.held[0].size:
            self._spill(self.held)
            self.held = EMPTY
        return _runs_crps(self.runs, self.total_weight, self.spill_values)


def _read(path: Path, start: int, count: int) -> np.ndarray:
    """Rows [start, start + count) of a run, (count, 2) float64."""
    return np.fromfile(path, dtype=np.float64, count=2 * count, offset=16 * start).reshape(-1, 2)


def _runs_crps(runs: list[tuple[Path, int]], total: float, window: int) -> float:
    """sum_k ws_k y_k (2 C_k - ws_k - 1) over the runs' values in ascending order (ws = w / total, C the
    cumulative ws), a window of at most ``window`` rows at a time: each run gives its next rows, and the window
    ends at the smallest last value among the runs that have rows beyond theirs (so no smaller value is left)."""
    pos = [0] * len(runs)
    per = max(1, window // len(runs))
    cum = acc = 0.0
    while any(p < n for p, (_, n) in zip(pos, runs, strict=True)):
        chunks = [_read(path, p, min(per, n - p)) for p, (path, n) in zip(pos, runs, strict=True)]
        more = [c[-1, 0] for c, p, (_, n) in zip(chunks, pos, runs, strict=True) if p + len(c) < n]
        bound = min(more) if more else np.inf
        taken = [c[: np.searchsorted(c[:, 0], bound, side="right")] for c in chunks]
        pos = [p + len(t) for p, t in zip(pos, taken, strict=True)]
        rows = np.concatenate(taken)
        values, weights = value_weights(rows[:, 0], rows[:, 1])
        ws = weights / total
        c = cum + np.cumsum(ws)
        acc += float((ws * values * (c - ws - (1.0 - c))).sum())
        cum = float(c[-1]) if c.size else cum
    return acc
