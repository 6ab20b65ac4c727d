"""Prometheus metrics of the service: requests and seconds per route template (bounded label sets,
fed by :class:`postcast.serve.auth.Gate`) and the archive's gauges, as the text ``/metrics`` serves."""

from __future__ import annotations

from collections import defaultdict

from postcast.serve.catalog import Catalog


class Stats:
    """Requests per (route template, status) and seconds per route template: bounded label sets."""

    def __init__(self) -> None:
        self.count: dict[tuple[str, int], int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)

    def prometheus(self, catalog: Catalog) -> str:
        """The Prometheus text: these counters and the gauges of ``catalog``."""
        lines = [
            "# HELP postcast_requests_total HTTP requests by route template and status",
            "# TYPE postcast_requests_total counter",
        ]
        lines += [f'postcast_requests_total{{path="{p}",status="{s}"}} {n}' for (p, s), n in sorted(self.count.items())]
        lines += [
            "# HELP postcast_request_seconds_total time spent answering, by route template",
            "# TYPE postcast_request_seconds_total counter",
        ]
        lines += [f'postcast_request_seconds_total{{path="{p}"}} {s:.6f}' for p, s in sorted(self.seconds.items())]
        lines += [
            "# HELP postcast_forecasts forecasts served",
            "# TYPE postcast_forecasts gauge",
            f"postcast_forecasts {len(catalog.entries)}",
            "# HELP postcast_skipped_files archive entries skipped (foreign or unreadable)",
            "# TYPE postcast_skipped_files gauge",
            f"postcast_skipped_files {len(catalog.skipped)}",
        ]
        return "\n".join(lines) + "\n"
