"""Bounded load test of ``postcast serve`` on loopback: a fixed number of point queries at random
locations and valid times, with a fixed concurrency and a time limit. The load generator is one
aiohttp process (lighter than httpx, so more of the 2 cores go to the server it measures); the
server is the real ``postcast serve`` (uvicorn with uvloop and httptools) in its own process(es).

    python benchmarks/serve_load.py                      # 20000 requests, 16 in flight, 0.5 deg grid
    python benchmarks/serve_load.py --requests 20000 --workers 2

Prints a table, writes benchmarks/results/serve_load.json; last line:
RESULT qps=<x> p99_ms=<x> errors=<n>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

from postcast.datasets import io
from postcast.serve.testing import running_server, write_forecasts


async def load(url: str, n: int, concurrency: int, limit_s: float, seed: int) -> tuple[list[float], int, float]:
    rng = np.random.default_rng(seed)
    lats, lons = rng.uniform(-90, 90, n), rng.uniform(-180, 360, n)
    days = rng.integers(4, 7, n)  # valid 2017-01-04 .. 06 (init 02 .. 04)
    latencies: list[float] = []
    errors = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    deadline = time.perf_counter() + limit_s

    async def worker(client: aiohttp.ClientSession) -> None:
        nonlocal errors
        while not queue.empty() and time.perf_counter() < deadline:
            i = queue.get_nowait()
            query = f"/forecast/point?target=t850&lat={lats[i]:.3f}&lon={lons[i]:.3f}&time=2017-01-{days[i]:02d}T00:00"
            t0 = time.perf_counter()
            try:
                async with client.get(url + query) as r:
                    body = await r.read()
                    ok = r.status == 200 and body.startswith(b'{"target":"t850"')
            except (TimeoutError, aiohttp.ClientError):
                ok = False
            latencies.append(time.perf_counter() - t0)
            errors += not ok

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10.0)) as client:
        for day in (4, 5, 6):  # the server loads each forecast on first use: warm it, as in operation
            async with client.get(f"{url}/forecast/point?target=t850&lat=0&lon=0&time=2017-01-{day:02d}T00:00") as r:
                r.raise_for_status()
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return latencies, errors, elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds; stops early when reached")
    p.add_argument("--resolution", type=float, default=0.5, help="grid of the served forecasts (degrees)")
    p.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/serve_load.json"))
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_forecasts(Path(tmp), n=3, resolution=a.resolution)
        with running_server(Path(tmp), workers=a.workers) as url:
            lat, errors, elapsed = asyncio.run(load(url, a.requests, a.concurrency, a.time_limit, seed=0))
    ms = np.asarray(lat) * 1e3
    res = {"requests": len(lat), "concurrency": a.concurrency, "workers": a.workers, "grid_deg": a.resolution,
           "seconds": round(elapsed, 3), "qps": round(len(lat) / elapsed, 1),
           "p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2),
           "max_ms": round(float(ms.max()), 2), "errors": int(errors)}
    print("| " + " | ".join(res) + " |")
    print("|" + "---|" * len(res))
    print("| " + " | ".join(str(v) for v in res.values()) + " |")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    io.write_json(a.out, res)
    print(json.dumps(res))
    print(f"RESULT qps={res['qps']} p99_ms={res['p99_ms']} errors={res['errors']}")


if __name__ == "__main__":
    main()
