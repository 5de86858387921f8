"""Coverage-guided fuzzing of the worker's request decoding and validation (atheris/libFuzzer).

Each input is a REQUEST payload, with the item count and the limits taken from
its first bytes, so the fuzzer also explores the limits' edges.  The payload
goes through :func:`worker.requests.decode_request` and, when it decodes,
through the input checks every text runner applies.  :class:`BadPayload` and
:class:`InputError` are the only exceptions allowed; anything else is a
crash, which libFuzzer saves and reports with a non-zero exit status.  Run it
with ``scripts/fuzz/run``; ``--write-seeds DIR`` writes valid payloads.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import atheris

with atheris.instrument_imports(include=["worker.requests", "zbatch.protocol"]):
    import msgpack

    from worker.requests import BadPayload, InputLimits, decode_request
    from worker.runners.spec import InputError, check_inputs

SEEDS: dict[str, dict[str, Any]] = {
    "texts": {"inputs": ["hello", "world"], "parameters": {"normalize": True}},
    "pairs": {"inputs": [["query", "text"], {"query": "q", "text": "t"}], "parameters": None},
    "image": {"inputs": [b"\x89PNG\r\n\x1a\n"], "parameters": {"top_k": 3}},
    "nested-parameters": {"inputs": ["a"], "parameters": {"candidate_labels": ["x", "y"], "multi_label": False}},
}


def test_one_input(data: bytes) -> None:
    if len(data) < 4:
        return
    items, max_inputs, max_chars = data[0], 1 + data[1] % 16, 1 + data[2] * 8
    limits = InputLimits(max_inputs=max_inputs, max_input_chars=max_chars, max_body_bytes=64 * 1024)
    try:
        request = decode_request(data[3:], items, limits)
    except BadPayload:
        return
    assert len(request.inputs) == items <= max_inputs
    assert all(len(text) <= max_chars for text in request.inputs if isinstance(text, str))
    assert all(isinstance(key, str) for key in request.parameters)
    try:
        check_inputs(request.inputs)
    except InputError:
        pass


def write_seeds(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, body in SEEDS.items():
        header = bytes((len(body["inputs"]), 15, 255))
        (directory / name).write_bytes(header + msgpack.packb(body, use_bin_type=True))


def main() -> None:
    if sys.argv[1:2] == ["--write-seeds"]:
        write_seeds(Path(sys.argv[2]))
        return
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
