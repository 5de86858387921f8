"""Run the real gateway as a subprocess and talk HTTP to it.

Nothing here fakes the gateway: each test starts ``python -m gateway`` on a
free port through the shared harness (:mod:`zbatch.testing`) and waits for
``/healthz`` (or a given predicate) by polling, never by sleeping.  Every
process is stopped with SIGTERM, and killed if it hangs.
"""

from __future__ import annotations

import http.client
import json
import subprocess
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.daemons import Daemon, free_port, spawn, wait_until

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def error_code(self) -> str:
        """The ``error.code`` of a JSON error, after checking the documented shape (OpenAI's under /v1)."""
        assert self.headers.get("content-type", "").startswith("application/json"), self
        error = self.json()["error"]
        assert set(error) in ({"code", "message"}, {"code", "message", "type", "param"}), error
        assert isinstance(error["message"], str) and error["message"], error
        return str(error["code"])


@dataclass
class Gateway:
    daemon: Daemon
    port: int
    frontend: str

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.daemon.process

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(
        self,
        method: str,
        path: str,
        body: bytes | Iterable[bytes] | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float = 10.0,
    ) -> Response:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        try:
            # An iterable body goes out chunked, with no Content-Length.
            conn.request(method, path, body=body, headers=headers or {})
            raw = conn.getresponse()
            response = Response(raw.status, {k.lower(): v for k, v in raw.getheaders()}, raw.read())
        finally:
            conn.close()
        # No answer may ever leak a traceback, whatever the test checks next.
        assert b"Traceback" not in response.body and b'File "' not in response.body, response
        return response

    def post_json(self, path: str, data: Any, headers: dict[str, str] | None = None) -> Response:
        return self.request(
            "POST",
            path,
            json.dumps(data).encode(),
            {"Content-Type": "application/json", **(headers or {})},
        )

    def log(self) -> str:
        """The whole log (:meth:`Daemon.log` gives only its end)."""
        return self.daemon.log_path.read_text(errors="replace")

    def is_healthy(self) -> bool:
        self.daemon.check()
        try:
            return self.request("GET", "/healthz", timeout_s=1.0).status == 200
        except OSError:
            return False

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit code (a gateway that hangs is killed, and the test fails)."""
        return self.daemon.stop(STOP_TIMEOUT_S)


def spawn_gateway(
    tmp_path: Path, *args: str, port: int | None = None, frontend: str | None = None
) -> Gateway:
    """Start ``python -m gateway`` without waiting; by default its frontend has no listener.

    One gateway process, whatever the host's cores (tests/gateway/test_processes.py starts several).
    """
    port = free_port() if port is None else port
    frontend = frontend or f"tcp://127.0.0.1:{free_port()}"
    daemon = spawn("gateway", f"gateway-{port}", tmp_path, *args, host="127.0.0.1", port=port, frontend=frontend,
                   processes=1)
    return Gateway(daemon, port, frontend)


@pytest.fixture(scope="module")
def start_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Gateway]]:
    """Factory: start a gateway, wait for /healthz, and stop it when the module's tests end."""
    started: list[Gateway] = []

    def start(*args: str, frontend: str | None = None) -> Gateway:
        gateway = spawn_gateway(tmp_path_factory.mktemp("gateway"), *args, frontend=frontend)
        started.append(gateway)
        wait_until(gateway.is_healthy, START_TIMEOUT_S, f"/healthz of {gateway.url}", gateway.log)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()
