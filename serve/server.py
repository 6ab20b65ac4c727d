"""How ``postcast serve`` runs uvicorn: validated options and one set of server settings, shared by the
service and by the load benchmark's framework baseline (so both are measured on the same setup).

Connection hygiene (see docs/serve.md):

* ``timeout_keep_alive``: an idle keep-alive connection is closed after that many seconds (uvicorn);
* ``limit_concurrency``: beyond that many connections plus tasks, uvicorn answers 503;
* a **header deadline**: uvicorn has no timeout for a request's headers (uvicorn issue #157), so a
  client that connects and sends nothing, or trickles header bytes, would hold its connection
  forever. :class:`DeadlineHttpToolsProtocol` closes a connection whose next request's headers are
  not complete within ``header_timeout`` seconds of the connection (or of the previous response);
* **idle shedding**: the header deadline alone does not stop holders that reconnect at once, and
  ``limit_concurrency`` counts idle connections, so a thousand of them made every real request
  answer 503. Once the open connections exceed :data:`SHED_AT` of the limit, each new connection
  closes the connections that have waited longest for a request's headers (idle holders, idle
  keep-alives), oldest first; a client that sends its request promptly is never shed;
* h11-style size limits: httptools rejects over-long request lines and headers itself (400).
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from postcast.datasets.core.errors import ConfigError

HEADER_TIMEOUT_ENV = "POSTCAST_HEADER_TIMEOUT"
SHED_AT = 0.8  # fraction of --limit-concurrency above which idle connections are shed, oldest first


@dataclass(frozen=True)
class ServeOptions:
    """The server's options, checked on construction (a ``ConfigError`` names the bad value)."""

    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    header_timeout: float = 10.0  # seconds to send a request's headers
    keep_alive_timeout: int = 5  # seconds an idle keep-alive connection is kept
    limit_concurrency: int = 1000  # connections + tasks before uvicorn answers 503
    access_log: bool = True  # one line per request on stderr (client, method, path, status)

    def __post_init__(self) -> None:
        checks = [
            (1 <= self.port <= 65535, f"--port {self.port}: give a TCP port between 1 and 65535"),
            (1 <= self.workers <= 64, f"--workers {self.workers}: give 1 to 64 worker processes"),
            (
                0.0 < self.header_timeout <= 3600.0,
                f"--header-timeout {self.header_timeout}: give seconds in (0, 3600], e.g. 10",
            ),
            (
                1 <= self.keep_alive_timeout <= 3600,
                f"--keep-alive-timeout {self.keep_alive_timeout}: give whole seconds in [1, 3600], e.g. 5",
            ),
            (
                1 <= self.limit_concurrency <= 100_000,
                f"--limit-concurrency {self.limit_concurrency}: give 1 to 100000 connections, e.g. 1000",
            ),
            (bool(self.host.strip()), "--host is empty: give an address, e.g. 127.0.0.1"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)


class DeadlineHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a deadline for each request's headers (see the module docstring).

    The deadline is armed when the connection opens and after each response (when no further
    request is already parsed), and disarmed once a request's headers are complete; a response
    that takes long is never cut."""

    _deadline: asyncio.TimerHandle | None = None
    # this process's connections waiting for a request's headers, longest-waiting first, and those
    # closed by shedding whose connection_lost has not run yet (still in uvicorn's connection set)
    _waiting: ClassVar[OrderedDict[DeadlineHttpToolsProtocol, None]] = OrderedDict()
    _closing: ClassVar[set[DeadlineHttpToolsProtocol]] = set()

    @staticmethod
    def header_timeout() -> float:
        return float(os.environ.get(HEADER_TIMEOUT_ENV, "10"))

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()
        self._shed()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._closing.discard(self)
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout(), self._expire)
        self._waiting[self] = None

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._waiting.pop(self, None)

    def _expire(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.close()
            self._closing.add(self)

    def _shed(self) -> None:
        """Close the longest-waiting idle connections while more than SHED_AT of the limit are open."""
        if self.limit_concurrency is None:
            return
        room = int(self.limit_concurrency * SHED_AT)
        while len(self.connections) - len(self._closing) > room and self._waiting:
            oldest = next(iter(self._waiting))
            if oldest is self:  # only this new connection waits: nothing older to shed
                break
            oldest._expire()


def uvicorn_kwargs(opts: ServeOptions) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.run`` for these options (the one server setup)."""
    os.environ[HEADER_TIMEOUT_ENV] = str(opts.header_timeout)  # read by the protocol, in every worker
    return {
        "host": opts.host,
        "port": opts.port,
        "workers": opts.workers,
        "http": DeadlineHttpToolsProtocol,
        "loop": "uvloop",
        "timeout_keep_alive": opts.keep_alive_timeout,
        "limit_concurrency": opts.limit_concurrency,
        "log_level": "info",
        "access_log": opts.access_log,
    }


class _Terminated(Exception):
    """SIGTERM arrived (uvicorn re-raises it after its graceful shutdown)."""


def _terminated(signum: int, frame: Any) -> None:
    raise _Terminated


def run(app: str, opts: ServeOptions) -> None:
    """Run the ASGI application factory ``app`` (``module:function``) with uvicorn until stopped. SIGTERM
    (a service manager's stop) ends it normally once uvicorn has shut down gracefully: uvicorn re-raises
    the signal afterwards, which would otherwise kill the process before it can say it stopped."""
    import signal

    import uvicorn

    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        uvicorn.run(app, factory=True, **uvicorn_kwargs(opts))
    except _Terminated:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
