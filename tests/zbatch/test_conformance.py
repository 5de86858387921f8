"""PROTOCOL.md is the single source of truth: its examples must match the code byte for byte."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.zbatch.protocol_examples import EXAMPLES
from zbatch.protocol import payloads, wire

DOCUMENT = (Path(__file__).resolve().parents[2] / "zbatch" / "protocol" / "PROTOCOL.md").read_text()
BLOCK = re.compile(r"```frames (\S+)\n(.*?)```", re.DOTALL)


def documented() -> dict[str, list[bytes]]:
    examples = {}
    for name, body in BLOCK.findall(DOCUMENT):
        lines = [line.strip() for line in body.strip().splitlines()]
        examples[name] = [b"" if line == "(empty)" else bytes.fromhex(line) for line in lines]
    return examples


def test_every_example_in_the_document_is_checked_and_vice_versa() -> None:
    assert sorted(documented()) == sorted(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_document_and_encoder_agree_byte_for_byte(name: str) -> None:
    assert documented()[name] == EXAMPLES[name]


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_documented_bytes_decode(name: str) -> None:
    frames = documented()[name]
    command = wire.decode_header(frames)
    decoders = [wire.decode_client_message, wire.decode_worker_message, wire.decode_broker_to_worker]
    decoded = []
    for decode in decoders:
        try:
            decoded.append(decode(frames))
        except wire.ProtocolError:
            continue
    assert decoded, f"no peer accepts the documented {command.name} example"


def test_the_documented_array_payload_decodes_to_the_array() -> None:
    outputs = payloads.decode_payload(documented()["reply-ok"][3])["outputs"]
    assert outputs[0].tolist() == [0.5, -1.0] and outputs[0].dtype.str == "<f4"
