"""``postcast serve``: the HTTP service over the outputs of ``postcast forecast`` (:mod:`postcast.serve`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from postcast.common import Subparsers, log
from postcast.datasets.core.errors import ConfigError, MissingInputError


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "serve",
        help="HTTP service (FastAPI + uvicorn) over the outputs of `postcast forecast`",
        description="Serve point and bounding-box queries (mean, std, quantiles, exceedance probabilities), a "
        "listing, /health, /metrics (Prometheus), OpenAPI docs at /docs and a map page at /. "
        "With --token (or POSTCAST_TOKEN) every path but /health (and /metrics with --public-metrics) "
        "needs 'Authorization: Bearer TOKEN'. The archive is rescanned every --watch seconds; "
        "unreadable or foreign files are skipped and listed by /health.",
        epilog="examples:\n  postcast serve forecasts/ --port 8000\n"
        "  curl 'http://127.0.0.1:8000/forecast/point?target=t850&lat=47.5&lon=8.5'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("forecasts", help="directory written by `postcast forecast`")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="TCP port, 1..65535")
    p.add_argument("--token", help="bearer token (default: $POSTCAST_TOKEN; none: no auth)")
    p.add_argument("--public-metrics", action="store_true", help="leave /metrics open when a token is set")
    p.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    p.add_argument("--watch", type=float, default=2.0, help="rescan the archive at most every S seconds (default 2)")
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds a client has to send a request's headers (default 10)",
    )
    p.add_argument("--keep-alive-timeout", type=int, default=5, help="seconds an idle connection is kept (default 5)")
    p.add_argument(
        "--limit-concurrency", type=int, default=1000, help="connections + requests before answering 503 (default 1000)"
    )
    p.add_argument(
        "--no-access-log",
        dest="access_log",
        action="store_false",
        help="no line per request on stderr (the address, startup and shutdown are still logged)",
    )


def run(a: argparse.Namespace) -> int:
    from postcast.serve.server import ServeOptions
    from postcast.serve.server import run as run_server

    opts = ServeOptions(
        host=a.host,
        port=a.port,
        workers=a.workers,
        header_timeout=a.header_timeout,
        keep_alive_timeout=a.keep_alive_timeout,
        limit_concurrency=a.limit_concurrency,
        access_log=a.access_log,
    )
    if not 0.0 <= a.watch <= 86400.0:
        msg = f"--watch {a.watch}: give seconds in [0, 86400] (0: rescan on every request)"
        raise ConfigError(msg)
    if not Path(a.forecasts).is_dir():
        msg = f"{a.forecasts}: not a directory of forecasts (write one with `postcast forecast`)"
        raise MissingInputError(msg)
    os.environ["POSTCAST_FORECASTS"] = str(a.forecasts)
    os.environ["POSTCAST_WATCH_S"] = str(a.watch)
    os.environ["POSTCAST_PUBLIC_METRICS"] = "1" if a.public_metrics else "0"
    token = a.token if a.token is not None else os.environ.get("POSTCAST_TOKEN")
    if token is not None and not token.strip():  # an empty secret would run the service open, silently
        msg = (
            "the bearer token is empty (--token '' or POSTCAST_TOKEN=''): give a secret, or leave both unset "
            "to serve without a token"
        )
        raise ConfigError(msg)
    if token:
        os.environ["POSTCAST_TOKEN"] = token
    log.info(
        "serving the forecasts in %s at http://%s:%d (%s); Ctrl-C stops",
        a.forecasts,
        a.host,
        a.port,
        "token required" if token else "no token: open to anyone who can connect",
    )
    run_server("postcast.serve.app:app_from_env", opts)
    log.info("postcast serve stopped")
    return 0
