"""Bounded load test of ``postcast serve`` on loopback, with the framework's limit measured in the same
run: a trivial FastAPI endpoint (``postcast.serve.testing.trivial_app``) served with the same server
setup (``postcast/serve/server.py``: uvicorn, uvloop, httptools, same timeouts and limits, same number
of workers), then the real service on the same machine:

* ``framework``: ``GET /ping`` of the trivial app, 16 in flight;
* ``point@16`` and ``point@64``: point queries at random locations and valid times;
* ``bbox``: whole-globe boxes (on a ``--bbox-resolution`` grid: the answer is every grid point);
* ``map``: ``/map.png`` requests after the first render (cached per file and parameters).

The load generator is one aiohttp process (lighter than httpx, so more of the cores go to the server);
client and server share the machine's cores (the count is printed). Each phase stops after its number
of requests or its time limit.

    python benchmarks/serve_load.py                      # t850 on a 0.5 deg grid, 1 worker
    python benchmarks/serve_load.py --requests 5000 --workers 2

Prints a table, writes benchmarks/results/serve_load.json; last line:
RESULT qps=<x> fraction_of_framework=<x> p99_ms_16=<x> p99_ms_64=<x> map_p99_ms=<x> errors=<n>
(qps: point queries at 16 in flight; fraction_of_framework: that over the trivial endpoint's rate.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np

from postcast.datasets import io
from postcast.serve.testing import running_server, running_trivial_server, write_forecasts


@dataclass
class Phase:
    name: str
    in_flight: int
    latencies: list[float]
    errors: int
    seconds: float

    def row(self) -> dict[str, object]:
        ms = np.asarray(self.latencies) * 1e3
        return {
            "phase": self.name,
            "in_flight": self.in_flight,
            "requests": len(ms),
            "qps": round(len(ms) / self.seconds, 1),
            "p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p99_ms": round(float(np.percentile(ms, 99)), 2),
            "max_ms": round(float(ms.max()), 2),
            "errors": self.errors,
        }


async def load(
    url: str, queries: list[str], concurrency: int, limit_s: float, ok: Callable[[int, bytes], bool]
) -> tuple[list[float], int, float]:
    """Send ``queries`` with ``concurrency`` in flight; (latencies in s, errors, elapsed s)."""
    latencies: list[float] = []
    errors = 0
    queue: asyncio.Queue[str] = asyncio.Queue()
    for q in queries:
        queue.put_nowait(q)
    deadline = time.perf_counter() + limit_s

    async def worker(client: aiohttp.ClientSession) -> None:
        nonlocal errors
        while not queue.empty() and time.perf_counter() < deadline:
            query = queue.get_nowait()
            t0 = time.perf_counter()
            try:
                async with client.get(url + query) as r:
                    good = ok(r.status, await r.read())
            except (TimeoutError, aiohttp.ClientError):
                good = False
            latencies.append(time.perf_counter() - t0)
            errors += not good

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10.0)) as client:
        for q in dict.fromkeys(queries[:50]):  # warm: the server loads each forecast (and renders a map) once
            async with client.get(url + q) as r:
                await r.read()
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return latencies, errors, elapsed


def point_queries(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    lats, lons = rng.uniform(-90, 90, n), rng.uniform(-180, 360, n)
    days = rng.integers(4, 7, n)  # valid 2017-01-04 .. 06 (init 02 .. 04)
    return [
        f"/forecast/point?target=t850&lat={lats[i]:.3f}&lon={lons[i]:.3f}&time=2017-01-{days[i]:02d}T00:00"
        for i in range(n)
    ]


def run_phase(
    name: str, url: str, queries: list[str], in_flight: int, limit_s: float, ok: Callable[[int, bytes], bool]
) -> Phase:
    lat, errors, elapsed = asyncio.run(load(url, queries, in_flight, limit_s, ok))
    return Phase(name, in_flight, lat, errors, elapsed)


def render_first(url: str) -> None:
    """One request of ``url`` (a map), answered before its phase starts, so that the phase times maps served from
    the cache: without it the phase's first requests all waited for the one render (16 of 1,000 requests, past
    the 99th percentile)."""
    with urllib.request.urlopen(url, timeout=600) as r:  # a ceiling against a hang only
        if r.status != 200 or r.read(4) != b"\x89PNG":
            raise SystemExit(f"{url}: no map (HTTP {r.status})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=20000, help="per point and framework phase")
    p.add_argument("--bbox-requests", type=int, default=2000)
    p.add_argument("--map-requests", type=int, default=1000)
    p.add_argument("--time-limit", type=float, default=30.0, help="seconds per phase; stops early when reached")
    p.add_argument("--resolution", type=float, default=0.5, help="grid of the point/map forecasts (degrees)")
    p.add_argument("--bbox-resolution", type=float, default=5.0, help="grid of the whole-globe bbox forecast")
    p.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (both servers)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/serve_load.json"))
    a = p.parse_args()
    is_point: Callable[[int, bytes], bool] = lambda s, b: s == 200 and b.startswith(b'{"target":"t850"')  # noqa: E731
    with running_trivial_server(workers=a.workers) as url:
        phases = [
            run_phase(
                "framework",
                url,
                ["/ping"] * a.requests,
                16,
                a.time_limit,
                lambda s, b: s == 200 and b == b'{"ok":true}',
            )
        ]
    with tempfile.TemporaryDirectory() as tmp:
        write_forecasts(Path(tmp), n=3, resolution=a.resolution)
        write_forecasts(Path(tmp), target="z500", n=1, resolution=a.bbox_resolution)
        with running_server(Path(tmp), workers=a.workers, extra=("--no-access-log",)) as url:
            phases.append(run_phase("point", url, point_queries(a.requests, 0), 16, a.time_limit, is_point))
            phases.append(run_phase("point", url, point_queries(a.requests, 1), 64, a.time_limit, is_point))
            box = "/forecast/bbox?target=z500&lat_min=-90&lat_max=90&lon_min=0&lon_max=359.99"
            phases.append(
                run_phase(
                    "bbox",
                    url,
                    [box] * a.bbox_requests,
                    16,
                    a.time_limit,
                    lambda s, b: s == 200 and b.startswith(b'{"target":"z500"'),
                )
            )
            render_first(url + "/map.png?target=t850")  # the phase times cached maps: render the map before it
            phases.append(
                run_phase(
                    "map",
                    url,
                    ["/map.png?target=t850"] * a.map_requests,
                    16,
                    a.time_limit,
                    lambda s, b: s == 200 and b[:4] == b"\x89PNG",
                )
            )
    rows = [ph.row() for ph in phases]
    framework, p16, p64, bbox, maps = rows
    summary = {
        "qps": p16["qps"],
        "fraction_of_framework": round(float(p16["qps"]) / float(framework["qps"]), 3),  # type: ignore[arg-type]
        "p99_ms_16": p16["p99_ms"],
        "p99_ms_64": p64["p99_ms"],
        "bbox_qps": bbox["qps"],
        "map_p99_ms": maps["p99_ms"],
        "errors": sum(int(r["errors"]) for r in rows),
    }  # type: ignore[call-overload]
    cores = os.cpu_count()
    print(
        f"loopback, client and server on the same {cores} cores; {a.workers} worker(s); "
        f"point/map grid {a.resolution} deg, bbox grid {a.bbox_resolution} deg"
    )
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + "---|" * len(rows[0]))
    for r in rows:
        print("| " + " | ".join(str(v) for v in r.values()) + " |")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    io.write_json(
        a.out,
        {
            "cores": cores,
            "workers": a.workers,
            "grid_deg": a.resolution,
            "bbox_grid_deg": a.bbox_resolution,
            "phases": rows,
            **summary,
        },
    )
    print(json.dumps(summary))
    print(
        "RESULT "
        + " ".join(
            f"{k}={summary[k]}"
            for k in ("qps", "fraction_of_framework", "p99_ms_16", "p99_ms_64", "map_p99_ms", "errors")
        )
    )


if __name__ == "__main__":
    main()
