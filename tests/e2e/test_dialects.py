"""The client libraries users already have, against a real stack, changing only a URL (issue 24).

One broker; one worker with the default embeddings model; one worker with
tiny models (a cross-encoder, a BERT classifier, a ViT and a YOLOS); a
gateway whose TEI routes point at them.  The official ``openai`` SDK,
``huggingface_hub.InferenceClient`` and ``tritonclient.http`` talk to the
gateway only (``HF_HUB_OFFLINE=1``); TEI's routes are called with plain HTTP
and the JSON TEI documents.  The vectors of every dialect agree with each
other and with sentence-transformers; text models run on ONNX Runtime (the workers'
default ``--runtime auto``) and their outputs match torch's.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.daemons import Daemons, free_port, http_json, start_broker, start_gateway, start_worker
from tests.e2e.vectors import SAME, TEXTS, cosine, hub_pointed_nowhere, reference_vectors
from tests.worker.tiny_models import image_bytes, make_tiny_bert, make_tiny_vit, make_tiny_yolos, with_prompts
from worker.runners import DEFAULT_MODEL_NAME, default_model_path
from zbatch.testing import start_http

MODEL = DEFAULT_MODEL_NAME
BUDGET = 300  # w1's --max-batch-tokens: a batch of two long texts runs as two passes
RERANK, CLASSIFY, VIT, YOLOS = "tiny-rerank", "tiny-classify", "tiny-vit", "tiny-yolos"
SPLADE, PROMPTED = "tiny-splade", "tiny-prompts"  # a masked-LM served as sparse-embeddings; a model with prompts
PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The tiny models, built on disk, by the name they are served as."""
    models = tmp_path_factory.mktemp("models")
    return {RERANK: make_tiny_bert(models, "rerank"), CLASSIFY: make_tiny_bert(models, "text-classification"),
            VIT: make_tiny_vit(models), YOLOS: make_tiny_yolos(models), SPLADE: make_tiny_bert(models, "fill-mask"),
            PROMPTED: with_prompts(make_tiny_bert(models, "feature-extraction"), PROMPTS)}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, folders: dict[str, str]) -> Iterator[Daemons]:
    """Broker, the two workers and a gateway whose TEI routes use the tiny rerank and classification models."""
    extra = (f"name={CLASSIFY},path={folders[CLASSIFY]},task=text-classification;"
             f"name={VIT},path={folders[VIT]},task=image-classification;"
             f"name={YOLOS},path={folders[YOLOS]},task=object-detection;"
             f"name={SPLADE},path={folders[SPLADE]},task=sparse-embeddings;"
             f"name={PROMPTED},path={folders[PROMPTED]},task=embeddings,default_prompt_name=query")
    with Daemons(tmp_path_factory.mktemp("logs")) as daemons:
        broker = daemons.add(start_broker(daemons.log_dir))
        daemons.add(start_worker(broker, daemons.log_dir, "w1", wait=False, workers=1,
                                 max_batch_tokens=BUDGET))  # every dialect's vectors below, within a budget
        daemons.add(start_worker(broker, daemons.log_dir, "w2", workers=1, model_path=folders[RERANK],
                                 model_name=RERANK, task="rerank", extra_models=extra))
        grpc_port = free_port()
        gateway = daemons.add(start_gateway(broker, daemons.log_dir, ready="/readyz",
                                            models=(MODEL, RERANK, CLASSIFY, VIT), tei_rerank_model=RERANK,
                                            tei_predict_model=CLASSIFY, grpc_port=grpc_port))
        gateway.endpoints["grpc"] = f"127.0.0.1:{grpc_port}"
        yield daemons


@pytest.fixture(scope="module")
def url(served: Daemons) -> str:
    return served["gateway"].url


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    return reference_vectors()


def post(url: str, body: Any = None, data: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    return http_json(url, body, headers=headers, data=data, method="POST")


# ------------------------------------------------------------------ OpenAI


def test_openai_sdk_lists_models_embeds_and_raises_its_own_errors(url: str, reference: np.ndarray) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    listed = {model.id for model in client.models.list()}
    assert {MODEL, RERANK, CLASSIFY, VIT, YOLOS} <= listed
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")

    default = client.embeddings.create(model=MODEL, input=TEXTS)  # the SDK asks for base64
    floats = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    for i, expected in enumerate(reference):
        assert cosine(default.data[i].embedding, expected) >= SAME
        assert cosine(floats.data[i].embedding, expected) >= SAME
    assert default.usage.prompt_tokens == default.usage.total_tokens > len(TEXTS) * 2

    short = client.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=128, encoding_format="float")
    vector = np.asarray(short.data[0].embedding)
    assert vector.shape == (128,) and abs(np.linalg.norm(vector) - 1) < 1e-5
    assert cosine(vector, reference[0][:128]) >= SAME

    with pytest.raises(openai.BadRequestError) as too_many:
        client.embeddings.create(model=MODEL, input="x", dimensions=1000)
    assert "dimensions" in str(too_many.value)
    with pytest.raises(openai.NotFoundError) as unknown:
        client.embeddings.create(model="no-such-model", input="x")
    assert unknown.value.code == "unknown_model"
    with pytest.raises(openai.BadRequestError) as wrong:
        client.embeddings.create(model=RERANK, input="x")
    assert wrong.value.code == "wrong_task" and "rerank" in wrong.value.message


# ------------------------------------------------------------------ huggingface_hub


def test_huggingface_hub_inference_client(url: str, reference: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import InferenceClient

    hub_pointed_nowhere(monkeypatch)
    client = InferenceClient(model=f"{url}/models/{MODEL}")
    vector = client.feature_extraction(TEXTS[0])
    assert cosine(vector, reference[0]) >= SAME
    similar = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS)
    expected = [cosine(reference[0], other) for other in reference]
    np.testing.assert_allclose(similar, expected, atol=1e-5)

    labels = InferenceClient(model=f"{url}/models/{VIT}").image_classification(image_bytes(40, 30, 1))
    assert labels and {label.label for label in labels} <= {"cat", "dog", "bird"}
    found = InferenceClient(model=f"{url}/models/{YOLOS}").object_detection(image_bytes(40, 30, 2), threshold=0.0)
    assert found and all(d.box.xmax <= 41 for d in found)


# ------------------------------------------------------------------ KServe v2 / Triton


def test_tritonclient_binary_and_json_forms(url: str, reference: np.ndarray) -> None:
    import tritonclient.http as triton

    client = triton.InferenceServerClient(url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)
    metadata = client.get_model_metadata(MODEL)
    assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert metadata["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
    assert client.get_server_metadata()["extensions"] == ["binary_tensor_data"]
    for binary in (True, False):
        text = triton.InferInput("text", [len(TEXTS), 1], "BYTES")
        text.set_data_from_numpy(np.array([[t.encode()] for t in TEXTS], dtype=np.object_), binary_data=binary)
        asked = [triton.InferRequestedOutput("embedding", binary_data=binary)]
        result = client.infer(MODEL, [text], outputs=asked)
        vectors = result.as_numpy("embedding")
        assert vectors.shape == (len(TEXTS), 384) and vectors.dtype == np.float32
        assert min(cosine(v, r) for v, r in zip(vectors, reference, strict=True)) >= SAME
    default = triton.InferInput("text", [1], "BYTES")
    default.set_data_from_numpy(np.array([TEXTS[1].encode()], dtype=np.object_))
    assert cosine(client.infer(MODEL, [default]).as_numpy("embedding")[0], reference[1]) >= SAME  # binary out
    for binary in (True, False):  # half precision asked for: FP16 as the worker sent it, in either form
        text = triton.InferInput("text", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=np.object_))
        halved = client.infer(MODEL, [text], outputs=[triton.InferRequestedOutput("embedding", binary_data=binary)],
                              parameters={"precision": "float16"})
        vectors = halved.as_numpy("embedding")
        assert vectors.dtype == np.float16 and vectors.shape == (len(TEXTS), 384)
        assert halved.get_output("embedding")["datatype"] == "FP16"
        assert min(cosine(v, r) for v, r in zip(vectors.astype(np.float32), reference, strict=True)) >= 0.9999
    with pytest.raises(triton.InferenceServerException) as unknown:
        client.infer("no-such-model", [default])
    assert unknown.value.status() == "404"


def test_kserve_rerank_classification_and_images(url: str) -> None:
    import tritonclient.http as triton

    client = triton.InferenceServerClient(url.removeprefix("http://"))

    def tensor(name: str, items: list[bytes]) -> Any:
        value = triton.InferInput(name, [len(items)], "BYTES")
        value.set_data_from_numpy(np.array(items, dtype=np.object_))
        return value

    scores = client.infer(RERANK, [tensor("query", [b"what is red"]), tensor("texts", [b"red", b"a dog"])])
    assert scores.as_numpy("scores").shape == (2,)
    labels = client.infer(CLASSIFY, [tensor("text", [b"good day", b"bad night"])])
    assert labels.as_numpy("labels").shape == (2, 2) and labels.as_numpy("scores").shape == (2, 2)
    images = client.infer(VIT, [tensor("image", [image_bytes(30, 20, 3), image_bytes(16, 16, 4, "JPEG")])])
    assert images.as_numpy("scores").shape[0] == 2
    boxes = client.infer(YOLOS, [tensor("image", [image_bytes(40, 30, 5)])], parameters={"threshold": 0.0})
    assert boxes.as_numpy("boxes").shape[1] == 4 and set(boxes.as_numpy("batch_index")) == {0}
    with pytest.raises(triton.InferenceServerException) as corrupt:
        client.infer(VIT, [tensor("image", [image_bytes(8, 8, 6), b"GIF89a, then nothing"])])
    assert corrupt.value.status() == "400" and "inputs[1]" in corrupt.value.message()


# ------------------------------------------------------------------ TEI


def test_tei_routes_answer_tei_json(url: str, reference: np.ndarray) -> None:
    status, headers, vectors = post(f"{url}/embed", {"inputs": TEXTS[0], "truncate": True, "normalize": True})
    assert status == 200 and len(vectors) == 1 and cosine(vectors[0], reference[0]) >= SAME
    assert int(headers["x-compute-tokens"]) == int(headers["X-Tokens"]) > 2
    assert int(headers["x-compute-characters"]) == len(TEXTS[0])
    status, _, vectors = post(f"{url}/embed", {"inputs": TEXTS, "truncation_direction": "Left"})
    assert status == 200 and min(cosine(v, r) for v, r in zip(vectors, reference, strict=True)) >= SAME

    status, _, ranks = post(f"{url}/rerank", {"query": "what is red", "texts": ["red", "a dog", "blue"],
                                              "return_text": True})
    assert status == 200 and sorted(r["index"] for r in ranks) == [0, 1, 2]
    assert [r["score"] for r in ranks] == sorted((r["score"] for r in ranks), reverse=True)
    assert all(r["text"] == ["red", "a dog", "blue"][r["index"]] for r in ranks)
    status, _, raw = post(f"{url}/rerank", {"query": "what is red", "texts": ["red"], "raw_scores": True})
    assert status == 200 and set(raw[0]) == {"index", "score"}

    status, _, one = post(f"{url}/predict", {"inputs": "good day"})
    assert status == 200 and {p["label"] for p in one} == {"negative", "positive"}
    status, _, pair = post(f"{url}/predict", {"inputs": ["good day", "bad day"]})
    assert status == 200 and len(pair) == 2 and "label" in pair[0]
    status, _, batch = post(f"{url}/predict", {"inputs": [["good day"], ["good", "bad"]], "raw_scores": True})
    assert status == 200 and len(batch) == 2 and all(len(p) == 2 for p in batch)

    status, _, tokens = post(f"{url}/tokenize", {"inputs": "hello world"})
    assert status == 200 and [t["text"] for t in tokens[0]] == ["[CLS]", "hello", "world", "[SEP]"]
    assert tokens[0][1] == {"id": tokens[0][1]["id"], "text": "hello", "special": False, "start": 0, "stop": 5}
    status, _, plain = post(f"{url}/tokenize", {"inputs": ["hello"], "add_special_tokens": False})
    assert status == 200 and [t["text"] for t in plain[0]] == ["hello"]

    status, _, similar = post(f"{url}/similarity", {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS}})
    assert status == 200 and similar[0] == pytest.approx(1.0, abs=1e-5)

    status, _, info = http_json(f"{url}/info")
    assert status == 200 and info["model_id"] == MODEL and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 256 and info["model_dtype"] == "float32" and info["max_client_batch_size"]
    assert info["max_batch_tokens"] == BUDGET, "the worker's own budget, as TEI reports its own"
    assert http_status_of(f"{url}/health") == 200


def test_text_models_run_on_onnx_runtime_with_torchs_outputs(served: Daemons, url: str, reference: np.ndarray,
                                                              tmp_path: Path) -> None:
    """The workers' default runtime (auto) serves every text model here on ONNX Runtime; the vectors above
    match sentence-transformers on every dialect, and the rerank and classification scores match torch's."""
    from worker.runners import ModelSpec, load_runner

    for worker, models in (("w1", (MODEL,)), ("w2", (RERANK, CLASSIFY))):
        log = served[worker].log_path.read_text(errors="replace")
        for model in models:
            assert f"model {model} runs on ONNX Runtime" in log, served[worker].log()
    query, texts = "what is red", ["red", "a dog", " ".join(["blue"] * 200)]
    status, _, ranks = post(f"{url}/rerank", {"query": query, "texts": texts, "raw_scores": True})
    assert status == 200
    torch_rerank = load_runner(ModelSpec("t", make_tiny_bert(tmp_path, "rerank"), task="rerank", device="cpu"))
    expected = torch_rerank.run([[query, text] for text in texts], {"raw_scores": True})
    np.testing.assert_allclose([r["score"] for r in sorted(ranks, key=lambda r: r["index"])], expected, rtol=1e-5,
                               atol=1e-6)
    status, _, labels = post(f"{url}/predict", {"inputs": [["good day"], ["good", "bad"]], "raw_scores": True})
    assert status == 200
    torch_classify = load_runner(ModelSpec("c", make_tiny_bert(tmp_path, "text-classification"),
                                           task="text-classification", device="cpu"))
    for got, want in zip(labels, torch_classify.run(["good day", ["good", "bad"]], {"raw_scores": True}),
                         strict=True):
        assert {p["label"]: p["score"] for p in got} == pytest.approx({p["label"]: p["score"] for p in want},
                                                                      abs=1e-5)


def http_status_of(url: str) -> int:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.read() == b""
        return int(response.status)


@pytest.fixture(scope="module")
def plain_gateway(served: Daemons) -> str:
    """A second gateway, whose TEI routes all use its default model, the embeddings model (named: the workers
    serve several)."""
    broker = served["broker"]
    return served.add(start_http("gateway", "gateway-plain", served.log_dir, frontend=broker.frontend,
                                 default_model=MODEL)).url


def test_tei_errors_use_teis_shape_and_statuses(url: str, plain_gateway: str) -> None:
    status, _, body = post(f"{url}/embed", {"inputs": 5})
    assert status == 422 and body["error_type"] == "Validation" and set(body) == {"error", "error_type"}
    status, _, body = post(f"{url}/embed", {"inputs": "x", "truncation_direction": "up"})
    assert status == 422 and "truncation_direction" in body["error"]
    status, _, body = post(f"{url}/embed", {"inputs": "word " * 400, "truncate": False})
    assert status == 422 and "256" in body["error"]
    # Where the TEI routes all use the embeddings model, /rerank and /predict say which task would do.
    for path, body in (("/rerank", {"query": "q", "texts": ["a"]}), ("/predict", {"inputs": "a"})):
        status, _, answer = post(f"{plain_gateway}{path}", body)
        assert status == 424 and answer["error_type"] == "Backend", answer
        assert "embeddings model" in answer["error"] and "ZBATCH_TEI_" in answer["error"], answer


# ------------------------------------------------------------------ Hugging Face shapes, images


def test_models_route_takes_images_as_body_or_base64(url: str) -> None:
    image = image_bytes(30, 30, 9)
    status, _, labels = post(f"{url}/models/{VIT}", data=image, headers={"Content-Type": "image/png"})
    assert status == 200 and {label["label"] for label in labels} <= {"cat", "dog", "bird"}
    encoded = base64.b64encode(image).decode()
    status, _, both = post(f"{url}/models/{VIT}", {"inputs": [encoded, f"data:image/png;base64,{encoded}"],
                                                   "parameters": {"top_k": 1}})
    assert status == 200 and len(both) == 2 and both[0] == both[1] and len(both[0]) == 1
    status, _, boxes = post(f"{url}/models/{YOLOS}", {"inputs": encoded, "parameters": {"threshold": 0.0}})
    assert status == 200 and all(set(d) == {"label", "score", "box"} for d in boxes)
    status, _, body = post(f"{url}/models/{VIT}", {"inputs": "not base64!"})
    assert status == 400 and "base64" in body["error"]["message"]
    png = {"Content-Type": "image/png"}
    status, _, body = post(f"{url}/models/{VIT}", data=b"\x89PNG\r\n\x1a\nbroken", headers=png)
    assert status == 400 and "image" in body["error"]["message"]
    status, _, body = post(f"{url}/models/{MODEL}", data=image, headers={"Content-Type": "image/png"})
    assert status == 400 and body["error"]["code"] == "wrong_task"


def test_every_dialect_gives_the_same_vector(served: Daemons, url: str, reference: np.ndarray) -> None:
    """Every route and protocol: Hugging Face, OpenAI (floats and base64), TEI, KServe over HTTP (JSON and
    binary) and over gRPC."""
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    text = TEXTS[2]
    _, headers, hf = post(f"{url}/models/{MODEL}", {"inputs": text})
    _, _, openai_float = post(f"{url}/v1/embeddings", {"model": MODEL, "input": text})
    _, _, openai_b64 = post(f"{url}/v1/embeddings", {"model": MODEL, "input": text, "encoding_format": "base64"})
    _, _, tei = post(f"{url}/embed", {"inputs": text})
    _, _, kserve = post(f"{url}/v2/models/{MODEL}/infer",
                        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]})
    decoded = np.frombuffer(base64.b64decode(openai_b64["data"][0]["embedding"]), dtype="<f4")
    vectors = []
    for module, client in ((triton_http, triton_http.InferenceServerClient(url.removeprefix("http://"))),
                           (triton_grpc, triton_grpc.InferenceServerClient(served["gateway"].endpoints["grpc"]))):
        tensor = module.InferInput("text", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
        vectors.append(client.infer(MODEL, [tensor]).as_numpy("embedding")[0])
    answers = [hf, openai_float["data"][0]["embedding"], decoded, tei[0], kserve["outputs"][0]["data"], *vectors]
    assert all(cosine(answer, reference[2]) >= SAME for answer in answers)
    assert int(headers["X-Tokens"]) == openai_float["usage"]["total_tokens"]


def test_models_listing_says_which_dialects_answer_each_model(url: str) -> None:
    _, _, listing = http_json(f"{url}/models")
    by_name = {model["name"]: model for model in listing["models"]}
    assert by_name[MODEL]["task"] == "embeddings"
    assert "POST /v1/embeddings" in by_name[MODEL]["dialects"]["openai"]
    assert by_name[MODEL]["dialects"]["tei"] == ["POST /embed", "POST /embed_all", "POST /similarity",
                                                 "POST /tokenize", "POST /decode", "GET /info", "GET /health",
                                                 "POST /"]  # the default model: TEI's root
    assert by_name[RERANK]["dialects"]["tei"] == ["POST /rerank"]
    assert by_name[RERANK]["dialects"]["cohere"] == ["POST /v1/rerank", "POST /v2/rerank"]
    assert by_name[CLASSIFY]["dialects"]["tei"] == ["POST /predict"]
    assert "tei" not in by_name[VIT]["dialects"] and "openai" not in by_name[VIT]["dialects"]



# ------------------------------------------------------------------ hostile input, under load


def raw_post(url: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """One POST with exactly these bytes and headers; the status and body (a hang fails the test)."""
    import http.client
    from urllib.parse import urlsplit

    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname or "127.0.0.1", address.port, timeout=30)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def triton_request(name: str, items: list[bytes], header: str | None = None) -> tuple[bytes, dict[str, str]]:
    import struct

    data = b"".join(struct.pack("<I", len(item)) + item for item in items)
    head = (b'{"inputs":[{"name":"%s","datatype":"BYTES","shape":[%d],"parameters":{"binary_data_size":%d}}]}'
            % (name.encode(), len(items), len(data)))
    return head + data, {"Inference-Header-Content-Length": str(len(head)) if header is None else header}


def test_hostile_input_gets_clear_4xx_while_normal_traffic_is_answered(url: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    json_type = {"Content-Type": "application/json"}
    text = triton_request("text", [b"hello"])
    corrupt = triton_request("image", [image_bytes(8, 8, 1), b"\x89PNG\r\n\x1a\n not really"])
    hostile = [
        ("/v1/embeddings", b'{"model": "x", "input":', json_type, 400),
        ("/v1/embeddings", b'{"model": 3, "input": "x"}', json_type, 400),
        ("/embed", b"\xff\xfe", json_type, 422),
        ("/rerank", b'{"query": ["q"], "texts": "t"}', json_type, 422),
        ("/predict", b'{"inputs": [[]]}', json_type, 422),
        ("/similarity", b'{"inputs": {"source_sentence": 1}}', json_type, 422),
        ("/tokenize", b'{"inputs": [null]}', json_type, 422),
        ("/embed_all", b'{"inputs": [], "prompt_name": 5}', json_type, 422),
        ("/decode", b'{"ids": [[1, -2]]}', json_type, 422),
        ("/decode", b'{"ids": [[1, 999999999]]}', json_type, 422),  # outside the vocabulary: the worker says
        ("/embed", b'{"inputs": ["a"], "prompt_name": "none-such"}', json_type, 422),  # the model has no prompts
        (f"/models/{MODEL}", b'{"inputs": {"source_sentence": "a"}}', json_type, 400),
        (f"/models/{VIT}", b'{"inputs": "garbage!!"}', json_type, 400),
        (f"/models/{VIT}", b"GIF89a and no more", {"Content-Type": "image/gif"}, 400),
        (f"/v2/models/{MODEL}/infer", text[0], {"Inference-Header-Content-Length": "999999"}, 400),
        (f"/v2/models/{MODEL}/infer", text[0], {"Inference-Header-Content-Length": "-1"}, 400),
        (f"/v2/models/{MODEL}/infer", text[0], {"Inference-Header-Content-Length": "9" * 40}, 400),
        (f"/v2/models/{MODEL}/infer", text[0][:-2], text[1], 400),
        (f"/v2/models/{VIT}/infer", *corrupt, 400),
    ]
    normal = [("/embed", b'{"inputs": "normal traffic %d"}' % i, json_type, 200) for i in range(24)]
    normal += [("/v1/embeddings", b'{"model": "%s", "input": "more %d"}' % (MODEL.encode(), i), json_type, 200)
               for i in range(24)]
    requests = [item for pair in zip(normal, hostile * 4, strict=False) for item in pair]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda r: raw_post(url, r[0], r[1], r[2]), requests))
    for (path, _, _, expected), (status, body) in zip(requests, answers, strict=True):
        assert status == expected, (path, status, body)
        assert b"Traceback" not in body and body[:1] in (b"{", b"["), (path, body)
    corrupt_answer = raw_post(url, f"/v2/models/{VIT}/infer", *corrupt)
    assert b"inputs[1]" in corrupt_answer[1], corrupt_answer


# ------------------------------------------------------------------ TEI's prompts, sparse, embed_all, decode (issue 35)


@pytest.fixture(scope="module")
def tei_gateway(served: Daemons) -> str:
    """A gateway whose TEI model has prompts (a default one on its worker) and whose sparse model is a SPLADE."""
    broker = served["broker"]
    return served.add(start_http("gateway", "gateway-tei", served.log_dir, frontend=broker.frontend,
                                 tei_model=PROMPTED, tei_sparse_model=SPLADE)).url


def test_tei_prompts_with_requests(folders: dict[str, str], tei_gateway: str) -> None:
    import requests
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(folders[PROMPTED], device="cpu", prompts=PROMPTS)
    named = requests.post(f"{tei_gateway}/embed", json={"inputs": TEXTS, "prompt_name": "passage"}, timeout=30)
    assert named.status_code == 200, named.text
    want = reference.encode(TEXTS, prompt_name="passage", normalize_embeddings=True)
    assert min(cosine(a, b) for a, b in zip(named.json(), want, strict=True)) >= SAME
    default = requests.post(f"{tei_gateway}/embed", json={"inputs": TEXTS[1]}, timeout=30).json()[0]
    assert cosine(default, reference.encode(TEXTS[1], prompt_name="query")) >= SAME  # the worker's default
    tokens = requests.post(f"{tei_gateway}/tokenize", json={"inputs": "hello", "prompt_name": "passage"},
                           timeout=30).json()[0]
    assert [t["text"] for t in tokens] == ["[CLS]", "passage", ":", "hello", "[SEP]"]
    unknown = requests.post(f"{tei_gateway}/embed", json={"inputs": "x", "prompt_name": "nope"}, timeout=30)
    assert unknown.status_code == 422 and "'passage', 'query'" in unknown.json()["error"]
    # The same prompt on the other dialects: the same vector.
    others = [requests.post(f"{tei_gateway}/models/{PROMPTED}", json={"inputs": TEXTS[0], "prompt_name": "passage"},
                            timeout=30).json(),
              requests.post(f"{tei_gateway}/v1/embeddings", json={"model": PROMPTED, "input": TEXTS[0],
                                                                  "prompt_name": "passage"}, timeout=30
                            ).json()["data"][0]["embedding"],
              requests.post(f"{tei_gateway}/v2/models/{PROMPTED}/infer", json={
                  "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [TEXTS[0]]}],
                  "parameters": {"prompt_name": "passage"}}, timeout=30).json()["outputs"][0]["data"]]
    assert all(cosine(other, want[0]) >= SAME for other in others)


def test_tei_embed_sparse_with_requests_and_kserve(folders: dict[str, str], url: str, tei_gateway: str) -> None:
    import requests
    import tritonclient.http as triton
    from sentence_transformers import SparseEncoder

    dense = SparseEncoder(folders[SPLADE], device="cpu").encode(
        TEXTS, convert_to_tensor=True).to_dense().numpy()
    answer = requests.post(f"{tei_gateway}/embed_sparse", json={"inputs": TEXTS}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert int(answer.headers["x-compute-tokens"]) > len(TEXTS)
    for entries, want in zip(answer.json(), dense, strict=True):
        assert [e["index"] for e in entries] == np.flatnonzero(want > 0).tolist()
        np.testing.assert_allclose([e["value"] for e in entries], want[want > 0], rtol=1e-5, atol=1e-6)
    text = triton.InferInput("text", [len(TEXTS)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=np.object_))
    result = triton.InferenceServerClient(tei_gateway.removeprefix("http://")).infer(SPLADE, [text])
    where, indices, values = (result.as_numpy(n) for n in ("batch_index", "indices", "values"))
    for row, want in enumerate(dense):
        assert indices[where == row].tolist() == np.flatnonzero(want > 0).tolist()
        np.testing.assert_allclose(values[where == row], want[want > 0], rtol=1e-5, atol=1e-6)
    one = requests.post(f"{tei_gateway}/embed_sparse", json={"inputs": "x"}, timeout=30)
    assert one.status_code == 200 and len(one.json()) == 1
    dense_route = requests.post(f"{url}/embed_sparse", json={"inputs": "x"}, timeout=30)
    assert dense_route.status_code == 424 and "ZBATCH_TEI_SPARSE_MODEL" in dense_route.json()["error"]


def test_tei_embed_all_and_decode_on_the_real_model(url: str) -> None:
    import requests
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(default_model_path(), device="cpu")
    answer = requests.post(f"{url}/embed_all", json={"inputs": TEXTS}, timeout=30)
    assert answer.status_code == 200, answer.text
    for rows, want in zip(answer.json(), reference.encode(TEXTS, output_value="token_embeddings"), strict=True):
        rows, want = np.asarray(rows), want.numpy()
        assert rows.shape == want.shape and min(cosine(a, b) for a, b in zip(rows, want, strict=True)) >= SAME
    ids = [[t["id"] for t in tokens] for tokens in
           requests.post(f"{url}/tokenize", json={"inputs": TEXTS}, timeout=30).json()]
    decoded = requests.post(f"{url}/decode", json={"ids": ids}, timeout=30).json()
    assert decoded == [text.lower() for text in TEXTS]
    raw = requests.post(f"{url}/decode", json={"ids": ids[1], "skip_special_tokens": False}, timeout=30).json()
    assert raw == ["[CLS] hello world [SEP]"]
    beyond = requests.post(f"{url}/decode", json={"ids": [1, 10**6]}, timeout=30)
    assert beyond.status_code == 422 and "vocabulary" in beyond.json()["error"]
    too_many = requests.post(f"{url}/embed", json={"inputs": ["a"] * 257}, timeout=30)
    assert (too_many.status_code, too_many.json()) == (422, {
        "error": "batch size 257 > maximum allowed batch size 256", "error_type": "Validation"})
