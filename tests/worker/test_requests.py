"""The worker's payload decoding: limits named in every refusal, nothing but BadPayload ever raised."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.requests import (
    MAX_PARAMETER_BYTES,
    MAX_PARTS,
    WHOLE_BYTES,
    BadPayload,
    InputLimits,
    _common_request,
    _Reader,
    decode_request,
    parameters_key,
)
from zbatch.protocol import payloads

LIMITS = InputLimits(max_inputs=4, max_input_chars=10, max_body_bytes=4096)


def pack(body: Any) -> bytes:
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


def test_a_valid_payload_decodes_and_equal_parameters_batch_together() -> None:
    first = decode_request(pack({"inputs": ["a", "b"], "parameters": {"x": 1, "y": [1, 2]}}), 2, LIMITS)
    second = decode_request(pack({"parameters": {"y": [1, 2], "x": 1}, "inputs": ["c", "d"]}), 2, LIMITS)
    assert first.inputs == ["a", "b"] and first.parameters == {"x": 1, "y": [1, 2]}
    assert first.parameters_key == second.parameters_key


@pytest.mark.parametrize(("body", "items", "complaint"), [
    ({"inputs": ["a"] * 5}, 5, "the limit is 4 per request (max_inputs)"),
    ({"inputs": ["a" * 11]}, 1, "longer than 10 characters (max_input_chars)"),
    ({"inputs": [["q", "a" * 11]]}, 1, "longer than 10 characters"),
    ({"inputs": ["a", "b"]}, 3, "items says 3 but the payload has 2 inputs"),
    ({"inputs": "a"}, 1, "'inputs' must be a list"),
    ({"texts": ["a"]}, 1, "unknown payload field 'texts'"),
    ({"parameters": {}}, 1, "must be a map with a list of 'inputs'"),
    ({"inputs": ["a"], "parameters": [1]}, 1, "'parameters' must be a map"),
    ({"inputs": ["a"], "parameters": {1: 1, "a": 2}}, 1, "parameter names must be strings"),
    ({"inputs": [[["nested"]]]}, 1, "holds a nested array"),
    ({"inputs": [list(range(MAX_PARTS + 1))]}, 1, f"a structured input has at most {MAX_PARTS}"),
    (["inputs"], 1, "must be a map"),
])
def test_each_refusal_names_what_is_wrong(body: Any, items: int, complaint: str) -> None:
    with pytest.raises(BadPayload) as refusal:
        decode_request(pack(body), items, LIMITS)
    assert complaint in str(refusal.value)


def test_the_operation_is_run_by_default_or_tokenize_and_never_shares_a_batch_key() -> None:
    run = decode_request(pack({"inputs": ["a"], "parameters": {"x": 1}}), 1, LIMITS)
    explicit = decode_request(pack({"inputs": ["a"], "parameters": {"x": 1}, "operation": "run"}), 1, LIMITS)
    nil = decode_request(pack({"operation": None, "inputs": ["a"], "parameters": {"x": 1}}), 1, LIMITS)
    tokenize = decode_request(pack({"operation": "tokenize", "inputs": ["a"], "parameters": {"x": 1}}), 1, LIMITS)
    assert run.operation == explicit.operation == nil.operation == "run" and tokenize.operation == "tokenize"
    assert run.parameters_key == explicit.parameters_key == nil.parameters_key != tokenize.parameters_key


@pytest.mark.parametrize("operation", ["embed", "", 1, ["run"], "x" * 40])
def test_an_unknown_operation_is_refused(operation: Any) -> None:
    with pytest.raises(BadPayload, match="'operation'"):
        decode_request(pack({"inputs": ["a"], "operation": operation}), 1, LIMITS)


def test_pairs_and_images_are_inputs_too() -> None:
    image = b"\x89PNG" + bytes(range(256)) * 4
    decoded = decode_request(pack({"inputs": [["query", "text"], image]}), 2, LIMITS)
    assert decoded.inputs == [["query", "text"], image]


def test_parameters_are_bounded_before_they_are_built() -> None:
    body = {"inputs": ["a"], "parameters": {"x": ["y" * 100] * (MAX_PARAMETER_BYTES // 100)}}
    with pytest.raises(BadPayload, match=f"the limit is {MAX_PARAMETER_BYTES}"):
        decode_request(pack(body), 1, InputLimits(max_body_bytes=10 * MAX_PARAMETER_BYTES))


def test_a_payload_over_the_byte_limit_is_refused_unread() -> None:
    """15 MiB of empty arrays: refused on its size, without a single object built."""
    bomb = b"\x81\xa6inputs\xdd" + (15 << 20).to_bytes(4, "big") + b"\x90" * (15 << 20)
    with pytest.raises(BadPayload, match="the limit is 1048576 \\(max_body_bytes\\)"):
        decode_request(bomb, 15 << 20, InputLimits())


def test_an_array_header_claiming_more_inputs_than_allowed_is_refused_before_reading_them() -> None:
    claim = b"\x81\xa6inputs\xdd" + (10**9).to_bytes(4, "big") + b"\x90" * 100
    with pytest.raises(BadPayload, match="1000000000 inputs"):
        decode_request(claim, 10**9, InputLimits())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 8))
def test_random_bytes_decode_within_the_limits_or_raise_bad_payload(data: bytes, items: int) -> None:
    try:
        request = decode_request(data, items, LIMITS)
    except BadPayload:
        return
    assert len(request.inputs) == items <= LIMITS.max_inputs


INT64 = st.integers(-(2**63), 2**64 - 1)
values = st.recursive(st.none() | st.booleans() | INT64 | st.floats() | st.text(max_size=12)
                      | st.binary(max_size=12), lambda inner: st.lists(inner, max_size=10)
                      | st.dictionaries(st.text(max_size=5) | INT64, inner, max_size=10), max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["inputs", "parameters", "operation", "other"]), values | st.sampled_from(
    ["run", "tokenize"]), max_size=4), st.integers(0, 8))
def test_random_structures_decode_within_the_limits_or_raise_bad_payload(body: dict[str, Any], items: int) -> None:
    try:
        request = decode_request(pack(body), items, LIMITS)
    except BadPayload:
        return
    assert len(request.inputs) == items <= LIMITS.max_inputs
    assert all(len(text) <= LIMITS.max_input_chars for text in request.inputs if isinstance(text, str))
    assert all(isinstance(key, str) for key in request.parameters)


@st.composite
def near_common(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """Requests like the common one, and some a field or a limit away from it."""
    body: dict[str, Any] = {}
    texts = st.lists(st.text(max_size=12), max_size=5)
    inputs = draw([texts, texts, texts, st.lists(st.text(max_size=12) | st.binary(max_size=4), max_size=5),
                   values][draw(st.integers(0, 4))])
    if draw(st.integers(0, 9)):
        body["inputs"] = inputs
    if draw(st.booleans()):
        body["parameters"] = draw(st.none() | st.dictionaries(st.text(max_size=5), values, max_size=3)
                                  | st.dictionaries(st.text(max_size=5) | INT64, values, max_size=3) | values)
    if draw(st.booleans()):
        body["operation"] = draw(st.sampled_from(["run", "tokenize", "", "embed", None, 1]))
    if draw(st.integers(0, 9)) == 0:
        body["other"] = 1
    size = len(inputs) if isinstance(inputs, list) else 0
    return body, draw(st.sampled_from([size, size, size, size + 1, max(0, size - 1)]))


@settings(max_examples=500, deadline=None)
@given(near_common())
def test_a_small_payload_unpacked_whole_is_taken_only_as_the_walk_takes_it(case: tuple[dict[str, Any], int]) -> None:
    """The common request, unpacked in one call, decodes as the walk decodes it; what the walk refuses, it never
    takes (the walk then gives the reason)."""
    body, items = case
    payload = pack(body)
    common = _common_request(payload, items, LIMITS)
    try:
        walked = _Reader(payload, LIMITS).request(items)
    except BadPayload:
        assert common is None
        return
    if common is not None:  # compared packed: a NaN parameter is never equal to itself
        inputs, parameters, operation = walked
        assert pack([common.inputs, common.parameters, common.operation]) == pack([inputs, parameters, operation])
        assert common.parameters_key == parameters_key(parameters, operation)


@pytest.mark.parametrize("payload", [
    b"\x82\xa6inputs\x91\x91\x91\x01\xa6inputs\x91\xa1a",  # {"inputs": [[[1]]], "inputs": ["a"]}
    b"\x82\xa6inputs\x91\xab" + b"x" * 11 + b"\xa6inputs\x91\xa1a",  # the first inputs too long
    b"\x82\xa9operation\x01\xa6inputs\x91\xa1a",  # operation 1
    pack({"inputs": ["a"]}) + b"\xc0",  # a byte after the map
])
def test_what_the_walk_refuses_is_never_taken_whole(payload: bytes) -> None:
    assert _common_request(payload, 1, LIMITS) is None
    with pytest.raises(BadPayload):
        decode_request(payload, 1, LIMITS)


def test_texts_and_token_ids_are_the_common_request() -> None:
    ids = payloads.encode_payload({"inputs": [np.array([101, 7, 102], dtype=np.int32)], "parameters": {}})
    texts = pack({"inputs": ["a", "b"], "parameters": {"truncate": True}, "operation": "tokenize"})
    assert len(ids) <= WHOLE_BYTES and len(texts) <= WHOLE_BYTES
    common_ids = _common_request(ids, 1, LIMITS)
    assert common_ids is not None and common_ids.inputs[0].tolist() == [101, 7, 102]
    common_texts = _common_request(texts, 2, LIMITS)
    assert common_texts is not None and common_texts.operation == "tokenize"
    assert common_texts.parameters == {"truncate": True}
