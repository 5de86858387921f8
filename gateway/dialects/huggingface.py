"""The Hugging Face Inference API shapes of ``POST /models/{model}``: texts, sentence similarity, images.

What ``huggingface_hub.InferenceClient(model="http://gateway/models/NAME")`` sends:

* texts: ``{"inputs": str | [str], "parameters": {...}}``; feature extraction puts its
  parameters (``normalize``, ``truncate``, ``truncation_direction``) at the top level,
  which is read too.  One output for a string, a list for a list.
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
request, the outputs written by orjson as they come.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np
from aiohttp import hdrs, web

from gateway.appkeys import CATALOG, CLIENT
from gateway.errors import ApiError, bad_request
from gateway.inference import Result, run, with_tokens
from gateway.parsing import JSON_TYPES, json_object, model_options, parse_inputs, parse_parameters
from gateway.responses import json_response
from gateway.tasks import EMBEDDINGS, IMAGE_TASKS, require_task

# Feature extraction's parameters, which huggingface_hub sends next to "inputs".
TOP_LEVEL_PARAMETERS = ("normalize", "truncate", "truncation_direction", "dimensions", "prompt_name")
BINARY_TYPES = frozenset({"application/octet-stream"})
# The first bytes of the image files the workers decode (PROTOCOL.md 5.2).
IMAGE_SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM", b"II*\x00", b"MM\x00*")


def looks_like_image(body: bytes) -> bool:
    """Whether ``body`` starts like a JPEG, PNG, GIF, BMP, TIFF or WEBP file."""
    return body.startswith(IMAGE_SIGNATURES) or (body[:4] == b"RIFF" and body[8:12] == b"WEBP")


async def task_of(request: web.Request, model: str) -> str | None:
    """The model's task, from the catalog; None while unknown."""
    info = await request.app[CATALOG].lookup(request.app[CLIENT], model)
    return None if info is None else info.task


async def post_model(request: web.Request) -> web.Response:
    """Hugging Face Inference API shape: texts, sentence similarity or images, by the body and the model."""
    model = request.match_info["model"]
    body = await request.read()
    content_type = request.content_type if hdrs.CONTENT_TYPE in request.headers else ""
    if content_type.startswith("image/") or content_type in BINARY_TYPES or (
            not content_type and looks_like_image(body)):
        return await images_answer(request, model, [body], {}, single=True)
    if content_type not in JSON_TYPES:
        raise ApiError("unsupported_media_type", "Content-Type must be application/json, or image/* (or "
                                                 "application/octet-stream) with an image as the body")
    try:
        data = json_object(body)
    except ApiError:
        if looks_like_image(body):
            return await images_answer(request, model, [body], {}, single=True)
        raise
    parameters = parse_parameters(data)
    top_level = model_options(data, TOP_LEVEL_PARAMETERS)
    if top_level:
        parameters = parameters | top_level
    inputs = data.get("inputs")
    if isinstance(inputs, dict):
        scores, result = await similarity(request, model, *similarity_inputs(inputs), parameters,
                                          "sentence similarity")
        return with_tokens(json_response(scores), result)
    if await task_of(request, model) in IMAGE_TASKS:
        images, single = base64_images(inputs)
        return await images_answer(request, model, images, parameters, single=single)
    texts, single = parse_inputs(data, "inputs")
    result = await run(request, model, texts, parameters)
    return with_tokens(json_response(result.outputs[0] if single else result.outputs), result)


async def images_answer(
    request: web.Request, model: str, images: list[bytes], parameters: dict[str, Any], *, single: bool
) -> web.Response:
    """Run images through an image model: one output for one image, a list for a list."""
    if not all(images):
        raise bad_request("an image is empty; send the bytes of an image file")
    require_task(model, await task_of(request, model), IMAGE_TASKS, "an image")
    result = await run(request, model, images, parameters, texts=())
    return with_tokens(json_response(result.outputs[0] if single else result.outputs), result)


def base64_images(inputs: Any) -> tuple[list[bytes], bool]:
    """JSON ``inputs`` of an image model: base64 strings (or ``data:`` URLs), one or a list."""
    single = isinstance(inputs, str)
    items = [inputs] if single else inputs
    if not isinstance(items, list) or not items or not all(isinstance(item, str) for item in items):
        raise bad_request('"inputs" of an image model must be an image in base64, or a non-empty list of them '
                          "(or send one image as the body, with Content-Type image/*)")
    return [decode_base64(item, f"inputs[{index}]") for index, item in enumerate(items)], single


def decode_base64(text: str, where: str) -> bytes:
    """One base64 image, a ``data:...;base64,`` prefix allowed; 400 for anything else."""
    if text.startswith("data:"):
        text = text.partition(",")[2]
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{where} is not base64: send the image file's bytes in base64") from None


def similarity_inputs(inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """``{"source_sentence": str, "sentences": [str]}``, checked."""
    source, sentences = inputs.get("source_sentence"), inputs.get("sentences")
    if not isinstance(source, str) or not source:
        raise bad_request('"inputs.source_sentence" must be a non-empty string')
    if (not isinstance(sentences, list) or not sentences
            or not all(isinstance(s, str) and s for s in sentences)):
        raise bad_request('"inputs.sentences" must be a non-empty list of non-empty strings')
    return source, sentences


async def similarity(
    request: web.Request, model: str, source: str, sentences: list[str], parameters: dict[str, Any], route: str,
) -> tuple[list[float], Result]:
    """The cosine similarity of each sentence with ``source``, from one request to an embeddings model."""
    require_task(model, await task_of(request, model), {EMBEDDINGS}, route)
    result = await run(request, model, [source, *sentences], parameters)
    vectors = np.asarray(result.outputs, dtype=np.float32)
    if vectors.ndim != 2:
        raise ApiError("wrong_task", f"{route} needs an embeddings model; {model!r} does not answer vectors")
    norms = np.linalg.norm(vectors, axis=1)
    norms[norms == 0] = 1.0
    unit = vectors / norms[:, None]
    scores: list[float] = (unit[1:] @ unit[0]).tolist()
    return scores, result
