"""KServe v2 gRPC messages to the gateway's tensors and back (the messages are the stubs generated from the proto).

A ``ModelInferRequest``'s inputs are BYTES tensors, their elements either in
``contents.bytes_contents`` or, as tritonclient sends them, each input's raw
bytes in ``raw_input_contents`` (in input order; a BYTES element is a
little-endian uint32 length, then its bytes: gateway/tensors.py reads them,
every length checked).  Parameters are ``bool``, ``int64`` or ``string``
values.  Answers put every output in ``raw_output_contents``, as Triton does:
FP32 and INT32 little-endian, BYTES length-prefixed.

Every fault of the message is an ``ApiError`` ``bad_request`` saying what is
wrong (gRPC's ``INVALID_ARGUMENT``): bytes that are not a
``ModelInferRequest``, a datatype other than BYTES, shapes that do not match
their elements, raw contents that do not match the inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from gateway.errors import bad_request
from gateway.kserve_grpc import grpc_predict_v2_pb2 as pb
from gateway.kserve_grpc import model_config_pb2 as triton
from gateway.signatures import MODEL_VERSION
from gateway.tensors import InputTensor, OutputTensor, checked_shape, holding, split_elements
from zbatch.protocol.wire import MAX_NAME_CHARS


def parsed(kind: Any, message: bytes) -> Any:
    """``message`` as a ``kind`` of the proto's messages; ``bad_request`` for bytes that are not one."""
    try:
        return kind.FromString(message)
    except DecodeError:
        raise bad_request(f"the message is not a KServe v2 {kind.__name__} (malformed protobuf)") from None


def parse_infer(message: bytes) -> pb.ModelInferRequest:
    """The request in ``message``; ``bad_request`` for bytes that are not one, or that name no model."""
    request: pb.ModelInferRequest = parsed(pb.ModelInferRequest, message)
    if not 1 <= len(request.model_name) <= MAX_NAME_CHARS:
        raise bad_request(f"model_name must have 1 to {MAX_NAME_CHARS} characters")
    return request


def inputs_of(request: pb.ModelInferRequest) -> dict[str, InputTensor]:
    """The request's inputs by name, all BYTES, from their contents or the raw contents."""
    if not request.inputs:
        raise bad_request("the request has no inputs")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise bad_request(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs: give one "
                          "per input, in input order")
    tensors: dict[str, InputTensor] = {}
    for index, tensor in enumerate(request.inputs):
        name = tensor.name
        if not name or name in tensors:
            raise bad_request("each input needs a name of its own (a non-empty string)")
        if tensor.datatype != "BYTES":
            raise bad_request(f"input {name!r} is {tensor.datatype[:16]!r}; inputs are BYTES: texts, or images")
        shape = checked_shape(list(tensor.shape), name)
        if raw:
            if tensor.HasField("contents"):
                raise bad_request(f"input {name!r} has contents as well as raw_input_contents: give one or the other")
            items: list[bytes | str] = list(split_elements(raw[index], name))
        else:
            items = list(tensor.contents.bytes_contents)
        tensors[name] = holding(name, items, shape)
    return tensors


def parameters_of(parameters: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """A parameters map as plain values (a parameter with no value is left out)."""
    values: dict[str, Any] = {}
    for name, parameter in parameters.items():
        kind = parameter.WhichOneof("parameter_choice")
        if kind is not None:
            values[name] = getattr(parameter, kind)
    return values


def requested(request: pb.ModelInferRequest, names: list[str]) -> list[str]:
    """The outputs asked for (all by default), in order; an output the model does not have is a ``bad_request``."""
    if not request.outputs:
        return names
    asked = [output.name for output in request.outputs]
    unknown = [name for name in asked if name not in names]
    if unknown:
        raise bad_request(f"the model has no output {unknown[0][:64]!r}; its outputs are {', '.join(names)}")
    return asked


def infer_response(model: str, request_id: str, outputs: list[OutputTensor]) -> pb.ModelInferResponse:
    """The answer: each output described, its data in ``raw_output_contents``."""
    return pb.ModelInferResponse(
        model_name=model, model_version=MODEL_VERSION, id=request_id,
        outputs=[pb.ModelInferResponse.InferOutputTensor(name=o.name, datatype=o.datatype, shape=list(o.shape))
                 for o in outputs],
        raw_output_contents=[output.raw() for output in outputs])


def metadata_response(metadata: Mapping[str, Any]) -> pb.ModelMetadataResponse:
    """``ModelMetadataResponse`` from the metadata both KServe protocols describe (gateway/signatures.py)."""
    tensor = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=metadata["name"], versions=metadata["versions"], platform=metadata["platform"],
        inputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in metadata["inputs"]],
        outputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in metadata["outputs"]])


def config_response(config: Mapping[str, Any]) -> triton.ModelConfigResponse:
    """``ModelConfigResponse`` from the configuration in Triton's JSON form (gateway/model_config.py)."""
    return triton.ModelConfigResponse(config=json_format.ParseDict(dict(config), triton.ModelConfig()))
