"""Each task's KServe v2 tensors, and running them: what both KServe protocols (HTTP and gRPC) answer with.

Every input is BYTES; ``N`` inputs, shape ``[N]`` or ``[N, 1]``:

============================  ==========================  ==========================================
task                          inputs                      outputs
============================  ==========================  ==========================================
embeddings                    ``text``                    ``embedding`` FP32 ``[N, dim]``
sparse-embeddings             ``text``                    ``indices`` INT32 ``[M]`` (vocabulary
                                                          entries), ``values`` FP32 ``[M]`` (their
                                                          weights), ``batch_index`` INT32 ``[M]``:
                                                          the text each entry is of
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

A request's parameters may set the task's parameters (:data:`PARAMETERS`;
PROTOCOL.md 5.2); others (Triton's own) are not passed on.  An embeddings
request with ``precision`` ``float16`` gets its ``embedding`` as FP16: the
worker's half-size vectors as they came, half the bytes in the binary form.
The server's and models' health and metadata, which both protocols answer
too, are here as well.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from gateway.catalog import Catalog, ModelInfo, readiness
from gateway.config import GatewayConfig
from gateway.errors import ApiError, bad_request
from gateway.inference import Call, Result, run
from gateway.parsing import decode_base64
from gateway.responses import JSON_OPTIONS, VERSION
from gateway.tensors import InputTensor, OutputTensor
from zbatch.client import AsyncClient, WorkerError
from zbatch.client.stats import merge_stats
from zbatch.protocol import vocabulary as v

SERVER = "zbatch"
MODEL_VERSION = "1"
READY_PROBE_TIMEOUT_MS = 1000
TEXT_PARAMETERS = (v.TRUNCATE, v.TRUNCATION_DIRECTION)
# The request parameters passed to the worker, by task; others (Triton's own) are not.
PARAMETERS: dict[str | None, tuple[str, ...]] = {
    v.EMBEDDINGS: (v.NORMALIZE, v.DIMENSIONS, v.PROMPT_NAME, v.PRECISION, *TEXT_PARAMETERS),
    v.SPARSE_EMBEDDINGS: (v.PROMPT_NAME, *TEXT_PARAMETERS),
    v.RERANK: (v.RAW_SCORES, *TEXT_PARAMETERS),
    v.IMAGE_CLASSIFICATION: (v.TOP_K,),
    v.OBJECT_DETECTION: (v.THRESHOLD,),
    **dict.fromkeys(v.CLASSIFICATION, (v.RAW_SCORES, v.TOP_K, *TEXT_PARAMETERS)),
}
Tensor = tuple[str, str, list[int]]  # name, datatype, shape (-1: any size)


@dataclass(frozen=True)
class Signature:
    """A task's tensors: (name, datatype, shape) of its inputs, optional ones last, and of its outputs.

    ``batched``: every tensor's first dimension is the batch, one element or row per input (not so where
    outputs are flat lists over the whole request: sparse entries, detections).
    """

    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    optional: frozenset[str] = frozenset()
    batched: bool = True

    @property
    def output_names(self) -> list[str]:
        return [name for name, _, _ in self.outputs]


def signature(info: ModelInfo | None) -> Signature:
    """What a model of this task takes and gives (see the module's table)."""
    task = None if info is None else info.task
    text = (("text", "BYTES", [-1]),)
    scored = (("labels", "BYTES", [-1, -1]), ("scores", "FP32", [-1, -1]))
    if task == v.EMBEDDINGS:
        dim = (info.dimensions if info else None) or -1
        return Signature(text, (("embedding", "FP32", [-1, dim]),))
    if task == v.SPARSE_EMBEDDINGS:
        return Signature(text, (("indices", "INT32", [-1]), ("values", "FP32", [-1]),
                                ("batch_index", "INT32", [-1])), batched=False)
    if task == v.RERANK:
        return Signature((("query", "BYTES", [-1]), ("texts", "BYTES", [-1])), (("scores", "FP32", [-1]),))
    if task in v.CLASSIFICATION:
        return Signature((*text, ("text_pair", "BYTES", [-1])), scored, frozenset({"text_pair"}))
    if task == v.IMAGE_CLASSIFICATION:
        return Signature((("image", "BYTES", [-1]),), scored)
    if task == v.OBJECT_DETECTION:
        return Signature((("image", "BYTES", [-1]),), (("boxes", "INT32", [-1, 4]), ("labels", "BYTES", [-1]),
                                                       ("scores", "FP32", [-1]), ("batch_index", "INT32", [-1])),
                         batched=False)
    return Signature(text, (("output", "BYTES", [-1]),))


def task_parameters(given: Mapping[str, Any], task: str | None) -> dict[str, Any]:
    """The request parameters the task takes (the worker checks their values)."""
    return {name: given[name] for name in PARAMETERS.get(task, ()) if given.get(name) is not None}


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
        if not tensor.items:
            raise bad_request(f"input {tensor.name!r} is empty: give it at least one element")
    return tensors


Outputs = tuple[Result, list[OutputTensor]]
Runner = Callable[[Call, str, dict[str, InputTensor], dict[str, Any]], Awaitable[Outputs]]


async def infer_embeddings(call: Call, model: str, tensors: dict[str, InputTensor],
                           parameters: dict[str, Any]) -> Outputs:
    result = await run(call, model, texts_of(tensors["text"]), parameters)
    vectors = np.stack([np.asarray(vector) for vector in result.outputs])
    if vectors.dtype == np.float16:  # asked for (precision float16): sent as the worker made them
        return result, [OutputTensor("embedding", "FP16", vectors.shape, vectors)]
    vectors = vectors.astype(np.float32, copy=False)
    return result, [OutputTensor("embedding", "FP32", vectors.shape, vectors)]


async def infer_sparse(call: Call, model: str, tensors: dict[str, InputTensor],
                       parameters: dict[str, Any]) -> Outputs:
    result = await run(call, model, texts_of(tensors["text"]), parameters)
    indices = [np.asarray(output[v.SPARSE_INDICES], dtype=np.int32) for output in result.outputs]
    values = np.concatenate([np.asarray(output[v.SPARSE_VALUES], dtype=np.float32) for output in result.outputs])
    where = np.concatenate([np.full(len(found), text, dtype=np.int32) for text, found in enumerate(indices)])
    flat = np.concatenate(indices)
    return result, [OutputTensor("indices", "INT32", flat.shape, flat),
                    OutputTensor("values", "FP32", values.shape, values),
                    OutputTensor("batch_index", "INT32", where.shape, where)]


async def infer_rerank(call: Call, model: str, tensors: dict[str, InputTensor],
                       parameters: dict[str, Any]) -> Outputs:
    queries, texts = texts_of(tensors["query"]), texts_of(tensors["texts"])
    if len(queries) not in (1, len(texts)):
        raise bad_request(f"input 'query' has {len(queries)} texts: give one, or one per text ({len(texts)})")
    pairs = [[queries[0] if len(queries) == 1 else queries[i], text] for i, text in enumerate(texts)]
    result = await run(call, model, pairs, parameters, texts=[*queries, *texts])
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


async def infer_classification(call: Call, model: str, tensors: dict[str, InputTensor],
                               parameters: dict[str, Any]) -> Outputs:
    texts = texts_of(tensors["text"])
    inputs: list[Any] = texts
    if "text_pair" in tensors:
        pairs = texts_of(tensors["text_pair"])
        if len(pairs) != len(texts):
            raise bad_request(f"input 'text_pair' has {len(pairs)} texts; give one per text ({len(texts)})")
        inputs = [list(pair) for pair in zip(texts, pairs, strict=True)]
    result = await run(call, model, inputs, parameters, texts=[t for i in inputs for t in
                                                               (i if isinstance(i, list) else [i])])
    return result, scored(result.outputs)


async def infer_image_classification(call: Call, model: str, tensors: dict[str, InputTensor],
                                     parameters: dict[str, Any]) -> Outputs:
    result = await run(call, model, images_of(tensors["image"]), parameters, texts=())
    return result, scored(result.outputs)


async def infer_detection(call: Call, model: str, tensors: dict[str, InputTensor],
                          parameters: dict[str, Any]) -> Outputs:
    result = await run(call, model, images_of(tensors["image"]), parameters, texts=())
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


async def infer_other(call: Call, model: str, tensors: dict[str, InputTensor],
                      parameters: dict[str, Any]) -> Outputs:
    result = await run(call, model, texts_of(tensors["text"]), parameters)
    encoded = [orjson.dumps(output, option=JSON_OPTIONS) for output in result.outputs]
    return result, [OutputTensor("output", "BYTES", (len(encoded),), encoded)]


RUNNERS: dict[str, Runner] = {
    v.EMBEDDINGS: infer_embeddings, v.SPARSE_EMBEDDINGS: infer_sparse, v.RERANK: infer_rerank,
    v.IMAGE_CLASSIFICATION: infer_image_classification, v.OBJECT_DETECTION: infer_detection,
    **dict.fromkeys(v.CLASSIFICATION, infer_classification),
}


async def infer(call: Call, model: str, info: ModelInfo | None, tensors: dict[str, InputTensor],
                given: Mapping[str, Any]) -> Outputs:
    """Run the model on its task's tensors: the worker's result and the task's outputs, all of them in order."""
    task = None if info is None else info.task
    batch = batch_of(tensors, signature(info), model)
    return await RUNNERS.get(task or "", infer_other)(call, model, batch, task_parameters(given, task))


async def server_ready(client: AsyncClient, config: GatewayConfig) -> None:
    """Return when a broker is ready (as ``/readyz``); else ``no_worker`` with every broker's reason."""
    by_broker = await client.stats_by_broker(timeout_ms=READY_PROBE_TIMEOUT_MS)
    verdicts = [readiness(stats, config.required_models) for stats in by_broker.values()]
    if "ready" not in verdicts:
        raise ApiError("no_worker", "not ready: " + "; ".join(verdicts))


async def known_model(client: AsyncClient, catalog: Catalog, model: str) -> ModelInfo:
    """``model`` as the catalog knows it, or ``unknown_model`` if no broker knows it."""
    info = await catalog.lookup(client, model)
    if info is None:
        raise ApiError("unknown_model", f"no broker knows the model {model!r}; GET /models lists them")
    return info


async def model_ready(client: AsyncClient, catalog: Catalog, model: str) -> None:
    """Return while a worker serves ``model``; else ``unknown_model`` (no broker knows it) or ``no_worker``."""
    stats = merge_stats(await client.stats_by_broker())
    catalog.update(stats)
    figures = stats.get("models", {}).get(model)
    if figures is None:
        raise ApiError("unknown_model", f"no broker knows the model {model!r}; GET /models lists them")
    if figures.get("workers", 0) < 1:
        raise ApiError("no_worker", f"no worker serves {model!r} right now")


def model_metadata(info: ModelInfo) -> dict[str, Any]:
    """The model's name, versions, platform (``zbatch/TASK``) and tensors, as both protocols describe it."""
    shape = signature(info)
    return {"name": info.name, "versions": [MODEL_VERSION], "platform": f"{SERVER}/{info.task or 'unknown'}",
            "inputs": [{"name": n, "datatype": t, "shape": s} for n, t, s in shape.inputs],
            "outputs": [{"name": n, "datatype": t, "shape": s} for n, t, s in shape.outputs]}


def server_metadata(extensions: tuple[str, ...] = ()) -> dict[str, Any]:
    """The server's name, version and the protocol extensions of the protocol asking."""
    return {"name": SERVER, "version": VERSION, "extensions": list(extensions)}
