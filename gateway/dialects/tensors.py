"""KServe v2 tensors in and out: the JSON form, and Triton's binary tensor extension that tritonclient sends.

A request is JSON, or (binary form) JSON followed by raw tensor bytes: the
``Inference-Header-Content-Length`` header says how long the JSON part is,
and each input with ``parameters.binary_data_size`` takes that many of the
bytes after it, in input order.  A BYTES tensor's bytes are its elements in
row-major order, each a little-endian uint32 length and then that many bytes.
Answers follow the same rules: outputs asked for in binary (``binary_data``
on the output, or ``binary_data_output`` for all) come after the JSON, whose
length the answer's header gives.

Every length is checked against the body before it is used: a header longer
than the body, a negative or non-numeric one, sizes that overrun or leave
bytes unclaimed, element counts that do not match the shape are each a 400
that says what is wrong.  Nothing here knows models; gateway/dialects/kserve.py does.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from gateway.errors import bad_request
from gateway.parsing import json_object

HEADER_LENGTH = "Inference-Header-Content-Length"
MAX_HEADER_DIGITS = 10
MAX_DIMENSIONS = 8
LENGTH = struct.Struct("<I")
# The datatypes the gateway answers in, as numpy types (little-endian).
NUMPY_TYPES = {"FP32": "<f4", "INT32": "<i4", "INT64": "<i8", "FP64": "<f8"}
JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


@dataclass(frozen=True, slots=True)
class InputTensor:
    """A BYTES input: its name, shape and elements in row-major order (``bytes``, or ``str`` from JSON)."""

    name: str
    shape: tuple[int, ...]
    items: list[bytes | str]


@dataclass(frozen=True, slots=True)
class OutputTensor:
    """An output: a numeric array (FP32, INT32, ...) or, for BYTES, a flat list of ``bytes`` of ``shape``."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | list[bytes]

    def raw(self) -> bytes:
        """The binary extension's bytes for this output."""
        if isinstance(self.data, np.ndarray):
            return np.ascontiguousarray(self.data, dtype=NUMPY_TYPES[self.datatype]).tobytes()
        return b"".join(LENGTH.pack(len(item)) + item for item in self.data)

    def json_data(self) -> Any:
        """The JSON form's flat ``data``: numbers, or the BYTES elements as text."""
        if isinstance(self.data, np.ndarray):
            return np.ascontiguousarray(self.data, dtype=NUMPY_TYPES[self.datatype]).reshape(-1)
        return [item.decode("utf-8", "replace") for item in self.data]


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
        name, shape = entry.get("name"), tensor_shape(entry)
        if not isinstance(name, str) or not name or name in tensors:
            raise bad_request("each input needs a name of its own (a non-empty string)")
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
        if len(items) != math.prod(shape):
            raise bad_request(f"input {name!r} has {len(items)} elements, but its shape {list(shape)} holds "
                              f"{math.prod(shape)}")
        tensors[name] = InputTensor(name, shape, items)
    if offset != len(binary):
        raise bad_request(f"the body has {len(binary) - offset} bytes after the inputs' binary data that no input "
                          "claims; check binary_data_size")
    return tensors


def tensor_shape(entry: dict[str, Any]) -> tuple[int, ...]:
    shape = entry.get("shape")
    if (not isinstance(shape, list) or not 1 <= len(shape) <= MAX_DIMENSIONS
            or not all(type(d) is int and d >= 0 for d in shape)):
        raise bad_request(f'an input\'s "shape" must be a list of 1 to {MAX_DIMENSIONS} whole numbers')
    return tuple(shape)


def split_elements(data: memoryview, name: str) -> Iterator[bytes]:
    """A BYTES tensor's elements from the binary form: each a uint32 length, then its bytes."""
    offset = 0
    while offset < len(data):
        if len(data) - offset < LENGTH.size:
            raise bad_request(f"input {name!r}: the binary data ends inside an element's 4-byte length")
        (length,) = LENGTH.unpack_from(data, offset)
        offset += LENGTH.size
        if length > len(data) - offset:
            raise bad_request(f"input {name!r}: an element says it has {length} bytes, but only "
                              f"{len(data) - offset} are left")
        yield bytes(data[offset:offset + length])
        offset += length


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


def bytes_tensor(name: str, items: list[bytes], shape: tuple[int, ...]) -> OutputTensor:
    return OutputTensor(name, "BYTES", shape, items)


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
