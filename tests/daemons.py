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
    "running_stack", "spawn", "start_broker", "start_gateway", "start_worker", "tokenizer_fetches",
    "wait_for_edge_tokenizer", "wait_for_worker", "wait_until",
]

EDGE_FETCHED = "texts are tokenized in the gateway from now on"  # gateway/edge.py's log lines
EDGE_NOT_FETCHED = "could not be fetched"
ALL_LINES = 1_000_000


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


def tokenizer_fetches(gateway: Daemon) -> int:
    """The tokenizer fetches the gateway's processes have made (gateway/edge.py): each is a request of the gateway's
    own to a worker, which the broker counts beside the callers'."""
    return sum(EDGE_FETCHED in line or EDGE_NOT_FETCHED in line for line in gateway.log(ALL_LINES).splitlines())


def wait_for_edge_tokenizer(gateway: Daemon, model: str, headers: dict[str, str] | None = None,
                            timeout_s: float = 60) -> None:
    """Send one-text requests for ``model`` until the gateway has fetched its tokenizer (the first starts the
    fetch), so that a test that counts the requests reaching the broker or the model counts its own alone."""
    def fetched() -> bool:
        status, _, body = http_json(f"{gateway.url}/models/{model}", {"inputs": "a request while the tokenizer is "
                                                                                 "fetched"}, headers)
        assert status == 200, body
        return f"model {model}: {EDGE_FETCHED}" in gateway.log(ALL_LINES)

    wait_until(fetched, timeout_s, f"the gateway to fetch the tokenizer of {model}")
