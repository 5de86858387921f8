"""The Open Inference Protocol (KServe v2; Triton, MLServer and tritonclient speak it) over HTTP, under ``/v2``.

Health and metadata: ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``,
``/v2/models/{model}``, ``/v2/models/{model}/ready``, and Triton's model
configuration, ``/v2/models/{model}/config`` (gateway/model_config.py), which
``perf_analyzer`` reads before it sends anything.  Inference:
``POST /v2/models/{model}/infer``, in the JSON form or Triton's binary tensor
extension, which tritonclient uses by default.  Each task's tensors are
gateway/signatures.py's, which the gRPC service (gateway/grpc/) shares.

A request is JSON, or (binary form) JSON followed by raw tensor bytes: the
``Inference-Header-Content-Length`` header says how long the JSON part is,
and each input with ``parameters.binary_data_size`` takes that many of the
bytes after it, in input order (gateway/tensors.py reads a BYTES tensor's
bytes).  Answers follow the same rules: outputs asked for in binary
(``binary_data`` on the output, or ``binary_data_output`` for all) come after
the JSON, whose length the answer's header gives.  Every length is checked
against the body before it is used: a header longer than the body, a
negative or non-numeric one, sizes that overrun or leave bytes unclaimed,
element counts that do not match the shape are each a 400 that says what is
wrong.

Images are raw bytes in the binary form, base64 text in the JSON form.  The
request's ``parameters`` may set the task's parameters; Triton's own
(``binary_data_output``, ``priority``...) are read or ignored.  Errors are
``{"error": str}`` with the gateway's statuses.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from gateway.appkeys import CLIENT, CONFIG
from gateway.catalog import CATALOG
from gateway.config import GatewayConfig
from gateway.dialects import Dialect
from gateway.errors import ApiError, ErrorShape, bad_request
from gateway.inference import call_of, token_headers
from gateway.model_config import model_config
from gateway.openapi_parts import (
    BROKER_QUERY_ERRORS,
    EXAMPLE_MODEL,
    answer,
    get,
    inference,
    model_parameter,
    object_schema,
    ref,
)
from gateway.parsing import json_object
from gateway.responses import json_response
from gateway.signatures import (
    MODEL_VERSION,
    infer,
    known_model,
    model_metadata,
    model_ready,
    server_metadata,
    server_ready,
    signature,
)
from gateway.tensors import MAX_DIMENSIONS, InputTensor, OutputTensor, checked_shape, holding, split_elements

HEADER_LENGTH = "Inference-Header-Content-Length"
MAX_HEADER_DIGITS = 10
EXTENSIONS = ("binary_tensor_data",)
JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def error_answer(error: ApiError) -> tuple[int, Any]:
    return error.status, {"error": error.message}


ERRORS = ErrorShape("KServeError", object_schema(["error"], {"error": {"type": "string"}}), error_answer)


async def get_server(request: web.Request) -> web.Response:
    """``GET /v2``: the server's name, version and extensions."""
    return json_response(server_metadata(EXTENSIONS))


async def get_live(request: web.Request) -> web.Response:
    """``GET /v2/health/live``: 200 while the gateway answers."""
    return json_response({"live": True})


async def get_ready(request: web.Request) -> web.Response:
    """``GET /v2/health/ready``: 200 when a broker is ready (as ``/readyz``), else 503 with the reason."""
    await server_ready(request.app[CLIENT], request.app[CONFIG])
    return json_response({"ready": True})


async def get_model(request: web.Request) -> web.Response:
    """``GET /v2/models/{model}``: the model's inputs and outputs, from its task."""
    info = await known_model(request.app[CLIENT], request.app[CATALOG], request.match_info["model"])
    return json_response(model_metadata(info))


async def get_model_config(request: web.Request) -> web.Response:
    """``GET /v2/models/{model}/config``: Triton's configuration of the model, from its task."""
    info = await known_model(request.app[CLIENT], request.app[CATALOG], request.match_info["model"])
    return json_response(model_config(info, request.app[CONFIG].max_inputs))


async def get_model_ready(request: web.Request) -> web.Response:
    """``GET /v2/models/{model}/ready``: 200 while a worker serves the model; 404 unknown, 503 none."""
    model = request.match_info["model"]
    await model_ready(request.app[CLIENT], request.app[CATALOG], model)
    return json_response({"name": model, "ready": True})


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
    given = request_json.get("parameters") or {}
    if not isinstance(given, dict):
        raise bad_request('"parameters" must be an object')
    call = call_of(request)
    info = await call.catalog.lookup(call.client, model)
    names, in_binary = chosen_outputs(request_json, signature(info).output_names)
    result, outputs = await infer(call, model, info, tensors, given)
    by_name = {output.name: output for output in outputs}
    head: dict[str, Any] = {"model_name": model, "model_version": MODEL_VERSION}
    if isinstance(request_json.get("id"), str):
        head["id"] = request_json["id"]
    body, header_length = encode_answer(head, [by_name[name] for name in names], in_binary)
    headers = token_headers(result)
    if header_length is None:
        return web.Response(body=body, content_type="application/json", headers=headers)
    headers[HEADER_LENGTH] = str(header_length)
    return web.Response(body=body, content_type="application/octet-stream", headers=headers)


def split_body(body: bytes, header_length: str | None) -> tuple[dict[str, Any], memoryview]:
    """The request's JSON part and the bytes after it (empty without ``Inference-Header-Content-Length``)."""
    view = memoryview(body)
    if header_length is None:
        return json_object(view), view[len(view):]
    raw = header_length.strip()
    if not (raw.isascii() and raw.isdigit() and len(raw) <= MAX_HEADER_DIGITS):
        raise bad_request(f"{HEADER_LENGTH} must be the length in bytes of the JSON part of the body, a whole "
                          f"number, not {raw[:20]!r}")
    length = int(raw)
    if length > len(view):
        raise bad_request(f"{HEADER_LENGTH} says the JSON part has {length} bytes, but the whole body has "
                          f"{len(view)}")
    return json_object(view[:length]), view[length:]


def read_inputs(request: dict[str, Any], binary: memoryview) -> dict[str, InputTensor]:
    """The request's inputs by name, all BYTES, their elements taken from JSON ``data`` or the binary part."""
    entries = request.get("inputs")
    if not isinstance(entries, list) or not entries:
        raise bad_request('"inputs" must be a non-empty list of tensors {"name", "datatype", "shape", "data"}')
    tensors: dict[str, InputTensor] = {}
    offset = 0
    for entry in entries:
        if not isinstance(entry, dict):
            raise bad_request('each of "inputs" must be an object {"name", "datatype", "shape", "data"}')
        name = entry.get("name")
        if not isinstance(name, str) or not name or name in tensors:
            raise bad_request("each input needs a name of its own (a non-empty string)")
        shape = checked_shape(entry.get("shape"), name)
        if entry.get("datatype") != "BYTES":
            raise bad_request(f"input {name!r} is {str(entry.get('datatype'))[:16]!r}; inputs are BYTES: texts, "
                              "or images")
        parameters = entry.get("parameters") or {}
        size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= len(binary) - offset:
                raise bad_request(f"input {name!r}: binary_data_size must be a whole number of bytes within the "
                                  f"{len(binary) - offset} binary bytes left in the body")
            items: list[bytes | str] = list(split_elements(binary[offset:offset + size], name))
            offset += size
        else:
            items = json_elements(entry.get("data"), name)
        tensors[name] = holding(name, items, shape)
    if offset != len(binary):
        raise bad_request(f"the body has {len(binary) - offset} bytes after the inputs' binary data that no input "
                          "claims; check binary_data_size")
    return tensors


def json_elements(data: Any, name: str) -> list[bytes | str]:
    """A BYTES tensor's elements from the JSON form: strings, flat or nested as the shape."""
    flat: list[bytes | str] = []

    def add(value: Any, depth: int) -> None:
        if isinstance(value, str):
            flat.append(value)
        elif isinstance(value, list) and depth < MAX_DIMENSIONS:
            for item in value:
                add(item, depth + 1)
        else:
            raise bad_request(f'input {name!r}: "data" must hold strings (texts, or images in base64), in a list')

    if not isinstance(data, list):
        raise bad_request(f'input {name!r} needs "data" (a list), or parameters.binary_data_size (binary form)')
    add(data, 0)
    return flat


def encode_answer(head: dict[str, Any], outputs: list[OutputTensor], binary: set[str]) -> tuple[bytes, int | None]:
    """The answer's body, and the length of its JSON part when outputs in ``binary`` follow it (else None)."""
    described, blobs = [], []
    for output in outputs:
        entry: dict[str, Any] = {"name": output.name, "datatype": output.datatype, "shape": list(output.shape)}
        if output.name in binary:
            raw = output.raw()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = output.json_data()
        described.append(entry)
    header = orjson.dumps(head | {"outputs": described}, option=JSON_OPTIONS)
    if not blobs:
        return header, None
    return header + b"".join(blobs), len(header)


def answers(task: str | None, model: str | None, config: GatewayConfig | None) -> list[str]:
    """Every model has its tensors (gateway/signatures.py)."""
    return [f"POST /v2/models/{model or '{model}'}/infer"]


SCHEMAS: dict[str, Any] = {
    ERRORS.schema_name: ERRORS.schema,
    "ServerMetadata": object_schema(["name", "version", "extensions"], {
        "name": {"type": "string"}, "version": {"type": "string"},
        "extensions": {"type": "array", "items": {"type": "string"}}}),
    "TensorMetadata": object_schema(["name", "datatype", "shape"], {
        "name": {"type": "string"}, "datatype": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}}}),
    "ModelMetadata": object_schema(["name", "platform", "inputs", "outputs"], {
        "name": {"type": "string"}, "versions": {"type": "array", "items": {"type": "string"}},
        "platform": {"type": "string", "description": "zbatch/TASK"},
        "inputs": {"type": "array", "items": ref("TensorMetadata")},
        "outputs": {"type": "array", "items": ref("TensorMetadata")}}),
    "ModelConfig": object_schema(["name", "max_batch_size", "input", "output"], {
        "name": {"type": "string"}, "platform": {"type": "string"}, "backend": {"type": "string"},
        "max_batch_size": {"type": "integer", "minimum": 0},
        "input": {"type": "array", "items": ref("ModelTensorConfig")},
        "output": {"type": "array", "items": ref("ModelTensorConfig")},
        "dynamic_batching": object_schema([], {"preferred_batch_size": {"type": "array",
                                                                        "items": {"type": "integer"}}})}),
    "ModelTensorConfig": object_schema(["name", "data_type", "dims"], {
        "name": {"type": "string"}, "data_type": {"type": "string", "description": "TYPE_STRING, TYPE_FP32..."},
        "dims": {"type": "array", "items": {"type": "integer"}}, "optional": {"type": "boolean"},
        "reshape": object_schema(["shape"], {"shape": {"type": "array", "items": {"type": "integer"}}})}),
    "InferenceRequest": object_schema(["inputs"], {
        "id": {"type": "string"},
        "parameters": {"type": "object", "description": "The task's parameters; binary_data_output"},
        "inputs": {"type": "array", "minItems": 1, "items": object_schema(["name", "datatype", "shape"], {
            "name": {"type": "string"}, "datatype": {"type": "string", "enum": ["BYTES"]},
            "shape": {"type": "array", "minItems": 1, "maxItems": MAX_DIMENSIONS,
                      "items": {"type": "integer", "minimum": 0}},
            "parameters": object_schema([], {"binary_data_size": {"type": "integer", "minimum": 0}}),
            "data": {"type": "array", "items": {}}})},
        "outputs": {"type": "array", "items": object_schema(["name"], {
            "name": {"type": "string"}, "parameters": object_schema([], {"binary_data": {"type": "boolean"}})})}},
        example={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hello"]}]}),
    "InferenceResponse": object_schema(["model_name", "outputs"], {
        "model_name": {"type": "string"}, "model_version": {"type": "string"}, "id": {"type": "string"},
        "outputs": {"type": "array", "items": object_schema(["name", "datatype", "shape"], {
            "name": {"type": "string"}, "datatype": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}}, "data": {"type": "array", "items": {}},
            "parameters": object_schema([], {"binary_data_size": {"type": "integer"}})})}}),
}
HEADER_LENGTH_PARAMETER = {
    "name": HEADER_LENGTH, "in": "header", "required": False,
    "description": "Binary form (Triton's binary tensor extension): the length of the JSON part of the body; "
                   "the inputs' binary data follows it",
    "schema": {"type": "string", "pattern": "^[0-9]{1,10}$"}}
MODEL = (model_parameter(EXAMPLE_MODEL),)
PATHS: dict[str, Any] = {
    "/v2": get("KServe v2: the server's name, version and extensions", answer("Server", ref("ServerMetadata")),
               "unauthorized", shape=ERRORS),
    "/v2/health/live": get("KServe v2: live while the gateway answers",
                           answer("Live", object_schema(["live"], {"live": {"type": "boolean"}})),
                           "unauthorized", shape=ERRORS),
    "/v2/health/ready": get("KServe v2: ready as /readyz",
                            answer("Ready", object_schema(["ready"], {"ready": {"type": "boolean"}})),
                            *BROKER_QUERY_ERRORS, "no_worker", shape=ERRORS),
    "/v2/models/{model}": get("KServe v2: the model's input and output tensors, from its task",
                              answer("Model", ref("ModelMetadata")), *BROKER_QUERY_ERRORS, "unknown_model",
                              shape=ERRORS, parameters=MODEL),
    "/v2/models/{model}/config": get("Triton: the model's configuration (max_batch_size, inputs and outputs in "
                                     "Triton's form), from its task", answer("Model configuration", ref(
                                         "ModelConfig")), *BROKER_QUERY_ERRORS, "unknown_model", shape=ERRORS,
                                     parameters=MODEL),
    "/v2/models/{model}/ready": get("KServe v2: ready while a worker serves the model",
                                    answer("Ready", object_schema(["name", "ready"], {
                                        "name": {"type": "string"}, "ready": {"type": "boolean"}})),
                                    *BROKER_QUERY_ERRORS, "unknown_model", "no_worker", shape=ERRORS,
                                    parameters=MODEL),
    "/v2/models/{model}/infer": inference(
        "KServe v2: run the model on its tensors, JSON or binary (tritonclient's default)",
        {"application/json": {"schema": ref("InferenceRequest")},
         "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        {**answer("Outputs: JSON, or in the binary form the JSON part (its length in "
                  f"{HEADER_LENGTH}) and then the binary outputs", ref("InferenceResponse"), tokens=True),
         "content": {"application/json": {"schema": ref("InferenceResponse")},
                     "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
        *MODEL, HEADER_LENGTH_PARAMETER, shape=ERRORS),
}

DIALECT = Dialect(
    name="kserve", title="KServe v2",
    routes=(web.get("/v2", get_server), web.get("/v2/health/live", get_live), web.get("/v2/health/ready", get_ready),
            # The model name may hold slashes (org/name): the longer paths are tried first.
            web.post("/v2/models/{model:.+}/infer", post_infer),
            web.get("/v2/models/{model:.+}/ready", get_model_ready),
            web.get("/v2/models/{model:.+}/config", get_model_config),
            web.get("/v2/models/{model:.+}", get_model)),
    errors=ERRORS, error_paths=frozenset({"/v2"}), error_prefixes=("/v2/",), openapi_paths=PATHS,
    openapi_schemas=SCHEMAS, answers=answers, order=40,
)
