"""The test suite's view of :mod:`zbatch.testing` (real daemons on free loopback ports), plus an HTTP helper.

The harness lives in the library so that the benchmarks and users' own
integration tests start daemons exactly as these tests do; it is re-exported
here so a test needs one import line.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from zbatch.testing import (
    ROOT,
    Daemon,
    DaemonFailure,
    Daemons,
    broker_stats,
    free_port,
    http_status,
    running_stack,
    spawn,
    start_broker,
    start_gateway,
    start_worker,
    wait_for_worker,
    wait_until,
)

__all__ = [
    "ROOT", "Daemon", "DaemonFailure", "Daemons", "broker_stats", "free_port", "http_json", "http_status",
    "running_stack", "spawn", "start_broker", "start_gateway", "start_worker", "wait_for_worker", "wait_until",
]


def http_json(url: str, body: Any = None, headers: dict[str, str] | None = None,
              data: bytes | None = None, method: str | None = None) -> tuple[int, dict[str, str], Any]:
    """One HTTP request; returns status, headers and the decoded JSON body."""
    if body is not None:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} | (headers or {})
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())
