"""KServe v2 over gRPC, with tritonclient.grpc and raw grpc channels, against a real stack (issue 35, point 2).

One broker; one worker with the default model; a gateway with a gRPC port
(a short body timeout, so that streams that never send their message end
soon), and a second one with API keys and room for one request at a time.
tritonclient.grpc asks what its users ask (ready, metadata, infer with BYTES
in and FP32 out, a deadline, a cancel); hostile callers (malformed protobuf,
wrong datatypes, a message over the limit, a client holding 1,000 streams)
each get a clear status while normal traffic is answered in full.  This
process never imports the gateway's own stubs: tritonclient's register the
same protobuf package.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import grpc
import numpy as np
import pytest

from tests.daemons import (
    Daemons,
    broker_stats,
    free_port,
    http_json,
    start_broker,
    start_gateway,
    start_worker,
    wait_until,
)
from worker.runners import DEFAULT_MODEL_NAME, default_model_path
from zbatch.testing import start_http

MODEL = DEFAULT_MODEL_NAME
INFER = "/inference.GRPCInferenceService/ModelInfer"
KEY = "grpc-test-key"
BODY_TIMEOUT_MS = 2000
BUSY_TEXT = "a long text to keep the model busy for a while " * 24


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemons]:
    logs = tmp_path_factory.mktemp("logs")
    keys = logs / "keys"
    keys.write_text(f"# the gateway's keys\n{KEY}\n")
    with Daemons(logs) as daemons:
        broker = daemons.add(start_broker(logs))
        daemons.add(start_worker(broker, logs, "w1", workers=1))
        for name, settings in (("gateway", {"body_timeout_ms": BODY_TIMEOUT_MS}),
                               ("gateway-keys", {"api_keys_file": str(keys), "max_connections": 1})):
            port = free_port()
            gateway = daemons.add(start_http("gateway", name, logs, frontend=broker.frontend, processes=1,
                                             grpc_port=port, **settings))
            gateway.endpoints["grpc"] = f"127.0.0.1:{port}"
        yield daemons


@pytest.fixture(scope="module")
def target(stack: Daemons) -> str:
    return stack["gateway"].endpoints["grpc"]


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return np.asarray(SentenceTransformer(default_model_path(), device="cpu").encode(
        ["hello world", "ZeroMQ sockets carry messages."], normalize_embeddings=True))


def texts_input(texts: list[str], shape: list[int] | None = None) -> Any:
    import tritonclient.grpc as triton

    value = triton.InferInput("text", shape or [len(texts)], "BYTES")
    value.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_).reshape(shape or [-1]))
    return value


def cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def error_of(call: Any) -> Any:
    """The InferenceServerException ``call()`` raises (it must raise one)."""
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as raised:
        call()
    return raised.value


# ------------------------------------------------------------------ what tritonclient's users do


def hold_the_worker(stack: Daemons) -> tuple[threading.Thread, dict[str, Any]]:
    """Start a 32-text request (over HTTP) that keeps the one worker busy, once it is dispatched; the broker's
    counts for the model before it.  The worker reports its counts with its heartbeats: these tests run first,
    and each waits for its own counts, so the counts before are complete."""
    before = (broker_stats(stack["broker"].frontend) or {"models": {}})["models"].get(MODEL, {})
    answers: queue.Queue[int] = queue.Queue()
    busy = threading.Thread(target=lambda: answers.put(http_json(f"{stack['gateway'].url}/models/{MODEL}",
                                                                 {"inputs": [BUSY_TEXT] * 32})[0]))
    busy.start()

    wait_until(lambda: items_at_broker(stack) >= 32, 30, "the 32-text request to reach the worker")
    return busy, before


def items_at_broker(stack: Daemons) -> int:
    """The model's items waiting at the broker or in flight at the worker."""
    model = (broker_stats(stack["broker"].frontend) or {"models": {}})["models"].get(MODEL, {})
    return int(model.get("backlog_items", 0) + model.get("in_flight_items", 0))


def counts(stack: Daemons, before: dict[str, Any]) -> dict[str, int] | None:
    """Since ``before``: the items the model ran, and those that did not run (cancelled or expired at the worker,
    answered deadline_exceeded by the broker); None until the 32-text batch and one skipped item are reported."""
    model = (broker_stats(stack["broker"].frontend) or {"models": {}})["models"].get(MODEL, {})

    def since(key: str) -> int:
        return int(model.get(key, 0) - before.get(key, 0))

    deadlines = model.get("requests", {}).get("deadline_exceeded", 0) - before.get("requests", {}).get(
        "deadline_exceeded", 0)
    skipped = since("cancelled_items") + since("expired_items") + deadlines
    ran = since("batched_items")
    return {"ran": ran, "skipped": skipped} if ran >= 32 and skipped >= 1 else None


def test_a_grpc_deadline_is_the_requests_and_what_it_missed_never_runs(stack: Daemons, target: str) -> None:
    import tritonclient.grpc as triton

    busy, before = hold_the_worker(stack)
    late = error_of(lambda: triton.InferenceServerClient(target).infer(MODEL, [texts_input(["too late"])],
                                                                       client_timeout=0.3))
    assert late.status() == "StatusCode.DEADLINE_EXCEEDED"
    busy.join(60)
    since = wait_until(lambda: counts(stack, before), 15, "the late request to be skipped")
    assert since["ran"] == 32  # the late request never reached the model


def test_a_cancelled_call_is_cancelled_at_the_broker(stack: Daemons, target: str) -> None:
    import tritonclient.grpc as triton

    busy, before = hold_the_worker(stack)
    done: queue.Queue[Any] = queue.Queue()
    context = triton.InferenceServerClient(target).async_infer(
        MODEL, [texts_input(["nobody waits for this"])], callback=lambda result, error: done.put(error))
    wait_until(lambda: items_at_broker(stack) >= 33, 15, "the request to reach the broker")
    context.cancel()
    error = done.get(timeout=30)
    assert error is not None and "CANCELLED" in str(error.status())
    busy.join(60)
    since = wait_until(lambda: counts(stack, before), 15, "the cancelled request to be skipped")
    assert since["ran"] == 32


def test_tritonclient_health_metadata_and_infer(target: str, reference: np.ndarray) -> None:
    import tritonclient.grpc as triton

    client = triton.InferenceServerClient(target)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL) and not client.is_model_ready("no-such-model")
    assert client.get_server_metadata().name == "zbatch"
    metadata = client.get_model_metadata(MODEL, as_json=True)
    assert metadata["platform"] == "zbatch/embeddings"
    assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1"]}]
    assert metadata["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": ["-1", "384"]}]
    result = client.infer(MODEL, [texts_input(["hello world", "ZeroMQ sockets carry messages."], [2, 1])],
                          request_id="mine", headers={"x-priority": "high"})
    vectors = result.as_numpy("embedding")
    assert vectors.dtype == np.float32 and vectors.shape == (2, 384)
    assert min(cosine(v, r) for v, r in zip(vectors, reference, strict=True)) >= 0.99999
    assert result.get_response().id == "mine" and result.get_response().model_version == "1"
    asked = client.infer(MODEL, [texts_input(["hello world"])], outputs=[triton.InferRequestedOutput("embedding")])
    assert cosine(asked.as_numpy("embedding")[0], reference[0]) >= 0.99999
    halved = client.infer(MODEL, [texts_input(["hello world"])], parameters={"precision": "float16"})
    assert halved.as_numpy("embedding").dtype == np.float16, "FP16 in raw_output_contents: half the bytes"
    assert cosine(halved.as_numpy("embedding")[0].astype(np.float32), reference[0]) >= 0.9999
    unknown = error_of(lambda: client.get_model_metadata("no-such-model"))
    assert unknown.status() == "StatusCode.NOT_FOUND" and "no-such-model" in unknown.message()
    assert error_of(lambda: client.infer("no-such-model", [texts_input(["x"])])).status() == "StatusCode.NOT_FOUND"


def test_api_keys_come_in_the_authorization_metadata(stack: Daemons) -> None:
    import tritonclient.grpc as triton

    client = triton.InferenceServerClient(stack["gateway-keys"].endpoints["grpc"])
    assert client.is_server_live()  # liveness needs no key, as /healthz
    refused = error_of(lambda: client.infer(MODEL, [texts_input(["x"])]))
    assert refused.status() == "StatusCode.UNAUTHENTICATED" and "authorization" in refused.message()
    wrong = error_of(lambda: client.is_server_ready(headers={"authorization": "Bearer nope"}))
    assert wrong.status() == "StatusCode.UNAUTHENTICATED"
    with_key = {"authorization": f"Bearer {KEY}"}
    assert client.is_server_ready(headers=with_key)
    assert client.infer(MODEL, [texts_input(["x"])], headers=with_key).as_numpy("embedding").shape == (1, 384)


def test_overload_is_resource_exhausted_with_when_to_retry(stack: Daemons) -> None:
    """The keyed gateway answers one request at a time: a second, while the first runs, is refused."""
    gateway = stack["gateway-keys"]
    answers: queue.Queue[int] = queue.Queue()
    busy = threading.Thread(target=lambda: answers.put(http_json(
        f"{gateway.url}/models/{MODEL}", {"inputs": [BUSY_TEXT] * 32},
        headers={"Authorization": f"Bearer {KEY}"})[0]))
    busy.start()

    def in_flight() -> bool:
        _, _, metrics = http_text(f"{gateway.url}/metrics")
        return "zbatch_gateway_requests_in_flight 1.0" in metrics

    wait_until(in_flight, 30, "the keyed gateway's one slot to be taken")
    with grpc.insecure_channel(gateway.endpoints["grpc"]) as channel:
        call = raw(channel, INFER)
        with pytest.raises(grpc.RpcError) as refused:
            call(infer_request(["x"]), metadata=(("authorization", f"Bearer {KEY}"),), timeout=30)
    error: Any = refused.value
    trailing = dict(error.trailing_metadata())
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and "1 requests already" in error.details()
    assert (trailing["retry-after"], trailing["grpc-retry-pushback-ms"]) == ("1", "1000")
    busy.join(60)
    assert answers.get() == 200


def http_text(url: str) -> tuple[int, dict[str, str], str]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, dict(response.headers), response.read().decode()


# ------------------------------------------------------------------ hostile callers


def raw(channel: grpc.Channel, method: str) -> Any:
    """A method of the service, called with the message's bytes as they are (no stubs)."""
    return channel.unary_unary(method)


def infer_request(texts: list[str], datatype: str = "BYTES", model: str = MODEL) -> bytes:
    """A ModelInferRequest, serialized with tritonclient's own stubs (the same wire format)."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="text", datatype=datatype, shape=[len(texts)])
    tensor.contents.bytes_contents.extend(t.encode() for t in texts)
    return bytes(request.SerializeToString())


@pytest.mark.parametrize(("message", "code", "says"), [
    (b"\xff\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT, "malformed protobuf"),
    (b"\x0a\x05hello\x2a\x03", grpc.StatusCode.INVALID_ARGUMENT, "malformed protobuf"),
    (b"", grpc.StatusCode.INVALID_ARGUMENT, "model_name"),
    (infer_request(["x"], "FP32"), grpc.StatusCode.INVALID_ARGUMENT, "inputs are BYTES"),
    (infer_request([]), grpc.StatusCode.INVALID_ARGUMENT, "empty"),
    (infer_request(["x"], model="no-such-model"), grpc.StatusCode.NOT_FOUND, "no-such-model"),
    (infer_request(["x" * 200_000]), grpc.StatusCode.INVALID_ARGUMENT, "100000"),
    (infer_request(["x"] * 257), grpc.StatusCode.INVALID_ARGUMENT, "the limit is 256"),
    (infer_request(["x" * 600_000, "y" * 600_000]), grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
])
def test_a_hostile_message_gets_a_clear_status(target: str, message: bytes, code: grpc.StatusCode,
                                               says: str) -> None:
    with grpc.insecure_channel(target) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            raw(channel, INFER)(message, timeout=30)
    error: Any = raised.value
    assert error.code() is code and says in error.details(), (error.code(), error.details())


def test_the_other_methods_refuse_malformed_protobuf(target: str) -> None:
    with grpc.insecure_channel(target) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            raw(channel, "/inference.GRPCInferenceService/ModelMetadata")(b"\xff\xff", timeout=10)
        error: Any = raised.value
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and "ModelMetadataRequest" in error.details()
        with pytest.raises(grpc.RpcError) as unknown:
            raw(channel, "/inference.GRPCInferenceService/ModelStreamInfer")(b"", timeout=10)
        assert cast(Any, unknown.value).code() is grpc.StatusCode.UNIMPLEMENTED


def test_a_client_holding_1000_streams_leaves_normal_traffic_answered(stack: Daemons, target: str) -> None:
    """1,000 calls that never send their message, on one connection: each ends after the body timeout with
    DEADLINE_EXCEEDED, while 48 normal calls on other connections are all answered, and nothing dies."""
    import tritonclient.grpc as triton

    async def hostile() -> list[grpc.StatusCode]:
        never = asyncio.Event()

        async def nothing() -> Any:
            await never.wait()
            yield b""

        async with grpc.aio.insecure_channel(target) as channel:
            method: Any = channel.stream_unary(INFER)
            calls = [method(nothing(), timeout=60) for _ in range(1000)]
            results = await asyncio.gather(*calls, return_exceptions=True)
        return [result.code() if isinstance(result, grpc.aio.AioRpcError) else grpc.StatusCode.OK
                for result in results]

    def normal(index: int) -> int:
        client = triton.InferenceServerClient(target)
        return int(client.infer(MODEL, [texts_input([f"normal traffic {index}"])]).as_numpy("embedding").shape[1])

    with ThreadPoolExecutor(1) as attacker:
        codes = attacker.submit(asyncio.run, hostile())
        with ThreadPoolExecutor(8) as pool:
            answered = list(pool.map(normal, range(48)))
        outcomes = codes.result(timeout=120)
    assert answered == [384] * 48
    assert outcomes == [grpc.StatusCode.DEADLINE_EXCEEDED] * 1000
    for daemon in stack.values():
        daemon.check()
    assert triton.InferenceServerClient(target).is_server_ready()


def test_same_text_same_vector_over_grpc_and_http(stack: Daemons, target: str, reference: np.ndarray) -> None:
    import tritonclient.grpc as triton

    url = stack["gateway"].url
    grpc_vector = triton.InferenceServerClient(target).infer(
        MODEL, [texts_input(["ZeroMQ sockets carry messages."])]).as_numpy("embedding")[0]
    _, _, http_vector = http_json(f"{url}/embed", {"inputs": "ZeroMQ sockets carry messages."})
    assert cosine(grpc_vector, http_vector[0]) >= 0.99999 and cosine(grpc_vector, reference[1]) >= 0.99999


def test_the_service_listens_in_each_gateway_process(tmp_path: Path) -> None:
    """With --processes 2, both processes serve gRPC on the one port (SO_REUSEPORT)."""
    import tritonclient.grpc as triton

    with Daemons(tmp_path) as daemons:
        broker = daemons.add(start_broker(tmp_path))
        port = free_port()
        gateway = daemons.add(start_gateway(broker, tmp_path, processes=2, grpc_port=port))
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        assert wait_until(client.is_server_live, 30, "gRPC to answer")
        log = wait_until(lambda: gateway.log_path.read_text().count("serving KServe v2 gRPC") >= 2 or None, 30,
                         "both processes to serve gRPC", gateway.log)
        assert log
