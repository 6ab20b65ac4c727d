"""Public testing API of the forecast service: write a small forecast directory and run the real
``postcast serve`` in a subprocess.

For anyone who tests against the service (postcast's own ``tests/test_serve.py`` and
``benchmarks/serve_load.py``, or a client of the API):

* :func:`write_forecasts`: a few forecasts on a regular grid, written exactly as ``postcast
  forecast`` writes them (same products, names and layout);
* :func:`running_server`: a context manager that starts ``postcast serve`` on a free loopback port,
  waits for ``/health`` and yields the base URL; the process is stopped on exit;
* :func:`running_trivial_server`: the same server setup (``postcast.serve.server``) around a trivial
  FastAPI app (:func:`trivial_app`), the framework's limit for load benchmarks;
* :func:`free_port`: a free TCP port on 127.0.0.1.

Nothing in the service imports this module; :func:`running_server` needs ``httpx`` (extra
``postcast[serve]``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from postcast.datasets import schema
from postcast.pipeline.products.archive import DEFAULT_QUANTILES, EXTENSIONS, POSTPROCESSED, product_path, write_product
from postcast.pipeline.products.content import Law, products


def postprocessed(
    mean: np.ndarray, std: np.ndarray, target: str, init: pd.Timestamp, grid: schema.Grid,
    thresholds: Sequence[float], law: Law | None = None, members: np.ndarray | None = None,
) -> xr.Dataset:  # fmt: skip
    """A post-processed product of ``target`` at the target lead on ``grid``, with the default quantiles, as
    ``postcast forecast`` writes it (``law``: the family's own; None for a Gaussian; ``members``: the raw
    ones, (M, lat, lon), or None)."""
    return products(
        mean,
        std,
        target=schema.target(target),
        init=init,
        step_h=schema.TARGET_STEP_H,
        lat=grid.latitudes(),
        lon=grid.longitudes(),
        quantiles=DEFAULT_QUANTILES,
        thresholds=tuple(thresholds),
        attrs={"product": POSTPROCESSED},
        law=law,
        members=members,
    )


def write_forecasts(
    out: Path,
    target: str = schema.DEFAULT_TARGET,
    n: int = 3,
    resolution: float = 5.0,
    seed: int = 0,
    model: str = "unet",
    formats: tuple[str, ...] = ("netcdf",),
) -> list[Path]:
    """``n`` daily forecasts of ``target`` on a regular grid, written like ``postcast forecast`` does
    (through the archive's contract, ``pipeline/products/archive.py``), in each of ``formats``."""
    grid = schema.Grid(resolution)
    lat = grid.latitudes()
    rng = np.random.default_rng(seed)
    paths = []
    for k in range(n):
        init = pd.Timestamp("2017-01-02") + pd.Timedelta(days=k)
        mu = 280.0 - 30.0 * np.abs(np.sin(np.deg2rad(lat)))[:, None] + rng.normal(0, 1, grid.shape)
        sigma = 1.0 + rng.random(grid.shape)
        ds = postprocessed(mu, sigma, target, init, grid, (273.15,))
        for fmt in formats:
            path = product_path(out, POSTPROCESSED, model, target, init, EXTENSIONS[fmt])
            write_product(ds, path)
            paths.append(path)
    return paths


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_server(
    forecasts: Path, *, token: str | None = None, workers: int = 1, timeout: float = 60.0, extra: Sequence[str] = ()
) -> Iterator[str]:
    """Start ``postcast serve`` on a free loopback port (``extra``: more of its options); yield its base
    URL; stop it afterwards."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "postcast",
        "serve",
        str(forecasts),
        "--port",
        str(port),
        "--workers",
        str(workers),
        *extra,
    ]
    if token:
        cmd += ["--token", token]
    with _running(cmd, port, timeout) as url:
        yield url


def trivial_app() -> Any:
    """A FastAPI app with one trivial endpoint, ``GET /ping``: what the framework alone can serve."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    return app


@contextmanager
def running_trivial_server(workers: int = 1, timeout: float = 60.0) -> Iterator[str]:
    """:func:`trivial_app` run with the same server setup as ``postcast serve`` (``serve/server.py``)."""
    port = free_port()
    code = (
        "from postcast.serve.server import ServeOptions, run; "
        f"run('postcast.serve.testing:trivial_app', "
        f"ServeOptions(port={port}, workers={workers}, access_log=False))"
    )
    with _running([sys.executable, "-c", code], port, timeout) as url:
        yield url


@contextmanager
def _running(cmd: list[str], port: int, timeout: float) -> Iterator[str]:
    import tempfile

    env = {k: v for k, v in os.environ.items() if k != "POSTCAST_TOKEN"}
    # its log (one access line per request) goes to a file: a pipe nobody reads would fill and block the server
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            yield _wait_healthy(proc, log, f"http://127.0.0.1:{port}", f"{cmd[1:4]}", timeout)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait_healthy(proc: subprocess.Popen[bytes], log: Any, url: str, name: str, timeout: float) -> str:
    """``url`` once its /health answers 200; the process's log in the error when it exits or times out."""
    import httpx

    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            log.seek(0)
            msg = f"{name} exited with {proc.returncode}: {log.read().decode()[-2000:]}"
            raise RuntimeError(msg)
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return url
        except httpx.TransportError:
            pass
        if time.time() > deadline:
            msg = f"{name} did not answer /health in {timeout} s"
            raise TimeoutError(msg)
        time.sleep(0.2)
