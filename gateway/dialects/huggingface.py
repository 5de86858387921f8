"""The Hugging Face Inference API shapes of ``POST /models/{model}``: texts, sentence similarity, images.

What ``huggingface_hub.InferenceClient(model="http://gateway/models/NAME")`` sends:

* texts: ``{"inputs": str | [str], "parameters": {...}}``; feature extraction puts its
  parameters (``normalize``, ``truncate``, ``truncation_direction``, ``dimensions``,
  ``prompt_name``) at the top level, which is read too.  One output for a string, a
  list for a list.
* sentence similarity: ``{"inputs": {"source_sentence": str, "sentences": [str]}}`` ->
  the cosine similarity of each sentence with the source, for an ``embeddings`` model.
* images, for ``image-classification`` and ``object-detection`` models: the body is
  the image itself (``Content-Type: image/*`` or ``application/octet-stream``; the
  client also sends raw bytes without a type or as ``application/json``, recognised
  by the image file's signature), or JSON whose ``inputs`` are base64 (or ``data:`` URLs) with
  ``parameters``.  An image that cannot be decoded fails alone, with 400.

Whether JSON strings are texts or base64 images depends on the model's task,
which the catalog (gateway/catalog.py) knows without asking the brokers on
every request.  The texts path is the gateway's hot path: one parse, one
request, the outputs written by orjson as they come.  Errors are the
gateway's own shape, from which huggingface_hub reads the message.
"""

from __future__ import annotations

from typing import Any

from aiohttp import hdrs, web

from gateway.config import GatewayConfig
from gateway.dialects import Dialect, require_task
from gateway.errors import ApiError, bad_request
from gateway.inference import Call, call_of, run, with_tokens
from gateway.openapi_parts import EXAMPLE_MODEL, FLAG, TEXTS, TRUNCATION, answer, inference, model_parameter, ref
from gateway.parsing import JSON_TYPES, decode_base64, json_object, model_options, parse_inputs, parse_parameters
from gateway.responses import json_response
from gateway.similarity import similarity, similarity_inputs
from zbatch.protocol import vocabulary
from zbatch.protocol.vocabulary import EMBEDDINGS, IMAGE_TASKS

# Feature extraction's parameters, which huggingface_hub sends next to "inputs".
TOP_LEVEL_PARAMETERS = (vocabulary.NORMALIZE, vocabulary.TRUNCATE, vocabulary.TRUNCATION_DIRECTION,
                        vocabulary.DIMENSIONS, vocabulary.PROMPT_NAME)
BINARY_TYPES = frozenset({"application/octet-stream"})
# The first bytes of the image files the workers decode (PROTOCOL.md 5.2).
IMAGE_SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM", b"II*\x00", b"MM\x00*")


def looks_like_image(body: bytes) -> bool:
    """Whether ``body`` starts like a JPEG, PNG, GIF, BMP, TIFF or WEBP file."""
    return body.startswith(IMAGE_SIGNATURES) or (body[:4] == b"RIFF" and body[8:12] == b"WEBP")


async def post_model(request: web.Request) -> web.Response:
    """Hugging Face Inference API shape: texts, sentence similarity or images, by the body and the model."""
    model = request.match_info["model"]
    call = call_of(request)
    body = await request.read()
    content_type = request.content_type if hdrs.CONTENT_TYPE in request.headers else ""
    if content_type.startswith("image/") or content_type in BINARY_TYPES or (
            not content_type and looks_like_image(body)):
        return await images_answer(call, model, [body], {}, single=True)
    if content_type not in JSON_TYPES:
        raise ApiError("unsupported_media_type", "Content-Type must be application/json, or image/* (or "
                                                 "application/octet-stream) with an image as the body")
    try:
        data = json_object(body)
    except ApiError:
        if looks_like_image(body):
            return await images_answer(call, model, [body], {}, single=True)
        raise
    parameters = parse_parameters(data)
    top_level = model_options(data, TOP_LEVEL_PARAMETERS)
    if top_level:
        parameters = parameters | top_level
    inputs = data.get("inputs")
    if isinstance(inputs, dict):
        source, sentences = similarity_inputs(inputs)
        require_task(model, await call.task_of(model), {EMBEDDINGS}, "sentence similarity")
        scores, result = await similarity(call, model, source, sentences, parameters, "sentence similarity")
        return with_tokens(json_response(scores), result)
    if await call.task_of(model) in IMAGE_TASKS:
        images, single = base64_images(inputs)
        return await images_answer(call, model, images, parameters, single=single)
    texts, single = parse_inputs(data, "inputs")
    result = await run(call, model, texts, parameters)
    return with_tokens(json_response(result.outputs[0] if single else result.outputs), result)


async def images_answer(
    call: Call, model: str, images: list[bytes], parameters: dict[str, Any], *, single: bool
) -> web.Response:
    """Run images through an image model: one output for one image, a list for a list."""
    if not all(images):
        raise bad_request("an image is empty; send the bytes of an image file")
    require_task(model, await call.task_of(model), IMAGE_TASKS, "an image")
    result = await run(call, model, images, parameters, texts=())
    return with_tokens(json_response(result.outputs[0] if single else result.outputs), result)


def base64_images(inputs: Any) -> tuple[list[bytes], bool]:
    """JSON ``inputs`` of an image model: base64 strings (or ``data:`` URLs), one or a list."""
    single = isinstance(inputs, str)
    items = [inputs] if single else inputs
    if not isinstance(items, list) or not items or not all(isinstance(item, str) for item in items):
        raise bad_request('"inputs" of an image model must be an image in base64, or a non-empty list of them '
                          "(or send one image as the body, with Content-Type image/*)")
    return [decode_base64(item, f"inputs[{index}]") for index, item in enumerate(items)], single


def answers(task: str | None, model: str | None, config: GatewayConfig | None) -> list[str]:
    """``POST /models/{model}`` answers every model; sentence similarity needs an embeddings model."""
    path = f"POST /models/{model or '{model}'}"
    return [path, f"{path} (sentence-similarity)"] if task == EMBEDDINGS else [path]


SCHEMAS: dict[str, Any] = {
    "ModelRequest": {
        "type": "object", "required": ["inputs"], "example": {"inputs": ["first text", "second text"]},
        "properties": {
            "inputs": {"oneOf": [TEXTS, {"type": "object", "required": ["source_sentence", "sentences"],
                                         "description": "sentence-similarity (an embeddings model)",
                                         "properties": {"source_sentence": {"type": "string", "minLength": 1},
                                                        "sentences": {"type": "array", "minItems": 1,
                                                                      "items": {"type": "string",
                                                                                "minLength": 1}}}}],
                       "description": "Texts; for an image model, images in base64; or sentence-similarity's "
                                      "source_sentence and sentences"},
            "parameters": {"type": "object", "description": "Passed to the model, e.g. top_k, or an embeddings "
                                                            "model's precision: float16"},
            **TRUNCATION, "normalize": FLAG, "prompt_name": {"type": "string", "minLength": 1},
        },
    },
}
PATHS: dict[str, Any] = {
    "/models/{model}": inference(
        "Run a model (Hugging Face Inference API shapes): texts, sentence-similarity, or images (the body, "
        "or base64 in JSON)",
        {"application/json": {"schema": ref("ModelRequest")},
         "image/png": {"schema": {"type": "string", "format": "binary"}},
         "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        answer("One output for a string or an image body, a list in input order for a list; similarities "
               "for sentence-similarity", {"description": "The model's output for one input"}, tokens=True),
        model_parameter(EXAMPLE_MODEL)),
}

# Its errors are the gateway's own shape: huggingface_hub reads the message from it.
DIALECT = Dialect(name="huggingface", title="Hugging Face", routes=(web.post("/models/{model:.+}", post_model),),
                  openapi_paths=PATHS, openapi_schemas=SCHEMAS, answers=answers, order=10)
