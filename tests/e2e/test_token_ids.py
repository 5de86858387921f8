"""Token ids as inputs through a real broker and real workers serving the default model, over ZeroMQ with
``zbatch.Client`` (issue 41, point 2): ids as the ``tokenize`` operation gives them embed to the text's own
vectors, and hostile ids each get one clear answer while normal traffic runs beside them."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from tests.daemons import Daemon
from worker.runners import DEFAULT_MODEL_NAME
from zbatch import AsyncClient, BadRequest, Client
from zbatch.protocol import payloads
from zbatch.protocol.messages import Reply
from zbatch.protocol.wire import Status

MODEL = DEFAULT_MODEL_NAME
MAX_LENGTH = 256  # the default model's max_seq_length
VOCABULARY = 30522
LONG = "the quick brown fox jumps over the lazy dog " * 60 + "and that is the end"
TEXTS = ["hello world", "Ünïcödé café 東京 and a dog", "a sentence about token ids travelling as arrays", LONG]


def send(broker: Daemon, bodies: list[dict[str, Any]]) -> list[Reply]:
    """Every body as its own request, all at once; each one's reply."""
    async def go() -> list[Reply]:
        async with AsyncClient(broker.frontend) as client:
            return await asyncio.wait_for(asyncio.gather(*(
                client.request(MODEL, payloads.encode_payload(body), items=len(body["inputs"]), timeout_ms=60_000)
                for body in bodies)), 120)

    return asyncio.run(go())


def tokenized(broker: Daemon, texts: list[str]) -> list[np.ndarray]:
    """Each text's ids as the worker's ``tokenize`` operation gives them: special tokens included, not truncated."""
    (reply,) = send(broker, [{"inputs": texts, "operation": "tokenize"}])
    assert reply.status is Status.OK, reply.message
    return [np.asarray([token["id"] for token in tokens], dtype=np.int64)
            for tokens in payloads.decode_payload(reply.payload)["outputs"]]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def broker(stack: dict[str, Daemon]) -> Daemon:
    return stack["broker"]


def test_ids_embed_to_the_texts_vectors_over_zeromq(broker: Daemon) -> None:
    ids = tokenized(broker, TEXTS)
    assert ids[-1].size > MAX_LENGTH  # tokenize does not truncate; run does, keeping [CLS] and [SEP]
    with Client(broker.frontend) as client:
        for parameters in ({}, {"truncation_direction": "left"}):
            from_text = client.infer(MODEL, TEXTS, parameters)
            from_ids = client.infer(MODEL, ids, parameters)
            mixed = client.infer(MODEL, [ids[0], TEXTS[1], ids[2], TEXTS[3]], parameters)
            for vectors in (from_ids, mixed):
                assert [cosine(a, b) >= 0.9999 for a, b in zip(vectors, from_text, strict=True)] == [True] * 4
        with pytest.raises(BadRequest, match=r"inputs\[0\]: token id -1 is outside"):
            client.infer(MODEL, [np.asarray([-1]), TEXTS[0]])
    (reply,) = send(broker, [{"inputs": ids}])
    assert payloads.decode_payload(reply.payload)["tokens"] == [*(each.size for each in ids[:3]), MAX_LENGTH]


def test_hostile_ids_each_get_one_clear_answer_beside_normal_traffic(broker: Daemon) -> None:
    (good,) = tokenized(broker, ["a normal request"])
    huge = np.concatenate([good[:1], np.full(100_000, good[1]), good[-1:]])
    hostile: list[tuple[dict[str, Any], str]] = [
        ({"inputs": [good, np.asarray([101, VOCABULARY, 102])]},
         f"inputs[1]: token id {VOCABULARY} is outside this model's vocabulary: ids run from 0 to {VOCABULARY - 1}"),
        ({"inputs": [np.asarray([101, -7, 102])]}, "inputs[0]: token id -7 is outside this model's vocabulary"),
        ({"inputs": [good.astype(np.float32)]}, "inputs[0] is a 1-dimensional float32 array; embeddings "
                                                "takes strings, or token ids"),
        ({"inputs": [np.stack([good, good])]}, "inputs[0] is a 2-dimensional int64 array"),
        ({"inputs": [huge], "parameters": {"truncate": False}},
         f"inputs[0]: this input has {huge.size} tokens and the model takes at most {MAX_LENGTH}"),
        ({"inputs": [np.asarray([], dtype=np.int64)]}, "inputs[0]: this input is an empty array of token ids"),
    ]
    bodies: list[dict[str, Any]] = []
    expected: list[str | None] = []  # None: a normal request, which must succeed
    for body, refusal in hostile:
        bodies += [{"inputs": ["a normal request"]}, body, {"inputs": [good]}]
        expected += [None, refusal, None]
    *replies, truncated = send(broker, [*bodies, {"inputs": [huge], "parameters": {"truncate": True}}])
    assert truncated.status is Status.OK and payloads.decode_payload(truncated.payload)["tokens"] == [MAX_LENGTH]
    for reply, message in zip(replies, expected, strict=True):
        if message is not None:
            assert reply.status is Status.BAD_REQUEST and reply.message.startswith(message), reply
        else:
            assert reply.status is Status.OK, reply.message
            (vector,) = payloads.decode_payload(reply.payload)["outputs"]
            assert vector.shape == (384,)
    with Client(broker.frontend) as client:
        after = client.infer(MODEL, ["a normal request", good])
    assert cosine(after[0], after[1]) >= 0.9999


def test_the_openai_sdk_sends_token_ids_through_the_gateway(stack: dict[str, Daemon], broker: Daemon) -> None:
    """OpenAI's ``input`` takes token ids (a list of whole numbers, or a list of such lists): the same vectors as
    the texts, ``usage`` counting the ids as run; an id outside the vocabulary is the SDK's BadRequestError."""
    import openai

    ids = tokenized(broker, TEXTS)
    client = openai.OpenAI(base_url=f"{stack['gateway'].url}/v1", api_key="unused", max_retries=0)
    from_text = client.embeddings.create(model=MODEL, input=TEXTS)
    from_ids = client.embeddings.create(model=MODEL, input=[each.tolist() for each in ids])
    one = client.embeddings.create(model=MODEL, input=ids[0].tolist(), encoding_format="float")
    assert from_ids.usage.prompt_tokens == from_text.usage.prompt_tokens == sum(e.size for e in ids[:3]) + MAX_LENGTH
    vectors = [np.asarray(each.embedding) for each in from_ids.data]
    for ours, theirs in zip([*vectors, np.asarray(one.data[0].embedding)], [*from_text.data, from_text.data[0]],
                            strict=True):
        assert cosine(ours, np.asarray(theirs.embedding)) >= 0.9999
    with pytest.raises(openai.BadRequestError, match=f"token id {VOCABULARY} is outside"):
        client.embeddings.create(model=MODEL, input=[[101, VOCABULARY, 102]])
    with pytest.raises(openai.BadRequestError, match="whole numbers"):
        client.embeddings.create(model=MODEL, input=[[101, -1, 102]])
