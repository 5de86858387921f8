"""The Open Inference Protocol (KServe v2; Triton, MLServer and tritonclient speak it) under ``/v2``.

Health and metadata: ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``,
``/v2/models/{model}``, ``/v2/models/{model}/ready``.  Inference:
``POST /v2/models/{model}/infer``, in the JSON form or Triton's binary tensor
extension (gateway/dialects/tensors.py), which tritonclient uses by default.

Each task's tensors (every input is BYTES; ``N`` inputs, shape ``[N]`` or ``[N, 1]``):

============================  ==========================  ==========================================
task                          inputs                      outputs
============================  ==========================  ==========================================
embeddings                    ``text``                    ``embedding`` FP32 ``[N, dim]``
rerank                        ``query`` (1, or N),        ``scores`` FP32 ``[N]``
                              ``texts``
text-classification           ``text``, ``text_pair``     ``labels`` BYTES ``[N, k]``, ``scores`` FP32
                              (optional)                  ``[N, k]``, best first
image-classification          ``image`` (image files)     ``labels``, ``scores`` as above
object-detection              ``image``                   ``boxes`` INT32 ``[M, 4]`` (xmin, ymin, xmax,
                                                          ymax), ``labels`` BYTES ``[M]``, ``scores`` FP32
                                                          ``[M]``, ``batch_index`` INT32 ``[M]``: the
                                                          image each detection is in
any other task                ``text``                    ``output`` BYTES ``[N]``: each output as JSON
============================  ==========================  ==========================================

Images are raw bytes in the binary form, base64 text in the JSON form.  The
request's ``parameters`` may set the task's parameters (PROTOCOL.md 5.2:
``normalize``, ``dimensions``, ``truncate``, ``raw_scores``, ``top_k``,
``threshold``...); Triton's own (``binary_data_output``, ``priority``...) are
read or ignored.  Errors are ``{"error": str}`` with the gateway's statuses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from gateway.appkeys import CATALOG, CLIENT, CONFIG
from gateway.catalog import ModelInfo, fleet_stats
from gateway.dialects.huggingface import decode_base64
from gateway.dialects.tensors import (
    HEADER_LENGTH,
    InputTensor,
    OutputTensor,
    encode_answer,
    read_inputs,
    split_body,
)
from gateway.errors import ApiError, bad_request
from gateway.handlers import readiness
from gateway.inference import Result, run, token_headers
from gateway.responses import JSON_OPTIONS, VERSION, json_response
from gateway.tasks import CLASSIFICATION, EMBEDDINGS, IMAGE_CLASSIFICATION, OBJECT_DETECTION, RERANK
from zbatch.client import WorkerError

SERVER = "zbatch"
MODEL_VERSION = "1"
TEXT_PARAMETERS = ("truncate", "truncation_direction")
# The request parameters passed to the worker, by task; others (Triton's own) are not.
PARAMETERS: dict[str | None, tuple[str, ...]] = {
    EMBEDDINGS: ("normalize", "dimensions", *TEXT_PARAMETERS),
    RERANK: ("raw_scores", *TEXT_PARAMETERS),
    IMAGE_CLASSIFICATION: ("top_k",),
    OBJECT_DETECTION: ("threshold",),
    **dict.fromkeys(CLASSIFICATION, ("raw_scores", "top_k", *TEXT_PARAMETERS)),
}


@dataclass(frozen=True)
class Signature:
    """A task's tensors: (name, datatype, shape) of its inputs, optional ones last, and of its outputs."""

    inputs: tuple[tuple[str, str, list[int]], ...]
    outputs: tuple[tuple[str, str, list[int]], ...]
    optional: frozenset[str] = frozenset()


def signature(info: ModelInfo | None) -> Signature:
    """What a model of this task takes and gives (see the module's table)."""
    task = None if info is None else info.task
    scored = (("labels", "BYTES", [-1, -1]), ("scores", "FP32", [-1, -1]))
    if task == EMBEDDINGS:
        dim = (info.dimensions if info else None) or -1
        return Signature((("text", "BYTES", [-1]),), (("embedding", "FP32", [-1, dim]),))
    if task == RERANK:
        return Signature((("query", "BYTES", [-1]), ("texts", "BYTES", [-1])), (("scores", "FP32", [-1]),))
    if task in CLASSIFICATION:
        return Signature((("text", "BYTES", [-1]), ("text_pair", "BYTES", [-1])), scored, frozenset({"text_pair"}))
    if task == IMAGE_CLASSIFICATION:
        return Signature((("image", "BYTES", [-1]),), scored)
    if task == OBJECT_DETECTION:
        return Signature((("image", "BYTES", [-1]),), (("boxes", "INT32", [-1, 4]), ("labels", "BYTES", [-1]),
                                                       ("scores", "FP32", [-1]), ("batch_index", "INT32", [-1])))
    return Signature((("text", "BYTES", [-1]),), (("output", "BYTES", [-1]),))


async def get_server(request: web.Request) -> web.Response:
    """``GET /v2``: the server's name, version and extensions."""
    return json_response({"name": SERVER, "version": VERSION, "extensions": ["binary_tensor_data"]})


async def get_live(request: web.Request) -> web.Response:
    """``GET /v2/health/live``: 200 while the gateway answers."""
    return json_response({"live": True})


async def get_ready(request: web.Request) -> web.Response:
    """``GET /v2/health/ready``: 200 when a broker is ready (as ``/readyz``), else 503 with the reason."""
    by_broker = await request.app[CLIENT].stats_by_broker(timeout_ms=1000)
    required = request.app[CONFIG].required_models
    verdicts = [readiness(stats, required) for stats in by_broker.values()]
    if "ready" not in verdicts:
        raise ApiError("no_worker", "not ready: " + "; ".join(verdicts))
    return json_response({"ready": True})


async def known_model(request: web.Request) -> ModelInfo:
    """The path's model, or 404 if no broker knows it."""
    model = request.match_info["model"]
    info = await request.app[CATALOG].lookup(request.app[CLIENT], model)
    if info is None:
        raise ApiError("unknown_model", f"no broker knows the model {model!r}; GET /models lists them")
    return info


async def get_model(request: web.Request) -> web.Response:
    """``GET /v2/models/{model}``: the model's inputs and outputs, from its task."""
    info = await known_model(request)
    shape = signature(info)
    return json_response({
        "name": info.name, "versions": [MODEL_VERSION], "platform": f"{SERVER}/{info.task or 'unknown'}",
        "inputs": [{"name": n, "datatype": t, "shape": s} for n, t, s in shape.inputs],
        "outputs": [{"name": n, "datatype": t, "shape": s} for n, t, s in shape.outputs],
    })


async def get_model_ready(request: web.Request) -> web.Response:
    """``GET /v2/models/{model}/ready``: 200 while a worker serves the model; 404 unknown, 503 none."""
    model = request.match_info["model"]
    figures = (await fleet_stats(request)).get("models", {}).get(model)
    if figures is None:
        raise ApiError("unknown_model", f"no broker knows the model {model!r}; GET /models lists them")
    if figures.get("workers", 0) < 1:
        raise ApiError("no_worker", f"no worker serves {model!r} right now")
    return json_response({"name": model, "ready": True})


def texts_of(tensor: InputTensor) -> list[str]:
    """A BYTES input as texts: JSON strings as they are, binary elements decoded as UTF-8."""
    texts: list[str] = []
    for index, item in enumerate(tensor.items):
        if isinstance(item, str):
            texts.append(item)
            continue
        try:
            texts.append(item.decode("utf-8"))
        except UnicodeDecodeError:
            raise bad_request(f"input {tensor.name!r}[{index}] is not UTF-8 text") from None
    if not all(texts):
        raise bad_request(f"input {tensor.name!r} holds an empty text")
    return texts


def images_of(tensor: InputTensor) -> list[bytes]:
    """A BYTES input as image files: binary elements as they are, JSON strings from base64."""
    return [decode_base64(item, f"input {tensor.name!r}[{index}]") if isinstance(item, str) else item
            for index, item in enumerate(tensor.items)]


def batch_of(tensors: dict[str, InputTensor], shape: Signature, model: str) -> dict[str, InputTensor]:
    """The inputs the task takes, each of shape [N] or [N, 1]; a missing or unknown one is a 400."""
    expected = [name for name, _, _ in shape.inputs]
    unknown = set(tensors) - set(expected)
    missing = [name for name in expected if name not in tensors and name not in shape.optional]
    if unknown or missing:
        raise bad_request(f"model {model!r} takes the BYTES inputs {', '.join(expected)}"
                          f"{' (' + ', '.join(sorted(shape.optional)) + ' optional)' if shape.optional else ''}; "
                          f"got {', '.join(sorted(tensors))}")
    for tensor in tensors.values():
        if not tensor.shape or any(d != 1 for d in tensor.shape[1:]):
            raise bad_request(f"input {tensor.name!r} must have shape [N] or [N, 1], not {list(tensor.shape)}")
    return tensors


async def infer_embeddings(request: web.Request, model: str, tensors: dict[str, InputTensor],
                           parameters: dict[str, Any]) -> tuple[Result, list[OutputTensor]]:
    texts = texts_of(tensors["text"])
    result = await run(request, model, texts, parameters)
    vectors = np.stack([np.asarray(v, dtype=np.float32) for v in result.outputs])
    return result, [OutputTensor("embedding", "FP32", vectors.shape, vectors)]


async def infer_rerank(request: web.Request, model: str, tensors: dict[str, InputTensor],
                       parameters: dict[str, Any]) -> tuple[Result, list[OutputTensor]]:
    queries, texts = texts_of(tensors["query"]), texts_of(tensors["texts"])
    if len(queries) not in (1, len(texts)):
        raise bad_request(f"input 'query' has {len(queries)} texts: give one, or one per text ({len(texts)})")
    pairs = [[queries[0] if len(queries) == 1 else queries[i], text] for i, text in enumerate(texts)]
    result = await run(request, model, pairs, parameters, texts=[*queries, *texts])
    scores = np.asarray(result.outputs, dtype=np.float32)
    return result, [OutputTensor("scores", "FP32", scores.shape, scores)]


def scored(outputs: list[Any]) -> list[OutputTensor]:
    """``labels`` and ``scores`` of shape [N, k] from each input's ``[{"label", "score"}, ...]``."""
    k = len(outputs[0]) if outputs else 0
    if any(len(row) != k for row in outputs):
        raise WorkerError("the worker gave inputs different numbers of labels")
    labels = [str(entry["label"]).encode() for row in outputs for entry in row]
    scores = np.asarray([[entry["score"] for entry in row] for row in outputs], dtype=np.float32).reshape(-1, k)
    return [OutputTensor("labels", "BYTES", (len(outputs), k), labels),
            OutputTensor("scores", "FP32", scores.shape, scores)]


async def infer_classification(request: web.Request, model: str, tensors: dict[str, InputTensor],
                               parameters: dict[str, Any]) -> tuple[Result, list[OutputTensor]]:
    texts = texts_of(tensors["text"])
    inputs: list[Any] = texts
    if "text_pair" in tensors:
        pairs = texts_of(tensors["text_pair"])
        if len(pairs) != len(texts):
            raise bad_request(f"input 'text_pair' has {len(pairs)} texts; give one per text ({len(texts)})")
        inputs = [list(pair) for pair in zip(texts, pairs, strict=True)]
    result = await run(request, model, inputs, parameters, texts=[t for i in inputs for t in
                                                                  (i if isinstance(i, list) else [i])])
    return result, scored(result.outputs)


async def infer_image_classification(request: web.Request, model: str, tensors: dict[str, InputTensor],
                                     parameters: dict[str, Any]) -> tuple[Result, list[OutputTensor]]:
    result = await run(request, model, images_of(tensors["image"]), parameters, texts=())
    return result, scored(result.outputs)


async def infer_detection(request: web.Request, model: str, tensors: dict[str, InputTensor],
                          parameters: dict[str, Any]) -> tuple[Result, list[OutputTensor]]:
    result = await run(request, model, images_of(tensors["image"]), parameters, texts=())
    found = [(index, d) for index, detections in enumerate(result.outputs) for d in detections]
    boxes = np.asarray([[d["box"][k] for k in ("xmin", "ymin", "xmax", "ymax")] for _, d in found],
                       dtype=np.int32).reshape(-1, 4)
    scores = np.asarray([d["score"] for _, d in found], dtype=np.float32)
    where = np.asarray([index for index, _ in found], dtype=np.int32)
    labels = [str(d["label"]).encode() for _, d in found]
    return result, [OutputTensor("boxes", "INT32", boxes.shape, boxes),
                    OutputTensor("labels", "BYTES", (len(found),), labels),
                    OutputTensor("scores", "FP32", scores.shape, scores),
                    OutputTensor("batch_index", "INT32", where.shape, where)]


async def infer_other(request: web.Request, model: str, tensors: dict[str, InputTensor],
                      parameters: dict[str, Any]) -> tuple[Result, list[OutputTensor]]:
    result = await run(request, model, texts_of(tensors["text"]), parameters)
    encoded = [orjson.dumps(output, option=JSON_OPTIONS) for output in result.outputs]
    return result, [OutputTensor("output", "BYTES", (len(encoded),), encoded)]


Runner = Callable[[web.Request, str, dict[str, InputTensor], dict[str, Any]],
                  Awaitable[tuple[Result, list[OutputTensor]]]]
RUNNERS: dict[str, Runner] = {
    EMBEDDINGS: infer_embeddings, RERANK: infer_rerank, IMAGE_CLASSIFICATION: infer_image_classification,
    OBJECT_DETECTION: infer_detection, **dict.fromkeys(CLASSIFICATION, infer_classification),
}


def task_parameters(request_json: dict[str, Any], task: str | None) -> dict[str, Any]:
    """The request parameters the task takes (the worker checks their values)."""
    given = request_json.get("parameters") or {}
    if not isinstance(given, dict):
        raise bad_request('"parameters" must be an object')
    return {name: given[name] for name in PARAMETERS.get(task, ()) if given.get(name) is not None}


def chosen_outputs(request_json: dict[str, Any], names: list[str]) -> tuple[list[str], set[str]]:
    """The outputs asked for (all by default), in order, and which of them go in binary."""
    given = request_json.get("parameters")
    everything = isinstance(given, dict) and given.get("binary_data_output") is True
    asked = request_json.get("outputs")
    if asked is None:
        return names, set(names) if everything else set()
    if not isinstance(asked, list) or not all(isinstance(a, dict) and a.get("name") in names for a in asked):
        raise bad_request(f'"outputs" must list outputs of this model by name: {", ".join(names)}')
    binary = set()
    for entry in asked:
        options = entry.get("parameters")
        flag = options.get("binary_data") if isinstance(options, dict) else None
        if flag is True or (flag is None and everything):
            binary.add(entry["name"])
    return [entry["name"] for entry in asked], binary


async def post_infer(request: web.Request) -> web.Response:
    """``POST /v2/models/{model}/infer``: the task's tensors in (JSON or binary form), its outputs back."""
    model = request.match_info["model"]
    request_json, binary = split_body(await request.read(), request.headers.get(HEADER_LENGTH))
    tensors = read_inputs(request_json, binary)
    info = await request.app[CATALOG].lookup(request.app[CLIENT], model)
    task = None if info is None else info.task
    shape = signature(info)
    batch = batch_of(tensors, shape, model)
    names, in_binary = chosen_outputs(request_json, [name for name, _, _ in shape.outputs])
    parameters = task_parameters(request_json, task)
    result, outputs = await RUNNERS.get(task or "", infer_other)(request, model, batch, parameters)
    by_name = {output.name: output for output in outputs}
    head: dict[str, Any] = {"model_name": model, "model_version": MODEL_VERSION}
    if isinstance(request_json.get("id"), str):
        head["id"] = request_json["id"]
    answer, header_length = encode_answer(head, [by_name[name] for name in names], in_binary)
    headers = token_headers(result)
    if header_length is None:
        return web.Response(body=answer, content_type="application/json", headers=headers)
    headers[HEADER_LENGTH] = str(header_length)
    return web.Response(body=answer, content_type="application/octet-stream", headers=headers)
