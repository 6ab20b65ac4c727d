"""The service tests' HTTP calls: httpx with a ceiling for a busy machine, not httpx's default 5 s read
timeout (a first point query, which opens the forecast file, failed with ReadTimeout at load 11 on the 2-core
machine). The ceiling is for a hang; a healthy answer comes in milliseconds."""

from __future__ import annotations

from typing import Any

import httpx

HANG_CEILING_S = 300.0


def get(url: str, **kwargs: Any) -> httpx.Response:
    """httpx.get with the hang ceiling unless the caller gives its own ``timeout`` (a poll of a starting server)."""
    return httpx.get(url, **{"timeout": HANG_CEILING_S, **kwargs})


def post(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(url, **{"timeout": HANG_CEILING_S, **kwargs})
