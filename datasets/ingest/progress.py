"""Progress of an ingest: dates done, MB/s and an ETA, as log lines and a tqdm bar (docs/ingest.md,
*Progress*)."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)


class Progress:
    """Progress of a long ingest: dates done of the total, MB/s of decoded member data written (10^6
    bytes, this run only) and an ETA from that rate. A log line (INFO) every ``every_dates`` dates
    (default: a tenth of the run) or ``every_s`` seconds, whichever comes first, and at the end."""

    def __init__(
        self,
        total: int,
        done: int,
        bytes_per_date: int,
        *,
        every_s: float = 10.0,
        every_dates: int | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        self.total, self.done, self._first = total, done, done
        self.bytes_per_date, self.every_s = bytes_per_date, every_s
        self.every_dates = every_dates or max(1, (total - done) // 10)
        self._clock = clock
        self._t0 = self._last_t = clock()
        self._last_done = done

    def rate(self) -> float:
        """MB/s of decoded member data written so far in this run."""
        seconds = max(self._clock() - self._t0, 1e-9)
        return (self.done - self._first) * self.bytes_per_date / 1e6 / seconds

    def eta(self) -> float | None:
        """Seconds left at this run's pace (None before the first date of this run)."""
        if self.done <= self._first:
            return None
        per_date = (self._clock() - self._t0) / (self.done - self._first)
        return per_date * (self.total - self.done)

    def line(self) -> str:
        eta = self.eta()
        left = "?" if eta is None else str(dt.timedelta(seconds=round(eta)))
        pct = 100.0 * self.done / max(self.total, 1)
        return f"ingest: {self.done}/{self.total} dates ({pct:.0f}%), {self.rate():.1f} MB/s, ETA {left}"

    def update(self, n: int) -> None:
        """``n`` more dates are done: log a line when due."""
        self.done += n
        now = self._clock()
        if (
            self.done >= self.total
            or now - self._last_t >= self.every_s
            or self.done - self._last_done >= self.every_dates
        ):
            log.info("%s", self.line())
            self._last_t, self._last_done = now, self.done


class Finishing:
    """Futures as they finish (dask's ``as_completed``, to which :meth:`add` may add more while it is iterated),
    with a tqdm bar (``bar``) counting their weights (dates) and showing MB/s, and ``meter``'s log lines. A
    failed task raises its error as soon as it finishes."""

    def __init__(self, meter: Progress, *, bar: bool, desc: str = "ingest") -> None:
        from dask.distributed import as_completed as completing

        self.meter, self.bar, self.desc = meter, bar, desc
        self._pending = completing()
        self._weights: dict[str, int] = {}
        self.added = 0  # futures added so far

    def add(self, fut: Any, weight: int) -> None:
        self._weights[fut.key] = weight
        self._pending.add(fut)
        self.added += 1

    def __iter__(self) -> Iterator[Any]:
        from tqdm import tqdm

        meter = self.meter
        bar = {"desc": self.desc, "unit": "date", "disable": not self.bar, "mininterval": 1.0}
        with tqdm(total=meter.total, initial=meter.done, **bar) as shown:
            for fut in self._pending:
                if fut.status != "finished":
                    fut.result()  # raises the task's error here
                n = self._weights.pop(fut.key)
                # handed over, not kept: a reference held here while the next task runs would keep this one's
                # result (a date's partials, already merged) on its worker until the next finishes
                handed = [fut]
                del fut
                yield handed.pop()
                meter.update(n)
                shown.set_postfix_str(f"{meter.rate():.1f} MB/s", refresh=False)
                shown.update(n)
