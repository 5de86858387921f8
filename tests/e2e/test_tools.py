"""The tools and clients people point at embedding servers, unchanged, against a real stack (issue 39).

One broker; one worker serving the default embeddings model and two tiny
models (a cross-encoder, a BERT classifier); a gateway with its gRPC port,
whose TEI rerank and predict routes use the tiny models.  Each tool talks to
the gateway only, as it would to the server it was written for:

* ``huggingface_hub.InferenceClient(model="http://host:port")`` and TEI's own
  k6 load script post TEI's JSON to ``POST /``;
* ``cohere``'s ``rerank`` (v1 and v2) posts to ``/v1/rerank`` and ``/v2/rerank``;
* ``vllm bench serve --backend openai-embeddings`` posts
  ``{"model", "input", "truncate_prompt_tokens": -1}`` to ``/v1/embeddings``
  and reads ``usage.prompt_tokens`` (vllm itself does not install here:
  docs/benchmark-it-yourself.md says why; its request is sent as it sends it);
* ``baseten-performance-client`` pushes batches at ``/v1/embeddings``, TEI's
  ``/rerank`` and ``/predict`` from Rust;
* ``tritonclient``'s ``get_model_config`` over HTTP and gRPC, and an inference
  built from it, as ``perf_analyzer`` builds its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from tests.daemons import Daemons, free_port, start_broker, start_gateway, start_worker
from tests.e2e.vectors import SAME, TEXTS, cosine, hub_pointed_nowhere, reference_vectors
from tests.worker.tiny_models import make_tiny_bert
from worker.runners import DEFAULT_MODEL_NAME

MODEL, RERANK, CLASSIFY = DEFAULT_MODEL_NAME, "tiny-rerank", "tiny-classify"
# What TEI's k6 load script (load_tests/load.js) posts: one long text, cut at the model's maximum.
LONG = "A path from a point approximately 330 metres east of the most south westerly corner of Unit 4, " * 30
DOCUMENTS = ["red", "a dog", "blue sky", "the cat is red"]
QUERY = "what is red"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemons]:
    models = tmp_path_factory.mktemp("models")
    extra = (f"name={RERANK},path={make_tiny_bert(models, 'rerank')},task=rerank;"
             f"name={CLASSIFY},path={make_tiny_bert(models, 'text-classification')},task=text-classification")
    with Daemons(tmp_path_factory.mktemp("logs")) as daemons:
        broker = daemons.add(start_broker(daemons.log_dir))
        daemons.add(start_worker(broker, daemons.log_dir, "w1", workers=1, extra_models=extra))
        grpc_port = free_port()
        gateway = daemons.add(start_gateway(broker, daemons.log_dir, ready="/readyz", models=(MODEL, RERANK, CLASSIFY),
                                            tei_rerank_model=RERANK, tei_predict_model=CLASSIFY, grpc_port=grpc_port))
        gateway.endpoints["grpc"] = f"127.0.0.1:{grpc_port}"
        yield daemons


@pytest.fixture(scope="module")
def url(served: Daemons) -> str:
    return served["gateway"].url


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    return reference_vectors()


def post(url: str, body: Any = None, data: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
    import requests

    if body is not None:
        return requests.post(url, json=body, headers=headers, timeout=60)
    return requests.post(url, data=data, headers=headers, timeout=60)


# ------------------------------------------------------------------ TEI's root


def test_inference_client_pointed_at_the_root(url: str, reference: np.ndarray,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import InferenceClient

    hub_pointed_nowhere(monkeypatch)
    client = InferenceClient(model=url)
    vectors = client.feature_extraction(TEXTS[0])
    assert vectors.shape == (1, 384) and cosine(vectors[0], reference[0]) >= SAME
    cut = client.feature_extraction(TEXTS[2], normalize=True, truncate=True, truncation_direction="right")
    assert cosine(cut[0], reference[2]) >= SAME


def test_teis_load_script_and_curl_at_the_root(url: str, reference: np.ndarray) -> None:
    answer = post(f"{url}/", {"inputs": LONG, "truncate": True})
    assert answer.status_code == 200, answer.text
    (vector,) = answer.json()
    assert len(vector) == 384 and answer.headers["x-compute-tokens"] == "256"  # cut at the model's maximum
    refused = post(f"{url}/", {"inputs": LONG, "truncate": False})
    assert refused.status_code == 422 and "256" in refused.json()["error"]
    text = post(f"{url}/", data=TEXTS[1].encode())  # curl -d: the body is the text
    assert text.status_code == 200 and cosine(text.json(), reference[1]) >= SAME


def test_hostile_json_at_the_root_gets_teis_errors_while_traffic_is_answered(url: str) -> None:
    json_type = {"Content-Type": "application/json"}
    hostile = [(b'{"inputs": ', 422), (b'{"inputs": 5}', 422), (b'{"inputs": [1, 2, 3]}', 422),
               (b'{"inputs": [[]]}', 422), (b'{"inputs": "x", "normalize": "yes"}', 422), (b"[]", 422),
               (b'{"inputs": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", 422),
               (b'{"inputs": ["a"], "dimensions": 99999}', 422),
               (b'{"inputs": "' + b"a" * 2_000_000 + b'"}', 413)]
    normal = [(json.dumps({"inputs": f"normal traffic {i}"}).encode(), 200) for i in range(16)]
    requests_ = [item for pair in zip(normal, hostile * 2, strict=False) for item in pair]
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda r: post(f"{url}/", data=r[0], headers=json_type), requests_))
    for (body, expected), answer in zip(requests_, answers, strict=True):
        assert answer.status_code == expected, (body[:40], answer.text[:200])
        if expected != 200:
            assert set(answer.json()) == {"error", "error_type"}, answer.text[:200]


# ------------------------------------------------------------------ Cohere's rerank


def tei_scores(url: str) -> list[float]:
    """The cross-encoder's scores of DOCUMENTS, by TEI's /rerank, in document order."""
    ranks = post(f"{url}/rerank", {"query": QUERY, "texts": DOCUMENTS}).json()
    return [rank["score"] for rank in sorted(ranks, key=lambda rank: rank["index"])]


def test_cohere_client_reranks(url: str) -> None:
    import cohere

    scores = tei_scores(url)
    best = sorted(range(len(DOCUMENTS)), key=lambda i: scores[i], reverse=True)
    client = cohere.Client(api_key="unused", base_url=url, timeout=60, max_retries=0)
    ranked = client.rerank(model=RERANK, query=QUERY, documents=DOCUMENTS, top_n=3, return_documents=True)
    assert [r.index for r in ranked.results] == best[:3]
    assert [r.relevance_score for r in ranked.results] == pytest.approx([scores[i] for i in best[:3]], abs=1e-6)
    assert [r.document.text if r.document else None for r in ranked.results] == [DOCUMENTS[i] for i in best[:3]]
    meta = ranked.meta
    assert meta is not None and meta.billed_units is not None and meta.tokens is not None
    assert meta.billed_units.search_units == 1 and (meta.tokens.input_tokens or 0) > len(DOCUMENTS) * 3

    v2 = cohere.ClientV2(api_key="unused", base_url=url, timeout=60, max_retries=0)
    again = v2.rerank(model=RERANK, query=QUERY, documents=DOCUMENTS)
    assert [r.index for r in again.results] == best
    assert again.meta is not None and again.meta.api_version is not None and again.meta.api_version.version == "2"


def test_cohere_client_raises_its_own_errors(url: str) -> None:
    import cohere

    client = cohere.Client(api_key="unused", base_url=url, timeout=60, max_retries=0)
    with pytest.raises(cohere.BadRequestError) as wrong:
        client.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS)
    assert "rerank model" in wrong.value.body["message"]
    with pytest.raises(cohere.NotFoundError):
        client.rerank(model="no-such-model", query=QUERY, documents=DOCUMENTS)
    with pytest.raises(cohere.BadRequestError) as too_many:
        client.rerank(model=RERANK, query=QUERY, documents=["x"] * 257)
    assert "257 documents" in too_many.value.body["message"]
    for body in ({"model": RERANK, "documents": DOCUMENTS}, {"model": RERANK, "query": QUERY, "documents": "red"}):
        answer = post(f"{url}/v1/rerank", body)
        assert answer.status_code == 400 and set(answer.json()) == {"message"}, answer.text


# ------------------------------------------------------------------ vLLM's benchmark


def test_the_request_vllm_bench_serve_sends(url: str, reference: np.ndarray) -> None:
    """``async_request_openai_embeddings`` of vllm/benchmarks/lib/endpoint_request_func.py: its body and
    headers, and what it reads back (``usage.prompt_tokens``); then the same field through the openai SDK."""
    import openai

    headers = {"Content-Type": "application/json", "Authorization": "Bearer unused",
               "x-request-id": "benchmark-serving-0"}
    answer = post(f"{url}/v1/embeddings", {"model": MODEL, "input": [*TEXTS, LONG], "truncate_prompt_tokens": -1},
                  headers=headers)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["usage"]["prompt_tokens"] == int(answer.headers["X-Tokens"]) > 256  # LONG alone is cut at 256
    assert answer.headers["X-Request-ID"] == "benchmark-serving-0"
    assert all(cosine(d["embedding"], r) >= SAME for d, r in zip(body["data"], reference, strict=False))

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    same = client.embeddings.create(model=MODEL, input=TEXTS[0], extra_body={"truncate_prompt_tokens": -1})
    assert cosine(same.data[0].embedding, reference[0]) >= SAME and same.usage.prompt_tokens > 2
    with pytest.raises(openai.BadRequestError) as count:
        client.embeddings.create(model=MODEL, input=TEXTS[0], extra_body={"truncate_prompt_tokens": 8})
    assert count.value.param == "truncate_prompt_tokens"


# ------------------------------------------------------------------ baseten-performance-client


def test_baseten_performance_client(url: str, reference: np.ndarray) -> None:
    from baseten_performance_client import PerformanceClient, RequestProcessingPreference

    client = PerformanceClient(base_url=url, api_key="unused")
    preference = RequestProcessingPreference(batch_size=16, max_concurrent_requests=8, timeout_s=60.0)
    texts = TEXTS * 40
    answer = client.embed(texts, model=MODEL, preference=preference)
    vectors = answer.numpy()
    assert vectors.shape == (len(texts), 384)
    assert min(cosine(vector, reference[i % len(TEXTS)]) for i, vector in enumerate(vectors)) >= SAME
    assert answer.usage.prompt_tokens > len(texts) * 3 and len(answer.individual_request_times or ()) == 8

    ranks = client.rerank(QUERY, DOCUMENTS, preference=preference)  # TEI's /rerank
    scores = tei_scores(url)
    by_index = sorted(ranks.data, key=lambda rank: rank.index)
    assert [r.index for r in by_index] == list(range(len(DOCUMENTS)))
    assert [r.score for r in by_index] == pytest.approx(scores, abs=1e-6)
    labels = client.classify(["good day", "bad night"], preference=preference)  # TEI's /predict
    assert [{p.label for p in row} for row in labels.data] == [{"negative", "positive"}] * 2


# ------------------------------------------------------------------ Triton's model configuration


def test_tritonclient_reads_the_model_config_and_infers_from_it(served: Daemons, url: str,
                                                                reference: np.ndarray) -> None:
    """HTTP and gRPC answer the same configuration; a batch built from it, as perf_analyzer builds one
    (``max_batch_size``, then each input's dims after the batch), is answered."""
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    http = triton_http.InferenceServerClient(url.removeprefix("http://"))
    config = http.get_model_config(MODEL)
    assert config["max_batch_size"] == 256 and config["dynamic_batching"]["preferred_batch_size"][0] > 0
    assert config["input"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []}}]
    assert config["output"] == [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [384]}]
    grpc = triton_grpc.InferenceServerClient(served["gateway"].endpoints["grpc"])
    assert grpc.get_model_config(MODEL, as_json=True)["config"] == json.loads(json.dumps(
        config | {"input": [config["input"][0] | {"dims": ["1"], "reshape": {}}],
                  "output": [config["output"][0] | {"dims": ["384"]}]}))  # protobuf's JSON: int64 as text
    rerank = grpc.get_model_config(RERANK).config
    assert [(i.name, list(i.dims)) for i in rerank.input] == [("query", [1]), ("texts", [1])]
    with pytest.raises(triton_grpc.InferenceServerException) as unknown:
        grpc.get_model_config("no-such-model")
    assert unknown.value.status() == "StatusCode.NOT_FOUND"

    for module, client in ((triton_http, http), (triton_grpc, grpc)):
        dims = [len(TEXTS), *config["input"][0]["dims"]]
        tensor = module.InferInput("text", dims, "BYTES")
        tensor.set_data_from_numpy(np.array([[t.encode()] for t in TEXTS], dtype=np.object_))
        vectors = client.infer(MODEL, [tensor]).as_numpy("embedding")
        assert vectors.shape == (len(TEXTS), 384)
        assert min(cosine(v, r) for v, r in zip(vectors, reference, strict=True)) >= SAME
