"""KServe v2 tensors, whichever protocol carries them: inputs as BYTES elements, outputs as arrays or bytes.

Both KServe dialects, HTTP (gateway/dialects/kserve.py, with Triton's binary
tensor extension) and gRPC (gateway/grpc/), read their inputs into
:class:`InputTensor` and write :class:`OutputTensor`; gateway/signatures.py
maps each task to them.  A BYTES tensor in raw form is its elements in
row-major order, each a little-endian uint32 length and then that many bytes
(:func:`split_elements`, :meth:`OutputTensor.raw`): every length is checked
against what is left before it is used.  Nothing here knows models.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.errors import bad_request

MAX_DIMENSIONS = 8
LENGTH = struct.Struct("<I")
# The datatypes the gateway answers in, as numpy types (little-endian).
NUMPY_TYPES = {"FP16": "<f2", "FP32": "<f4", "INT32": "<i4", "INT64": "<i8", "FP64": "<f8"}


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


def checked_shape(shape: Any, name: str) -> tuple[int, ...]:
    """An input's shape: 1 to :data:`MAX_DIMENSIONS` whole numbers of at least 0."""
    if (not isinstance(shape, Sequence) or isinstance(shape, str | bytes) or not 1 <= len(shape) <= MAX_DIMENSIONS
            or not all(type(d) is int and d >= 0 for d in shape)):
        raise bad_request(f"input {name!r}: the shape must be a list of 1 to {MAX_DIMENSIONS} whole numbers")
    return tuple(shape)


def holding(name: str, items: list[bytes | str], shape: tuple[int, ...]) -> InputTensor:
    """A BYTES input whose element count must fill its shape."""
    if len(items) != math.prod(shape):
        raise bad_request(f"input {name!r} has {len(items)} elements, but its shape {list(shape)} holds "
                          f"{math.prod(shape)}")
    return InputTensor(name, shape, items)


def split_elements(data: memoryview | bytes, name: str) -> Iterator[bytes]:
    """A BYTES tensor's elements from the raw form: each a uint32 length, then its bytes."""
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
