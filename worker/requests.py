"""A request's payload, decoded and checked before it can cost the worker anything.

Theory of operation
-------------------
A payload arrives from the network (a direct ZeroMQ client, or the gateway
through the broker) and is decoded on the worker's I/O loop, the loop that
also sends heartbeats.  So decoding must cost time in proportion to what the
limits allow, not to what an attacker packs in: 15 MiB of empty msgpack
arrays would make 15 million Python objects, and one 15 MiB text would keep
the model busy for seconds.

The payload is walked, not unpacked whole (:class:`msgpack.Unpacker`):

1. its size is checked against ``max_body_bytes`` before anything else;
2. the top level must be a map of ``inputs`` (an array) and, optionally,
   ``parameters`` (a map, or nil) and ``operation`` (``"run"``, the default,
   or ``"tokenize"``: only the model's tokenizer runs);
3. the number of inputs is read from the array header and checked against
   ``max_inputs`` and the request's ``items`` before any input is read;
4. each input's kind is read from its first byte: a string is unpacked with
   its length bounded by ``max_input_chars``; bytes (an image, say) are
   bounded by the payload limit; an array or map (a query and text pair,
   say) must be flat and small: at most ``MAX_PARTS`` strings, bytes or
   numbers, each string bounded like an input;
5. ``parameters`` is first skipped in C, which builds no objects, and
   unpacked only if it takes at most ``MAX_PARAMETER_BYTES``; its keys must
   be strings.

So the objects built for one request are at most about
``max_inputs × (MAX_PARTS + 1)`` plus what ``MAX_PARAMETER_BYTES`` can hold.

A payload of at most :data:`WHOLE_BYTES` cannot hold more objects than it has
bytes, so it is first unpacked whole, in one C call, and taken as it is if it
is the common request (texts or token ids, and optional parameters and
operation) within every limit above.  Anything else, valid or not, is walked
as above, so every refusal comes from the walk, with its reason.

Every failure is a :class:`BadPayload` whose message names the limit or the
field, safe to send back as ``bad_request``.  No sockets, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import msgpack
import numpy as np

from zbatch.protocol.payloads import decode_extension
from zbatch.protocol.vocabulary import INPUTS, OPERATION, OPERATIONS, PARAMETERS, RUN

MAX_PARAMETER_BYTES: Final = 64 * 1024
MAX_PARTS: Final = 8  # entries of one structured input
SCALARS: Final = frozenset({"str", "bin", "int", "float", "bool", "nil"})
UTF8_BYTES_PER_CHAR: Final = 4
MAX_OPERATION_BYTES: Final = 32
WHOLE_BYTES: Final = 4096  # payloads first unpacked whole: they hold at most this many objects (< MAX_PARAMETER_BYTES)
_FIELDS: Final = frozenset({INPUTS, PARAMETERS, OPERATION})
FIXMAP: Final = 0x80  # msgpack's header of a map of up to 15 entries, plus their count


class BadPayload(ValueError):
    """The payload breaks the protocol or a limit; the message says which, for the caller."""


@dataclass(frozen=True, slots=True)
class InputLimits:
    """What one request may carry; the gateway checks the same limits for HTTP callers."""

    max_inputs: int = 256
    max_input_chars: int = 100_000
    max_body_bytes: int = 1024 * 1024


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    inputs: list[Any]
    parameters: dict[str, Any]
    parameters_key: bytes  # equal for equal operations and parameters, whatever their order: batches group by it
    operation: str = RUN


def decode_request(payload: bytes, items: int, limits: InputLimits) -> DecodedRequest:
    """The inputs and parameters of a REQUEST's payload, within ``limits``; else :class:`BadPayload`."""
    if len(payload) > limits.max_body_bytes:
        raise BadPayload(f"the payload has {len(payload)} bytes; the limit is {limits.max_body_bytes} "
                         "(max_body_bytes): split the request or raise the limit")
    if len(payload) <= WHOLE_BYTES:
        common = _common_request(payload, items, limits)
        if common is not None:
            return common
    reader = _Reader(payload, limits)
    try:
        inputs, parameters, operation = reader.request(items)
    except BadPayload:
        raise
    except Exception as exc:  # msgpack raises many types on garbage; all mean the same
        raise BadPayload(f"the payload is not valid msgpack ({type(exc).__name__})") from None
    return DecodedRequest(inputs, parameters, parameters_key(parameters, operation), operation)


def _common_request(payload: bytes, items: int, limits: InputLimits) -> DecodedRequest | None:
    """A small payload unpacked whole, if it is the common request within ``limits``: ``items`` texts or token-id
    arrays, parameters named by strings (or nil), a known operation (or nil); None for anything else."""
    try:
        body = _unpacked(payload)
    except Exception:  # garbage, or bytes after the map: the walk says which
        return None
    if type(body) is not dict or not body.keys() <= _FIELDS:
        return None
    if payload[0] != FIXMAP + len(body):  # a key given twice: the header counts more entries than the dict holds
        return None
    inputs, parameters, operation = body.get(INPUTS), body.get(PARAMETERS), body.get(OPERATION)
    parameters = {} if parameters is None else parameters
    operation = RUN if operation is None else operation
    if type(inputs) is not list or len(inputs) != items or items > limits.max_inputs:
        return None
    if type(parameters) is not dict or not (type(operation) is str and operation in OPERATIONS):
        return None
    for value in inputs:
        if not ((type(value) is str and len(value) <= limits.max_input_chars) or isinstance(value, np.ndarray)):
            return None
    if not all(type(key) is str for key in parameters):
        return None
    return DecodedRequest(inputs, parameters, parameters_key(parameters, operation), operation)


def _unpacked(data: bytes) -> Any:
    """``data`` unpacked whole, as the payload's values are read: strings as str, arrays from their extension."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=decode_extension)


def parameters_key(parameters: dict[str, Any], operation: str = RUN) -> bytes:
    """A canonical encoding of the operation and parameters: keys sorted, so {a, b} and {b, a} batch together."""
    if not parameters and operation in _PLAIN_KEYS:  # most requests: no parameters
        return _PLAIN_KEYS[operation]
    packed: bytes = msgpack.packb([operation, sorted(parameters.items())], use_bin_type=True, default=repr)
    return packed


_PLAIN_KEYS: Final[dict[str, bytes]] = {operation: msgpack.packb([operation, []], use_bin_type=True)
                                         for operation in OPERATIONS}


class _Reader:
    """Walks one payload with a streaming unpacker, peeking at each value's first byte."""

    def __init__(self, payload: bytes, limits: InputLimits) -> None:
        self.payload = payload
        self.limits = limits
        self.unpacker = msgpack.Unpacker(
            raw=False, strict_map_key=False, ext_hook=decode_extension, max_buffer_size=max(len(payload), 1),
            max_str_len=limits.max_input_chars * UTF8_BYTES_PER_CHAR, max_bin_len=limits.max_body_bytes,
            max_ext_len=limits.max_body_bytes, max_array_len=limits.max_body_bytes,
            max_map_len=limits.max_body_bytes,
        )
        self.unpacker.feed(payload)

    def request(self, items: int) -> tuple[list[Any], dict[str, Any], str]:
        if self._kind() != "map":
            raise BadPayload(f"the payload must be a map with a list of {INPUTS!r}")
        inputs: list[Any] | None = None
        parameters: dict[str, Any] = {}
        operation = RUN
        for _ in range(self.unpacker.read_map_header()):
            key = self._small_value("a payload key", 256)
            if key == INPUTS:
                inputs = self._inputs(items)
            elif key == PARAMETERS:
                parameters = self._parameters()
            elif key == OPERATION:
                operation = self._operation()
            else:
                raise BadPayload(f"unknown payload field {str(key)[:40]!r}; a payload holds {INPUTS!r}, "
                                 f"{PARAMETERS!r} and {OPERATION!r}")
        if inputs is None:
            raise BadPayload(f"the payload must be a map with a list of {INPUTS!r}")
        if self.unpacker.tell() != len(self.payload):
            raise BadPayload("the payload has bytes after its map")
        return inputs, parameters, operation

    def _operation(self) -> str:
        kind = self._kind()
        operation = self._small_value(repr(OPERATION), MAX_OPERATION_BYTES) if kind in ("str", "nil") else None
        if operation is None and kind == "nil":
            return RUN
        if operation not in OPERATIONS:
            raise BadPayload(f"{OPERATION!r} must be one of {', '.join(map(repr, OPERATIONS))}")
        return str(operation)

    def _inputs(self, items: int) -> list[Any]:
        if self._kind() != "array":
            raise BadPayload(f"{INPUTS!r} must be a list: the payload is a map with a list of {INPUTS!r}")
        count = self.unpacker.read_array_header()
        if count > self.limits.max_inputs:
            raise BadPayload(f"{count} inputs; the limit is {self.limits.max_inputs} per request "
                             "(max_inputs): split it")
        if count != items:
            raise BadPayload(f"items says {items} but the payload has {count} inputs")
        return [self._input(index) for index in range(count)]

    def _input(self, index: int) -> Any:
        kind = self._kind()
        if kind == "array":
            return [self._part(index) for _ in range(self._parts(index, self.unpacker.read_array_header()))]
        if kind == "map":
            pairs = self._parts(index, self.unpacker.read_map_header())
            return {self._part(index): self._part(index) for _ in range(pairs)}
        return self._part(index)

    def _parts(self, index: int, count: int) -> int:
        if count > MAX_PARTS:
            raise BadPayload(f"inputs[{index}] has {count} parts; a structured input has at most {MAX_PARTS}")
        return count

    def _part(self, index: int) -> Any:
        """A string, bytes, a number or nil; a string no longer than an input may be."""
        kind = self._kind()
        if kind not in SCALARS and kind != "ext":
            raise BadPayload(f"inputs[{index}] holds a nested {kind}; inputs are strings, bytes, numbers or flat "
                             f"lists and maps of at most {MAX_PARTS} of them")
        try:
            value = self.unpacker.unpack()
        except ValueError:
            if kind == "str":
                raise self._too_long(index) from None
            raise
        if kind == "str" and len(value) > self.limits.max_input_chars:
            raise self._too_long(index)
        return value

    def _too_long(self, index: int) -> BadPayload:
        return BadPayload(f"inputs[{index}] is longer than {self.limits.max_input_chars} characters "
                          "(max_input_chars)")

    def _parameters(self) -> dict[str, Any]:
        kind = self._kind()
        if kind == "nil":
            self.unpacker.skip()
            return {}
        if kind != "map":
            raise BadPayload(f"{PARAMETERS!r} must be a map")
        parameters = self._small_value(repr(PARAMETERS), MAX_PARAMETER_BYTES)
        if not all(isinstance(key, str) for key in parameters):
            raise BadPayload("parameter names must be strings")
        return dict(parameters)

    def _small_value(self, what: str, limit: int) -> Any:
        """Skip the next value (no objects built), then unpack it only if its encoding is at most ``limit``."""
        start = self.unpacker.tell()
        self.unpacker.skip()
        size = self.unpacker.tell() - start
        if size > limit:
            raise BadPayload(f"{what} takes {size} bytes; the limit is {limit}")
        return _unpacked(self.payload[start:start + size])

    def _kind(self) -> str:
        """The kind of the next value, from its first byte (msgpack's format families)."""
        position: int = self.unpacker.tell()
        if position >= len(self.payload):
            raise BadPayload("the payload ends early")
        return _KINDS[self.payload[position]]


def _format_kinds() -> tuple[str, ...]:
    kinds = ["int"] * 256
    for first, last, kind in ((0x80, 0x8F, "map"), (0x90, 0x9F, "array"), (0xA0, 0xBF, "str"),
                              (0xC0, 0xC0, "nil"), (0xC1, 0xC1, "invalid"), (0xC2, 0xC3, "bool"),
                              (0xC4, 0xC6, "bin"), (0xC7, 0xC9, "ext"), (0xCA, 0xCB, "float"),
                              (0xD4, 0xD8, "ext"), (0xD9, 0xDB, "str"), (0xDC, 0xDD, "array"),
                              (0xDE, 0xDF, "map")):
        kinds[first:last + 1] = [kind] * (last - first + 1)
    return tuple(kinds)


_KINDS: Final = _format_kinds()
