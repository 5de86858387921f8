"""API keys, input limits, the in-flight limit and error hygiene, against the real gateway process.

Key and limit checks come before the broker is reached, so most tests need no broker: a request
that passes them gets ``broker_unavailable``.  The in-flight test holds requests in a real
broker that has no worker; the server-error test answers from a hand-written broker socket.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from tests.daemons import Daemon, broker_stats, free_port, start_broker, wait_until
from tests.gateway.conftest import Gateway, Response, spawn_gateway
from zbatch.protocol import payloads, wire
from zbatch.protocol.wire import Reply, Status

KEYS = ["first-key-0123456789", "second-key-abcdefghij"]
KEYS_FILE = "# zbatch API keys\n\n{0}\n   {1}   \n# retired-key\n"
PROTECTED = [("GET", "/models"), ("GET", "/v1/stats"), ("GET", "/readyz"), ("GET", "/openapi.json"),
             ("GET", "/no-such-page"), ("POST", "/models/m"), ("POST", "/v1/embeddings"), ("POST", "/")]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def call(gateway: Gateway, method: str, path: str, headers: dict[str, str] | None = None) -> Response:
    if path == "/":
        return gateway.request(method, path, b"hello", {"Content-Type": "text/plain", **(headers or {})})
    if method == "POST":
        body = {"model": "m", "input": "hello"} if path == "/v1/embeddings" else {"inputs": "hello"}
        return gateway.post_json(path, body, headers)
    return gateway.request(method, path, headers=headers)


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "api-keys"
    path.write_text(KEYS_FILE.format(*KEYS))
    return path


@pytest.fixture(scope="module")
def locked(start_gateway: Callable[..., Gateway], keys_file: Path) -> Gateway:
    return start_gateway("--api-keys-file", str(keys_file))


@pytest.mark.parametrize(("method", "path"), PROTECTED)
def test_every_endpoint_but_healthz_needs_a_key(locked: Gateway, method: str, path: str) -> None:
    for headers in ({}, bearer("wrong-key"), bearer(KEYS[0][:-1]), bearer("# retired-key"),
                    {"Authorization": f"Basic {KEYS[0]}"}, {"Authorization": "Bearer"}):
        response = call(locked, method, path, headers)
        assert response.status == 401, (headers, response)
        assert response.error_code() == "unauthorized"
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert "x-request-id" in response.headers


@pytest.mark.parametrize("key", KEYS)
def test_each_listed_key_opens_the_gateway(locked: Gateway, key: str) -> None:
    for method, path in PROTECTED:
        response = call(locked, method, path, bearer(key))
        expected = {"/openapi.json": 200, "/no-such-page": 404}.get(path, 503)
        assert response.status == expected, (path, response)
    assert call(locked, "GET", "/models", {"Authorization": f"bearer   {key}"}).error_code() == "broker_unavailable"


def test_healthz_and_by_default_metrics_stay_open(locked: Gateway) -> None:
    assert locked.request("GET", "/healthz").status == 200
    assert locked.request("GET", "/metrics").status == 200


def test_protect_metrics_puts_metrics_behind_the_keys(
    start_gateway: Callable[..., Gateway], keys_file: Path
) -> None:
    gateway = start_gateway("--api-keys-file", str(keys_file), "--protect-metrics")
    assert gateway.request("GET", "/metrics").status == 401
    assert gateway.request("GET", "/metrics", headers=bearer(KEYS[1])).status == 200
    assert gateway.request("GET", "/healthz").status == 200


@pytest.mark.parametrize(("content", "complaint"), [(None, "cannot read the API keys"),
                                                    ("# only a comment\n\n", "holds no API key")])
def test_a_bad_keys_file_stops_the_gateway_at_start(tmp_path: Path, content: str | None, complaint: str) -> None:
    path = tmp_path / "keys"
    if content is not None:
        path.write_text(content)
    gateway = spawn_gateway(tmp_path, "--api-keys-file", str(path))
    assert gateway.process.wait(20) == 2
    assert "--api-keys-file" in gateway.log() and complaint in gateway.log()


@pytest.fixture(scope="module")
def limited(start_gateway: Callable[..., Gateway]) -> Gateway:
    return start_gateway("--max-inputs", "3", "--max-input-chars", "10")


@pytest.mark.parametrize(("path", "body"), [("/models/m", {"inputs": ["a", "b", "c", "d"]}),
                                            ("/v1/embeddings", {"model": "m", "input": ["a"] * 4})])
def test_too_many_inputs(limited: Gateway, path: str, body: dict[str, object]) -> None:
    response = limited.post_json(path, body)
    assert (response.status, response.error_code()) == (413, "too_many_inputs")
    assert "limit is 3" in response.json()["error"]["message"]
    fewer = {key: value[:3] if isinstance(value, list) else value for key, value in body.items()}
    assert limited.post_json(path, fewer).error_code() == "broker_unavailable"


def test_too_long_an_input(limited: Gateway) -> None:
    for response in (limited.post_json("/models/m", {"inputs": ["short", "x" * 11]}),
                     limited.post_json("/v1/embeddings", {"model": "m", "input": "x" * 11}),
                     limited.request("POST", "/", ("é" * 11).encode(), {"Content-Type": "text/plain"})):
        assert (response.status, response.error_code()) == (400, "input_too_long")
    assert limited.post_json("/models/m", {"inputs": "é" * 10}).error_code() == "broker_unavailable"


def test_default_limits(start_gateway: Callable[..., Gateway]) -> None:
    gateway = start_gateway()
    assert gateway.post_json("/models/m", {"inputs": ["x"] * 257}).error_code() == "too_many_inputs"
    assert gateway.post_json("/models/m", {"inputs": ["x"] * 256}).error_code() == "broker_unavailable"
    assert gateway.post_json("/models/m", {"inputs": "x" * 100_001}).error_code() == "input_too_long"
    assert gateway.post_json("/models/m", {"inputs": "x" * 100_000}).error_code() == "broker_unavailable"


@pytest.fixture
def waiting_broker(tmp_path: Path) -> Iterator[Daemon]:
    """A broker that holds requests for ``m``: the model is known, no worker ever comes."""
    broker = start_broker(tmp_path, models=("m",), no_worker_grace_ms=60_000)
    yield broker
    broker.stop()


def test_requests_over_max_connections_are_shed_with_retry_after(
    start_gateway: Callable[..., Gateway], waiting_broker: Daemon
) -> None:
    gateway = start_gateway("--max-connections", "2", frontend=waiting_broker.frontend)
    held: list[Response] = []
    slow = {"X-Request-Timeout-Ms": "5000"}
    threads = [threading.Thread(target=lambda: held.append(gateway.post_json("/models/m", {"inputs": "x"}, slow)))
               for _ in range(2)]
    for thread in threads:
        thread.start()

    def backlog() -> int:
        stats = broker_stats(waiting_broker.frontend) or {"models": {}}
        return int(stats["models"].get("m", {}).get("backlog_items", 0))

    wait_until(lambda: backlog() == 2, 10, "two requests to wait in the broker", waiting_broker.log)
    shed = gateway.post_json("/models/m", {"inputs": "x"})
    assert (shed.status, shed.error_code(), shed.headers["retry-after"]) == (503, "overloaded", "1")
    assert gateway.request("GET", "/models").error_code() == "overloaded"
    assert gateway.request("GET", "/healthz").status == 200
    assert gateway.request("GET", "/metrics").status == 200
    for thread in threads:
        thread.join(20)
    assert [r.error_code() for r in held] == ["deadline_exceeded"] * 2
    assert gateway.request("GET", "/models").status == 200  # the slots are free again


class JunkBroker:
    """A broker socket that answers every request "ok" with a payload no embedding can be made of."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]]) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self._socket = context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(self.endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        junk = payloads.encode_payload({"outputs": ["not a number"]})
        while not self._stop.is_set():
            if not self._socket.poll(50):
                continue
            identity, *frames = self._socket.recv_multipart()
            request_id = wire.request_id_of(frames) or b"?"
            self._socket.send_multipart([identity, *wire.encode_reply(Reply(request_id, Status.OK, "", junk))])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._socket.close()


def test_a_server_error_shows_no_internals_and_is_logged_with_its_request_id(
    start_gateway: Callable[..., Gateway],
) -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    broker = JunkBroker(context)
    try:
        gateway = start_gateway("--log-format", "json", frontend=broker.endpoint)
        body = {"model": "m", "input": "x", "encoding_format": "base64"}
        response = gateway.post_json("/v1/embeddings", body, {"X-Request-ID": "boom-42"})
        assert (response.status, response.error_code()) == (500, "internal_error")
        for leak in (b"ValueError", b"Traceback", b"site-packages", b".py", str(Path.cwd()).encode()):
            assert leak not in response.body, response

        def logged() -> bool:
            entries = [json.loads(line) for line in gateway.log().splitlines() if line.startswith("{")]
            return any(entry["message"] == "unexpected error answering POST /v1/embeddings"
                       and entry.get("request_id") == "boom-42" and "ValueError" in entry.get("exception", "")
                       for entry in entries)

        wait_until(logged, 10, "the error in the gateway log, with its request id", gateway.log)
    finally:
        broker.close()
        context.term()


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
    b"POST /models/m HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"POST /models/m HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET /%00%ff/../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n",
])
def test_malformed_http_gets_a_plain_refusal(locked: Gateway, raw: bytes) -> None:
    with socket.create_connection(("127.0.0.1", locked.port), timeout=10) as conn:
        conn.sendall(raw)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and len(answer) > answer.index(b"\r\n\r\n") + 4:
                break
    status = int(answer.split(b" ", 2)[1])
    assert 400 <= status < 500, answer
    for leak in (b"Traceback", b"site-packages", b'File "', str(Path.cwd()).encode()):
        assert leak not in answer, answer
    assert locked.is_healthy()

