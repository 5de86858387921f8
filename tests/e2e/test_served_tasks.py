"""rerank and image models served by a real worker process through a real broker (issue 24).

One worker serves a tiny cross-encoder (``rerank``), a tiny ViT (``image-classification``) and
a tiny YOLOS (``object-detection``).  Pairs and images from concurrent requests share batches,
which the broker's STATS counts from the worker's heartbeats; a corrupt image fails alone; STATS
shows what READY said about each model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.daemons import Daemon, Daemons, broker_stats, start_broker, start_worker, wait_until
from tests.worker.tiny_models import image_bytes, make_tiny_bert, make_tiny_vit, make_tiny_yolos
from zbatch.client import AsyncClient
from zbatch.protocol import payloads
from zbatch.protocol.wire import Status

RERANK, CLASSIFY, DETECT = "tiny-rerank", "tiny-vit", "tiny-yolos"
Answer = tuple[Status, str, dict[str, Any]]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A broker and one worker serving the three models; yields the broker."""
    models = tmp_path_factory.mktemp("models")
    extra = (f"name={CLASSIFY},path={make_tiny_vit(models)},task=image-classification;"
             f"name={DETECT},path={make_tiny_yolos(models)},task=object-detection")
    with Daemons(tmp_path_factory.mktemp("logs")) as daemons:
        broker = daemons.add(start_broker(daemons.log_dir))
        daemons.add(start_worker(broker, daemons.log_dir, "w1", model_path=make_tiny_bert(models, "rerank"),
                                 model_name=RERANK, task="rerank", extra_models=extra))
        yield broker


def ask(broker: Daemon, requests: list[tuple[str, dict[str, Any]]]) -> list[Answer]:
    """Send every request at once; each answer's status, message and decoded payload."""
    async def go() -> list[Answer]:
        async with AsyncClient(broker.frontend) as client:
            replies = await asyncio.gather(*(client.request(model, payloads.encode_payload(body),
                                                            items=len(body["inputs"]))
                                             for model, body in requests))
        return [(r.status, r.message, payloads.decode_payload(r.payload) if r.payload else {}) for r in replies]

    return asyncio.run(go())


def model_stats(broker: Daemon, model: str) -> dict[str, Any]:
    stats = broker_stats(broker.frontend)
    assert stats is not None
    return dict(stats["models"][model])


def batches_for(broker: Daemon, model: str, items_before: int, items: int) -> int:
    """The model's batch count once the worker's heartbeats have counted ``items`` more items."""
    stats = wait_until(lambda: (s := model_stats(broker, model))["batched_items"] >= items_before + items and s,
                       10, f"{items} items of {model} in the broker's counts")
    return int(stats["batches"])


def test_pairs_from_concurrent_requests_share_batches_and_count_tokens(served: Daemon) -> None:
    before = model_stats(served, RERANK)
    requests = [(RERANK, {"inputs": [["what is red", f"the cat is red {i}"], ["dog", "a dog " * i]]})
                for i in range(8)]
    answers = ask(served, requests)
    assert all(status is Status.OK for status, _, _ in answers), answers
    for _, _, body in answers:
        assert len(body["outputs"]) == 2 and all(0.0 < score < 1.0 for score in body["outputs"])
        assert all(isinstance(count, int) and count >= 4 for count in body["tokens"])
    assert answers[0][2]["tokens"][1] == 4  # [CLS] dog [SEP] [SEP]: the text is empty
    assert batches_for(served, RERANK, before["batched_items"], 16) - before["batches"] < len(requests)


def test_images_from_concurrent_requests_share_batches_and_a_corrupt_one_fails_alone(served: Daemon) -> None:
    before = model_stats(served, CLASSIFY)
    requests = [(CLASSIFY, {"inputs": [image_bytes(30 + i, 20 + i, i), image_bytes(16, 16, 100 + i, "JPEG")],
                            "parameters": {"top_k": 2}}) for i in range(6)]
    requests.append((CLASSIFY, {"inputs": [image_bytes(24, 24, 7), b"GIF89a, then nothing"],
                                "parameters": {"top_k": 2}}))
    answers = ask(served, requests)
    *good, (status, message, _) = answers
    assert all(status is Status.OK for status, _, _ in good), good
    for _, _, body in good:
        assert "tokens" not in body
        assert all(len(labels) == 2 and {label["label"] for label in labels} <= {"cat", "dog", "bird"}
                   for labels in body["outputs"])
    assert status is Status.BAD_REQUEST
    assert message.startswith("inputs[1]: the input cannot be decoded as an image")
    batches = batches_for(served, CLASSIFY, before["batched_items"], 14) - before["batches"]
    assert batches < len(requests)


def test_detections_of_differently_sized_images(served: Daemon) -> None:
    sizes = [(40, 30), (64, 64), (20, 50)]
    answers = ask(served, [(DETECT, {"inputs": [image_bytes(w, h, w)], "parameters": {"threshold": 0.1}})
                           for w, h in sizes])
    for (status, _, body), (width, height) in zip(answers, sizes, strict=True):
        assert status is Status.OK
        (detections,) = body["outputs"]
        assert detections and all(set(d) == {"label", "score", "box"} and d["box"]["xmax"] <= width + 1
                                  and d["box"]["ymax"] <= height + 1 for d in detections)


def test_tokenize_and_wrong_kinds_of_input(served: Daemon) -> None:
    answers = ask(served, [
        (RERANK, {"inputs": ["hello world"], "operation": "tokenize"}),
        (RERANK, {"inputs": ["not a pair"]}),
        (CLASSIFY, {"inputs": ["a file name"]}),
        (CLASSIFY, {"inputs": ["a file name"], "operation": "tokenize"}),
        (RERANK, {"inputs": [["q", "t"]], "operation": "embed"}),
    ])
    (status, _, body), *refusals = answers
    assert status is Status.OK and body["tokens"] == [4]
    assert [token["text"] for token in body["outputs"][0]] == ["[CLS]", "hello", "world", "[SEP]"]
    expected = ["inputs[0] is str; rerank takes [query, text] pairs: arrays of two strings",
                "inputs[0] is str; image-classification takes images: the bytes of an image file",
                "image-classification models have no tokenizer; the 'tokenize' operation works on text",
                "'operation' must be one of 'run', 'tokenize'"]
    assert all(status is Status.BAD_REQUEST for status, _, _ in refusals)
    assert [message[:len(start)] for (_, message, _), start in zip(refusals, expected, strict=True)] == expected


def test_stats_show_what_ready_said_about_each_model(served: Daemon) -> None:
    assert model_stats(served, RERANK)["info"] == {"task": "rerank", "max_batch_size": 32, "max_length": 128,
                                                   "dtype": "float32"}
    for model, task in ((CLASSIFY, "image-classification"), (DETECT, "object-detection")):
        assert model_stats(served, model)["info"] == {"task": task, "max_batch_size": 32, "dtype": "float32",
                                                      "labels": ["cat", "dog", "bird"]}
