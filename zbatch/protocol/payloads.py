"""Payloads between clients and workers: msgpack with numpy arrays as raw bytes.

The broker never calls this: it forwards payload frames without decoding
them.  Arrays travel as msgpack extension type 1 (:data:`NDARRAY_EXT`), whose
data is the msgpack of ``[dtype, shape, raw little-endian bytes]``, never as
lists of floats (see ``zbatch/protocol/PROTOCOL.md`` section 5).  Decoding is bounded
and strict, and raises only :class:`zbatch.protocol.wire.ProtocolError`.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any, Final

import msgpack
import numpy as np

from zbatch.protocol.wire import ProtocolError, ReusedPacker, pack, shortened

MAX_PAYLOAD_BYTES: Final = 64 * 1024 * 1024
NDARRAY_EXT: Final = 1
MAX_NDIM: Final = 32
NDARRAY_DTYPE: Final = re.compile(r"[<|][biuf][0-9]{1,2}")


def _encode_extension(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        if array.dtype.kind not in "biuf":
            raise TypeError(f"arrays of dtype {array.dtype} cannot be sent; use numbers")
        body = pack([array.dtype.str, list(array.shape), array.tobytes()])
        return msgpack.ExtType(NDARRAY_EXT, body)
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot encode {type(value).__name__} in a payload")


def decode_extension(code: int, data: bytes) -> np.ndarray:
    """An ndarray from extension type 1 (PROTOCOL.md section 5), checked before numpy sees it."""
    if code != NDARRAY_EXT:
        raise ProtocolError(f"unknown msgpack extension type {code}")
    try:
        parts = msgpack.unpackb(data, raw=False, max_str_len=8, max_bin_len=len(data), max_ext_len=0,
                                max_array_len=MAX_NDIM, max_map_len=0)
    except Exception:
        raise ProtocolError("malformed ndarray extension") from None
    if not (isinstance(parts, list) and len(parts) == 3):
        raise ProtocolError("an ndarray extension must hold [dtype, shape, data]")
    dtype_str, shape, raw = parts
    if not (isinstance(dtype_str, str) and NDARRAY_DTYPE.fullmatch(dtype_str)):
        raise ProtocolError(f"ndarray dtype {shortened(repr(dtype_str))} is not a little-endian number type")
    try:
        dtype = np.dtype(dtype_str)
    except TypeError:
        raise ProtocolError(f"ndarray dtype {dtype_str!r} is not a numpy type") from None
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ProtocolError("ndarray shape must be a list of non-negative integers")
    # Python integers: a product of huge dimensions must not wrap around and match by accident.
    if not isinstance(raw, bytes) or math.prod(shape) * dtype.itemsize != len(raw):
        raise ProtocolError("ndarray data length does not match its dtype and shape")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


_PAYLOAD_PACKER = ReusedPacker(use_bin_type=True, default=_encode_extension)


def encode_payload(value: Any) -> bytes:
    """msgpack with numpy arrays as raw little-endian bytes (extension type 1).

    One packer per thread, reused (:class:`~zbatch.protocol.wire.ReusedPacker`): a packer made each call
    cost six times the packing of a 384-float vector (a worker packs one for every reply).
    """
    return _PAYLOAD_PACKER.pack(value)


def decode_payload(data: bytes, max_bytes: int = MAX_PAYLOAD_BYTES) -> Any:
    """Inverse of :func:`encode_payload`; arrays come back as read-only numpy views.

    ``max_bytes`` bounds the payload and every string, list, map and extension in it.
    """
    if len(data) > max_bytes:
        raise ProtocolError(f"payload larger than {max_bytes} bytes")
    try:
        return msgpack.unpackb(
            data, raw=False, ext_hook=decode_extension, strict_map_key=False,
            max_str_len=max_bytes, max_bin_len=max_bytes, max_ext_len=max_bytes,
            max_array_len=max_bytes, max_map_len=max_bytes // 2,
        )
    except ProtocolError:
        raise
    except Exception as exc:
        raise ProtocolError(f"payload is not valid msgpack ({type(exc).__name__})") from None


def tokenizer_fingerprint(serialized: str) -> str:
    """What names a tokenizer in READY and in a request's ``tokenized_by`` (PROTOCOL.md 3.4): the first 16
    hexadecimal digits of the SHA-256 of its serialized form (the JSON of the ``tokenizers`` library), UTF-8."""
    return hashlib.sha256(serialized.encode("utf-8")).hexdigest()[:16]
