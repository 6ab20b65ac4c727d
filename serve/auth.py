"""The service's one plain ASGI middleware (cheap per request): HEAD answered as GET, the bearer
token checked on every path but the open ones, unknown query parameters refused, and the metrics fed
with the route template."""

from __future__ import annotations

import hmac
import json
import time
from typing import Any
from urllib.parse import parse_qsl

from postcast.serve.fast import QUERY
from postcast.serve.metrics import Stats

UNMATCHED = "unmatched"
UNAUTHORIZED = json.dumps({"detail": "missing or wrong bearer token"}).encode()


class Gate:
    """Plain ASGI middleware: HEAD answered as GET (the server drops the body), the bearer token
    checked on every path but the open ones, unknown query parameters refused (a misspelt ``tme=``
    would otherwise silently give the latest forecast), and :class:`Stats` fed with the route template.

    ``routes`` maps each route template to the query parameters it takes (filled once the routes exist)."""

    def __init__(
        self, app: Any, stats: Stats, routes: dict[str, frozenset[str] | None], token: str | None, open_paths: set[str]
    ) -> None:
        self.app, self.stats, self.routes, self.open_paths = app, stats, routes, open_paths
        self.token = token.encode() if token else None

    def _unknown(self, path: str, scope: dict[str, Any]) -> list[str]:
        """The query's parameters ``path`` does not take; the parsed query is left in ``scope`` (QUERY) for
        the route's fast path (postcast.serve.fast), so it is parsed once."""
        allowed, query = self.routes.get(path), scope.get("query_string", b"")
        if not query or allowed is None:
            return []
        pairs = scope[QUERY] = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
        return sorted({k for k, _ in pairs} - allowed)

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        return bearer_ok(next((v for k, v in headers if k == b"authorization"), None), self.token)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0, status, path = time.perf_counter(), 500, scope["path"]
        label = path if path in self.routes else UNMATCHED
        if scope["method"] == "HEAD":
            scope = {**scope, "method": "GET"}  # a copy: the server still knows it is HEAD and sends no body

        async def send_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if self.token is not None and path not in self.open_paths and not self._authorized(scope["headers"]):
                await _problem(send_status, 401, UNAUTHORIZED, [(b"www-authenticate", b"Bearer")])
            elif unknown := self._unknown(path, scope):
                allowed = ", ".join(sorted(self.routes[path] or ())) or "none"
                body = json.dumps(
                    {"detail": f"unknown query parameter(s) {', '.join(unknown)}: {path} takes {allowed}"}
                ).encode()
                await _problem(send_status, 422, body, [])
            else:
                await self.app(scope, receive, send_status)
        finally:
            self.stats.count[(label, status)] += 1
            self.stats.seconds[label] += time.perf_counter() - t0


def bearer_ok(authorization: bytes | None, token: bytes | None) -> bool:
    """Whether an ``Authorization`` header value carries the bearer ``token`` (never when no token is set)."""
    if authorization is None or token is None:
        return False
    scheme, _, cred = authorization.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(cred.strip(), token)


async def _problem(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})
