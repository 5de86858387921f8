"""Coverage-guided fuzzing of the worker's request decoding and validation (atheris/libFuzzer).

Each input is a REQUEST payload, with the item count and the limits taken from
its first bytes, so the fuzzer also explores the limits' edges.  The payload
goes through :func:`worker.requests.decode_request` and, when it decodes,
through the input checks the worker applies as a request arrives, for every
task (texts, pairs, images) and every operation.  :class:`BadPayload` and
:class:`InputError` are the only exceptions allowed; anything else is a
crash, which libFuzzer saves and reports with a non-zero exit status.  Run it
with ``scripts/fuzz/run``; ``--write-seeds DIR`` writes valid payloads.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import atheris

with atheris.instrument_imports(include=["worker.requests", "worker.runners.spec", "zbatch.protocol"]):
    import msgpack

    from worker.requests import BadPayload, InputLimits, decode_request
    from worker.runners.spec import InputError, check_request
    from zbatch.protocol.vocabulary import EMBEDDINGS, IMAGE_TASKS, OPERATIONS, RERANK, TEXT_CLASSIFICATION

TASKS = (EMBEDDINGS, RERANK, TEXT_CLASSIFICATION, *IMAGE_TASKS, "fill-mask", "python:custom:Runner")
SEEDS: dict[str, dict[str, Any]] = {
    "texts": {"inputs": ["hello", "world"], "parameters": {"normalize": True}},
    "embeddings-options": {"inputs": ["a"], "parameters": {"dimensions": 8, "truncate": False,
                                                           "truncation_direction": "left"}},
    "pairs": {"inputs": [["query", "text"], {"query": "q", "text": "t"}], "parameters": None},
    "rerank": {"inputs": [["what is red", "the cat"], ["q", ""]], "parameters": {"raw_scores": True}},
    "mixed-classification": {"inputs": ["a text", ["text", "pair"]], "parameters": {"top_k": None}},
    "image": {"inputs": [b"\x89PNG\r\n\x1a\n"], "parameters": {"top_k": 3}},
    "images": {"inputs": [b"\xff\xd8\xff\xe0", b"GIF89a", b""], "parameters": {"threshold": 0.5}},
    "tokenize": {"inputs": ["hello world"], "operation": "tokenize", "parameters": {"add_special_tokens": False}},
    "run": {"operation": "run", "inputs": ["x"]},
    "nil-operation": {"inputs": ["x"], "operation": None, "parameters": None},
    "tokenizer-operation": {"inputs": ["9114256b104cca80"], "operation": "tokenizer"},
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
    assert request.operation in OPERATIONS
    for task in TASKS:
        try:
            check_request(task, request.operation, request.inputs)
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
