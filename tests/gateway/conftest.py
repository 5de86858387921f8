"""Run the real gateway as a subprocess and talk HTTP to it.

Nothing here fakes the gateway: each test starts ``python -m gateway`` on a
free port and waits for ``/healthz`` (or a given predicate) by polling, never
by sleeping.  Every process is stopped with SIGTERM, and killed if it hangs.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.daemons import free_port, wait_until

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
        """The ``error.code`` of a JSON error, after checking the documented shape."""
        assert self.headers.get("content-type", "").startswith("application/json"), self
        error = self.json()["error"]
        assert set(error) == {"code", "message"}, error
        assert isinstance(error["message"], str) and error["message"], error
        return str(error["code"])


@dataclass
class Gateway:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    frontend: str

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
        return self.log_path.read_text(errors="replace")

    def is_healthy(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"gateway exited with {self.process.returncode}:\n{self.log()}")
        try:
            return self.request("GET", "/healthz", timeout_s=1.0).status == 200
        except OSError:
            return False

    def stop(self) -> int:
        """SIGTERM and wait, killing the process if it hangs; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def spawn_gateway(
    tmp_path: Path, *args: str, port: int | None = None, frontend: str | None = None
) -> Gateway:
    """Start ``python -m gateway`` without waiting; by default its frontend has no listener."""
    port = free_port() if port is None else port
    frontend = frontend or f"tcp://127.0.0.1:{free_port()}"
    log_path = tmp_path / f"gateway-{port}.log"
    command = [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--frontend", frontend, *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZBATCH_")}
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
    return Gateway(process, port, log_path, frontend)


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
