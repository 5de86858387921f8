"""The dialects in process, against a stand-in broker: their error shapes and statuses, wrong tasks, hostile input.

Every hostile request must get a 4xx in its dialect's shape that says what
was wrong, never a 500; the real stack repeats a few of these under load
(tests/e2e/test_dialects.py).
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest

from gateway.dialects.kserve import encode_answer
from gateway.tensors import OutputTensor
from tests.gateway.inprocess import CONFIG, Answer, StubClient, call, sparse, vectors
from zbatch.client import NoWorker, Overloaded, WorkerError

JSON = {"Content-Type": "application/json"}
TRITON = "Inference-Header-Content-Length"


def post(stub: StubClient, path: str, body: bytes, headers: dict[str, str] | None = None) -> Answer:
    return call(stub, "POST", path, body=body, headers=JSON if headers is None else headers)


def task_models(**tasks: str) -> dict[str, dict[str, Any]]:
    """STATS figures: each model with one worker and its task."""
    return {name: {"workers": 1, "info": {"task": task, "max_batch_size": 8}} for name, task in tasks.items()}


def binary_bytes(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def triton_body(items: bytes, shape: list[int], size: int | None = None, name: str = "text") -> tuple[bytes, str]:
    """A binary-form request with one BYTES input, and its JSON part's length."""
    header = (b'{"inputs":[{"name":"%s","datatype":"BYTES","shape":%s,"parameters":{"binary_data_size":%d}}]}'
              % (name.encode(), str(shape).encode(), len(items) if size is None else size))
    return header + items, str(len(header))


# ------------------------------------------------------------------ error shapes


def test_each_dialect_answers_errors_in_its_own_shape() -> None:
    openai = post(StubClient(), "/v1/embeddings", b"{not json")
    assert openai.status == 400 and set(openai.body["error"]) == {"message", "type", "param", "code"}
    assert openai.body["error"]["type"] == "invalid_request_error"
    tei = post(StubClient(), "/embed", b"{not json")
    assert tei.status == 422 and tei.body == {"error": "the body is not valid JSON", "error_type": "Validation"}
    kserve = post(StubClient(), "/v2/models/m/infer", b"{not json")
    assert kserve.status == 400 and kserve.body == {"error": "the body is not valid JSON"}
    ours = post(StubClient(), "/models/m", b"{not json")
    assert ours.body == {"error": {"code": "bad_request", "message": "the body is not valid JSON"}}
    assert call(StubClient(), "GET", "/v2/nowhere").body == {"error": "no endpoint at /v2/nowhere"}
    assert call(StubClient(), "GET", "/embed").body["error_type"] == "Validation"
    assert call(StubClient(), "GET", "/v1/models/nope").body["error"]["code"] == "unknown_model"


@pytest.mark.parametrize(("error", "status", "kind"), [
    (Overloaded("full", retry_after_ms=1000), 429, "Overloaded"),
    (NoWorker("none"), 503, "Unhealthy"),
    (WorkerError("boom"), 424, "Backend"),
])
def test_tei_answers_broker_errors_with_teis_statuses(error: Exception, status: int, kind: str) -> None:
    answer = post(StubClient(error), "/embed", b'{"inputs": "x"}')
    assert (answer.status, answer.body["error_type"]) == (status, kind)
    assert ("Retry-After" in answer.headers) == (kind == "Overloaded")


def test_openai_overload_keeps_the_status_the_sdk_retries() -> None:
    answer = post(StubClient(Overloaded("full", retry_after_ms=2000)), "/v1/embeddings",
                  b'{"model": "m", "input": "x"}')
    assert answer.status == 503 and answer.headers["Retry-After"] == "2"
    assert answer.body["error"]["type"] == "server_error" and answer.body["error"]["code"] == "overloaded"


# ------------------------------------------------------------------ wrong tasks


def test_a_route_refuses_a_model_of_another_task_naming_those_that_answer_it() -> None:
    stub = StubClient(models=task_models(**{CONFIG.default_model: "rerank", "vit": "image-classification"}))
    embed = post(stub, "/embed", b'{"inputs": "x"}')
    assert embed.status == 424 and embed.body["error_type"] == "Backend"
    assert "/embed needs a embeddings model" in embed.body["error"] and "/rerank" in embed.body["error"]
    assert "ZBATCH_TEI_MODEL" in embed.body["error"]
    openai = post(stub, "/v1/embeddings", b'{"model": "vit", "input": "x"}')
    assert openai.status == 400 and openai.body["error"]["code"] == "wrong_task"
    tokenize = post(stub, "/tokenize", b'{"inputs": "x"}', JSON)
    assert tokenize.status == 200  # a rerank model has a tokenizer
    similarity = post(stub, "/models/vit", b'{"inputs": {"source_sentence": "a", "sentences": ["b"]}}')
    assert similarity.body["error"]["code"] == "wrong_task"
    assert [c["operation"] for c in stub.calls] == ["tokenize"]  # the others were refused before the broker


# ------------------------------------------------------------------ answers


def test_tei_rerank_sorts_by_score_and_keeps_indexes() -> None:
    stub = StubClient(answer=lambda inputs, parameters, operation: ([0.1, 0.9, 0.5], [4, 5, 6]))
    answer = post(stub, "/rerank", b'{"query": "q", "texts": ["a", "b", "c"], "return_text": true}')
    assert answer.body == [{"index": 1, "score": 0.9, "text": "b"}, {"index": 2, "score": 0.5, "text": "c"},
                           {"index": 0, "score": 0.1, "text": "a"}]
    assert answer.headers["x-compute-tokens"] == answer.headers["X-Tokens"] == "15"
    assert stub.calls[0]["texts"] == [["q", "a"], ["q", "b"], ["q", "c"]]


@pytest.mark.parametrize(("inputs", "sent", "single"), [
    ("a", ["a"], True), (["a"], ["a"], True), (["a", "b"], [["a", "b"]], True),
    ([["a"], ["b", "c"]], ["a", ["b", "c"]], False),
])
def test_tei_predict_takes_teis_input_shapes(inputs: Any, sent: list[Any], single: bool) -> None:
    labels = [{"label": "positive", "score": 0.7}, {"label": "negative", "score": 0.3}]
    stub = StubClient(answer=lambda items, parameters, operation: ([labels] * len(items), [3] * len(items)))
    answer = post(stub, "/predict", json.dumps({"inputs": inputs, "raw_scores": False}).encode())
    assert answer.status == 200, answer
    assert stub.calls[0]["texts"] == sent and stub.calls[0]["parameters"] == {"raw_scores": False}
    assert answer.body == (labels if single else [labels, labels])


def test_openai_usage_and_dimensions_reach_the_worker() -> None:
    stub = StubClient()
    answer = post(stub, "/v1/embeddings", b'{"model": "m", "input": ["a b", "c"], "dimensions": 2}')
    assert answer.body["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert stub.calls[0]["parameters"] == {"dimensions": 2}


def test_kserve_binary_answer_is_the_json_then_the_outputs() -> None:
    floats = np.arange(6, dtype=np.float32).reshape(2, 3)
    outputs = [OutputTensor("embedding", "FP32", floats.shape, floats),
               OutputTensor("labels", "BYTES", (2,), [b"cat", b"dog"])]
    body, length = encode_answer({"model_name": "m"}, outputs, {"embedding", "labels"})
    assert length is not None
    head = json.loads(body[:length])
    sizes = [output["parameters"]["binary_data_size"] for output in head["outputs"]]
    assert sizes == [24, 14] and len(body) == length + sum(sizes)
    assert np.array_equal(np.frombuffer(body[length:length + 24], dtype="<f4").reshape(2, 3), floats)
    assert body[length + 24:] == binary_bytes(b"cat", b"dog")
    plain, none = encode_answer({"model_name": "m"}, outputs, set())
    assert none is None and json.loads(plain)["outputs"][1]["data"] == ["cat", "dog"]


# ------------------------------------------------------------------ hostile input


@pytest.mark.parametrize(("body", "header", "says"), [
    (b'{"inputs": []}', "999", "whole body has"),
    (b'{"inputs": []}', "-5", "whole number"),
    (b'{"inputs": []}', "99999999999999999999", "whole number"),
    (b'{"inputs": []}', "abc", "whole number"),
    (b'{"inputs": []}', "0", "empty"),
    (*triton_body(binary_bytes(b"hi"), [1], size=100), "binary bytes left"),
    (*triton_body(binary_bytes(b"hi"), [1], size=-1), "binary bytes left"),
    (*triton_body(b"\xff\xff\xff\x7fxx", [1]), "only 2 are left"),
    (*triton_body(b"\x01\x00", [1]), "inside an element"),
    (*triton_body(binary_bytes(b"hi", b"there"), [1]), "shape [1] holds 1"),
    (*triton_body(binary_bytes(b"\xff\xfe"), [1]), "not UTF-8"),
    (*triton_body(binary_bytes(b"hi"), [1, 1], name="nope"), "takes the BYTES inputs text"),
    (*triton_body(binary_bytes(b"a", b"b", b"c", b"d"), [2, 2]), "shape [N] or [N, 1]"),
])
def test_kserve_refuses_broken_binary_bodies(body: bytes, header: str, says: str) -> None:
    answer = call(StubClient(), "POST", "/v2/models/m/infer", body=body, headers={TRITON: header})
    assert answer.status == 400, answer
    assert says in answer.body["error"], answer.body


def test_kserve_refuses_trailing_bytes_no_input_claims() -> None:
    body, length = triton_body(binary_bytes(b"hi"), [1])
    answer = call(StubClient(), "POST", "/v2/models/m/infer", body=body + b"extra", headers={TRITON: length})
    assert answer.status == 400 and "no input claims" in answer.body["error"]


@pytest.mark.parametrize("request_json", [
    b'{"inputs": "text"}', b'{"inputs": [5]}', b'{"inputs": [{"name": "text", "datatype": "FP32", "shape": [1], '
    b'"data": [1.0]}]}', b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": "1", "data": ["a"]}]}',
    b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [1]}]}',
    b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1]}]}',
    b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}], "outputs": [{"name": "x"}]}',
    b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}], "parameters": 3}',
    b'[1, 2]',
])
def test_kserve_refuses_malformed_json_requests(request_json: bytes) -> None:
    answer = post(StubClient(), "/v2/models/m/infer", request_json)
    assert answer.status == 400 and isinstance(answer.body["error"], str), answer


def test_base64_garbage_and_empty_images_are_400() -> None:
    stub = StubClient(models=task_models(vit="image-classification"))
    for body in (b'{"inputs": "@@@ not base64"}', b'{"inputs": ["aGk=", 5]}', b'{"inputs": []}'):
        answer = post(stub, "/models/vit", body)
        assert answer.status == 400 and answer.body["error"]["code"] == "bad_request", answer
    empty = post(stub, "/models/vit", b"", {"Content-Type": "image/png"})
    assert empty.status == 400
    kserve = post(stub, "/v2/models/vit/infer",
                  b'{"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["%%%"]}]}')
    assert kserve.status == 400 and "base64" in kserve.body["error"]
    assert not stub.calls


@pytest.mark.parametrize(("path", "body"), [
    ("/embed", b'{"inputs": [[1, 2, 3]]}'), ("/embed", b'{"inputs": ""}'), ("/embed", b'{"normalize": "yes"}'),
    ("/embed", b'{"inputs": "x", "normalize": "yes"}'), ("/embed", b'{"inputs": "x", "dimensions": 0}'),
    ("/embed", b'{"inputs": "x", "prompt_name": 3}'), ("/embed", b'{"inputs": "x", "prompt_name": ""}'),
    ("/rerank", b'{"query": "q", "texts": []}'), ("/rerank", b'{"query": 1, "texts": ["a"]}'),
    ("/rerank", b'{"query": "q", "texts": ["a"], "return_text": 1}'),
    ("/predict", b'{"inputs": ["a", "b", "c"]}'), ("/predict", b'{"inputs": [["a", "b", "c"]]}'),
    ("/predict", b'{"inputs": [["a"], "b"]}'), ("/predict", b'{"inputs": {}}'),
    ("/similarity", b'{"inputs": "a"}'), ("/similarity", b'{"inputs": {"source_sentence": "a", "sentences": []}}'),
    ("/tokenize", b'{"inputs": 3}'), ("/tokenize", b'{"inputs": "a", "add_special_tokens": "no"}'),
    ("/tokenize", b'null'),
])
def test_tei_routes_refuse_wrong_types_with_422(path: str, body: bytes) -> None:
    answer = post(StubClient(), path, body)
    assert answer.status == 422 and answer.body["error_type"] == "Validation", answer


@pytest.mark.parametrize("body", [
    b'{"model": "m", "input": [1, 2.5]}', b'{"model": "m", "input": [[1], "x"]}',
    b'{"model": "m", "input": "x", "dimensions": true}',
    b'{"model": "m", "input": "x", "dimensions": "8"}', b'{"model": "m", "input": "x", "encoding_format": "hex"}',
    b'{"model": 5, "input": "x"}', b'{"input": "x"}',
])
def test_openai_refuses_wrong_types_with_400_naming_the_field(body: bytes) -> None:
    answer = post(StubClient(), "/v1/embeddings", body)
    assert answer.status == 400 and answer.body["error"]["param"] in ("input", "dimensions", "encoding_format",
                                                                      "model"), answer


def test_models_route_keeps_its_texts_hot_path_and_reads_feature_extraction_parameters() -> None:
    stub = StubClient()
    answer = post(stub, "/models/m", b'{"inputs": "a b c", "normalize": false, "parameters": {"truncate": true}}')
    assert answer.status == 200 and answer.headers["X-Tokens"] == "5"
    assert stub.calls[0]["parameters"] == {"truncate": True, "normalize": False}
    similar = post(StubClient(), "/models/m", b'{"inputs": {"source_sentence": "a", "sentences": ["b", "c"]}}')
    assert similar.status == 200 and similar.body == pytest.approx([1.0, 1.0])


# ------------------------------------------------------------------ TEI's newer routes (issue 35)


BATCHES: dict[str, Any] = {  # a TEI route's body with a batch of n
    "/embed": lambda n: {"inputs": ["a"] * n}, "/embed_all": lambda n: {"inputs": ["a"] * n},
    "/embed_sparse": lambda n: {"inputs": ["a"] * n}, "/tokenize": lambda n: {"inputs": ["a"] * n},
    "/rerank": lambda n: {"query": "q", "texts": ["a"] * n}, "/predict": lambda n: {"inputs": [["a"]] * n},
    # TEI embeds the source with the sentences: a batch of n + 1
    "/similarity": lambda n: {"inputs": {"source_sentence": "a", "sentences": ["b"] * (n - 1)}},
    "/decode": lambda n: {"ids": [[1]] * n},
}


@pytest.mark.parametrize("path", BATCHES)
def test_tei_refuses_a_batch_over_max_client_batch_size_with_teis_422(path: str) -> None:
    stub = StubClient(answer=sparse if path == "/embed_sparse" else vectors)
    answer = post(stub, path, json.dumps(BATCHES[path](CONFIG.max_inputs + 1)).encode())
    assert (answer.status, answer.body) == (422, {"error": "batch size 257 > maximum allowed batch size 256",
                                                  "error_type": "Validation"})
    assert not stub.calls
    assert post(stub, path, json.dumps(BATCHES[path](CONFIG.max_inputs)).encode()).status == 200


def test_prompt_name_reaches_the_worker_on_every_route_that_has_one() -> None:
    stub = StubClient(models=task_models(m="embeddings", **{CONFIG.default_model: "embeddings"}))
    for path, body in (("/embed", b'{"inputs": "a", "prompt_name": "query"}'),
                       ("/embed_all", b'{"inputs": "a", "prompt_name": "query"}'),
                       ("/tokenize", b'{"inputs": "a", "prompt_name": "query"}'),
                       ("/similarity", b'{"inputs": {"source_sentence": "a", "sentences": ["b"]}, '
                                       b'"parameters": {"prompt_name": "query"}}'),
                       ("/models/m", b'{"inputs": "a", "prompt_name": "query"}'),
                       ("/v1/embeddings", b'{"model": "m", "input": "a", "prompt_name": "query"}'),
                       ("/v2/models/m/infer", b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], '
                                              b'"data": ["a"]}], "parameters": {"prompt_name": "query"}}')):
        assert post(stub, path, body).status == 200, path
    assert [call["parameters"].get("prompt_name") for call in stub.calls] == ["query"] * 7


def test_embed_sparse_answers_teis_index_value_pairs() -> None:
    stub = StubClient(answer=sparse, models=task_models(**{CONFIG.default_model: "sparse-embeddings"}))
    answer = post(stub, "/embed_sparse", b'{"inputs": ["a b", "c"], "truncate": true}')
    assert answer.status == 200, answer
    assert answer.body == [[{"index": 3, "value": 0.5}, {"index": 17, "value": 1.25}]] * 2
    assert answer.headers["x-compute-tokens"] == "7" and stub.calls[0]["parameters"] == {"truncate": True}
    wrong = post(StubClient(), "/embed", b'{"inputs": "a"}', JSON)
    assert wrong.status == 200
    embed = post(stub, "/embed", b'{"inputs": "a"}')
    assert embed.status == 424 and "ZBATCH_TEI_MODEL" in embed.body["error"]
    assert "TEI's POST /embed_sparse" in embed.body["error"]


def test_kserve_flattens_sparse_embeddings_with_a_batch_index() -> None:
    stub = StubClient(answer=sparse, models=task_models(m="sparse-embeddings"))
    answer = post(stub, "/v2/models/m/infer", b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], '
                                              b'"data": ["a", "b"]}]}')
    outputs = {output["name"]: output for output in answer.body["outputs"]}
    assert outputs["indices"]["data"] == [3, 17, 3, 17] and outputs["indices"]["datatype"] == "INT32"
    assert outputs["values"]["data"] == [0.5, 1.25, 0.5, 1.25] and outputs["batch_index"]["data"] == [0, 0, 1, 1]


def test_embed_all_and_decode_ask_for_their_operation() -> None:
    stub = StubClient()
    vectors = post(stub, "/embed_all", b'{"inputs": ["a b", "c"]}')
    assert vectors.status == 200 and [len(rows) for rows in vectors.body] == [4, 3]
    texts = post(stub, "/decode", b'{"ids": [[101, 7592], [0]], "skip_special_tokens": false}')
    assert texts.status == 200 and texts.body == ["101 7592", "0"]
    single = post(stub, "/decode", b'{"ids": [101, 7592]}')
    assert single.body == ["101 7592"]
    assert [c["operation"] for c in stub.calls] == ["embed_all", "decode", "decode"]
    assert stub.calls[1]["parameters"] == {"skip_special_tokens": False}


@pytest.mark.parametrize("body", [
    b'{"ids": []}', b'{"ids": [-1]}', b'{"ids": [4294967296]}', b'{"ids": [1.5]}', b'{"ids": [true]}',
    b'{"ids": "101"}', b'{"ids": [[1], 2]}', b'{"ids": [[[1]]]}', b'{"ids": [1], "skip_special_tokens": "no"}',
    b'{}',
])
def test_decode_refuses_what_are_not_token_ids(body: bytes) -> None:
    stub = StubClient()
    answer = post(stub, "/decode", body)
    if body == b'{"ids": []}':  # one empty list of ids is a text, ""
        assert answer.status == 200 and answer.body == [""]
        return
    assert answer.status == 422 and answer.body["error_type"] == "Validation", answer
    assert not stub.calls


# ------------------------------------------------------------------ the dialects' declarations


def test_the_app_mounts_what_each_dialect_module_declares() -> None:
    """Each module of gateway/dialects/ is a dialect; the app's routes are theirs and the gateway's own two."""
    from pathlib import Path

    from aiohttp import web

    from gateway.app import ROUTES, create_app
    from gateway.dialects import declared, error_shape_of

    folder = Path(__file__).resolve().parents[2] / "gateway" / "dialects"
    modules = {path.stem for path in folder.glob("*.py")} - {"__init__"}
    assert {dialect.name for dialect in declared()} == modules
    declared_routes = [route for dialect in declared() for route in dialect.routes]
    claimed = {(claim.method, claim.path) for dialect in declared() for claim in dialect.claims}
    # A claimed route is mounted once, its handler telling the media types apart; every other as declared.
    assert [route for route in ROUTES if route not in declared_routes and (route.method, route.path) not in claimed
            ] == [web.get("/metrics", ROUTES[-2].handler), web.get("/openapi.json", ROUTES[-1].handler)]
    assert len(ROUTES) == len(declared_routes) + 2
    mounted = {(r.method, r.resource.canonical) for r in create_app(CONFIG).router.routes() if r.resource}
    assert {(r.method, r.path.replace(":.+", "")) for r in declared_routes if isinstance(r, web.RouteDef)} <= mounted
    for dialect in declared():
        for path in dialect.error_paths:
            assert error_shape_of(path) is dialect.errors
        for claim in dialect.claims:
            assert all(error_shape_of(claim.path, media) is dialect.errors for media in claim.media_types)
            assert error_shape_of(claim.path, "text/plain") is not dialect.errors
