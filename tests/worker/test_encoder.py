"""The encoder thread with real text runners (tiny BERTs): what it encodes and plans ahead is what the model
runs, the model gives the same outputs as a plain run, and the encoder thread never calls torch."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest

from tests.worker.tiny_models import make_tiny_bert
from worker.assembler import Assembler, Batch, Counted, PendingRequest
from worker.encoder import UNENCODABLE, BatchJob, Encoder
from worker.engine import run_isolated
from worker.requests import parameters_key
from worker.runners import InputError, ModelSpec, load_runner
from worker.runners.text import TextRunner
from zbatch.testing import wait_until

TEXTS = ["hello world", "the cat is happy", "", "red " * 300, "a dog and a cat in the night", "big"]
PAIRS = [["is the cat happy", "the cat is happy"], ["red", "blue green red " * 50], ["a", ""]]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> TextRunner:
    runner = load_runner(ModelSpec("tiny", make_tiny_bert(tmp_path_factory.mktemp("enc"), "feature-extraction")))
    assert isinstance(runner, TextRunner)
    return runner


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> TextRunner:
    path = make_tiny_bert(tmp_path_factory.mktemp("rerank"), "rerank")
    runner = load_runner(ModelSpec("tiny-rerank", path, task="rerank"))
    assert isinstance(runner, TextRunner)
    return runner


class TorchCalls:
    """Every call into torch made by the threads started while it is installed (a profile hook per thread)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        module = frame.f_globals.get("__name__", "") if event == "call" else getattr(arg, "__module__", None) or ""
        if event in ("call", "c_call") and module.split(".")[0] == "torch":
            self.seen.append(f"{module}: {frame.f_code.co_name if event == 'call' else arg}")


@pytest.fixture
def watched_encoder(embedder: TextRunner, reranker: TextRunner) -> Iterator[tuple[Encoder, TorchCalls]]:
    calls = TorchCalls()
    threading.setprofile(calls)
    try:
        encoder = Encoder({"tiny": embedder, "tiny-rerank": reranker, "other": object()})
        encoder.start()
    finally:
        threading.setprofile(None)
    yield encoder, calls
    encoder.stop(timeout_s=10)


def pending(number: int, inputs: list[Any], parameters: dict[str, Any] | None = None) -> PendingRequest:
    parameters = parameters or {}
    return PendingRequest(f"job-{number}".encode(), inputs, parameters, parameters_key(parameters), float("inf"),
                          0.0)


def batch_of(*requests: PendingRequest) -> Batch:
    assembler = Assembler()
    for request in requests:
        assembler.add(request)
    batch = assembler.take_batch(1_000)
    assert batch is not None
    return batch


def wait_for(condition: Any) -> None:
    wait_until(condition, 30, "the encoder thread to get to it")


def run_job(runner: TextRunner, encoder: Encoder, job: BatchJob) -> list[Any]:
    """What the inference thread does with a job (worker.engine)."""
    encoder.settle(job)
    assert job.plan is not None

    def call(encodings: list[Any], parameters: dict[str, Any]) -> list[Any]:
        plan = job.plan if encodings is job.encodings else runner.plan(encodings, parameters)
        return runner.run_planned(plan)

    return run_isolated(call, job.encodings, job.batch.parameters)


def same(got: list[Any], runner: TextRunner, inputs: list[Any], parameters: dict[str, Any]) -> None:
    """``got`` (outcomes of a job) are the outcomes of running ``inputs`` the plain way, to the bit."""
    want = run_isolated(runner.run, inputs, parameters)
    assert len(got) == len(want)
    for mine, theirs in zip(got, want, strict=True):
        if isinstance(theirs, Counted):
            assert isinstance(mine, Counted) and mine.tokens == theirs.tokens
            assert np.array_equal(np.asarray(mine.output), np.asarray(theirs.output))
        else:
            assert mine == theirs


def test_requests_encoded_ahead_run_as_a_plain_batch_does(watched_encoder: tuple[Encoder, TorchCalls],
                                                         embedder: TextRunner) -> None:
    encoder, calls = watched_encoder
    requests = [pending(i, [text]) for i, text in enumerate(TEXTS[:3])] + [pending(9, TEXTS[3:])]
    for request in requests:
        encoder.encode_ahead("tiny", request)
    wait_for(lambda: all(r.encoded is not None for r in requests))
    assert all(isinstance(r.encoded, list) for r in requests)
    job = BatchJob("tiny", batch_of(*requests))
    got = run_job(embedder, encoder, job)
    same(got, embedder, TEXTS, {})
    assert calls.seen == []


def test_a_batch_planned_ahead_is_what_the_model_runs(watched_encoder: tuple[Encoder, TorchCalls],
                                                      reranker: TextRunner) -> None:
    """Pairs too (token type ids), some encoded ahead and one not: the encoder thread encodes the rest."""
    encoder, calls = watched_encoder
    early = pending(1, PAIRS[:2], {"raw_scores": True})
    encoder.encode_ahead("tiny-rerank", early)
    wait_for(lambda: early.encoded is not None)
    job = BatchJob("tiny-rerank", batch_of(early, pending(2, PAIRS[2:], {"raw_scores": True})))
    encoder.plan_ahead(job)
    wait_for(lambda: job.settled)
    assert job.plan is not None and len(job.encodings) == len(PAIRS)
    got = run_job(reranker, encoder, job)
    same(got, reranker, PAIRS, {"raw_scores": True})
    assert calls.seen == []


def test_truncation_settings_are_kept_per_request(watched_encoder: tuple[Encoder, TorchCalls],
                                                  embedder: TextRunner) -> None:
    encoder, _ = watched_encoder
    for parameters in ({"truncate": False}, {"truncation_direction": "left"}):
        request = pending(1, TEXTS, parameters)
        encoder.encode_ahead("tiny", request)
        wait_for(lambda request=request: request.encoded is not None)
        got = run_job(embedder, encoder, BatchJob("tiny", batch_of(request)))
        same(got, embedder, TEXTS, parameters)


def test_a_request_the_runner_refuses_is_left_to_the_plain_path(watched_encoder: tuple[Encoder, TorchCalls],
                                                               embedder: TextRunner) -> None:
    encoder, _ = watched_encoder
    request = pending(1, ["hello"], {"dimensions": 0})
    encoder.encode_ahead("tiny", request)
    wait_for(lambda: request.encoded is not None)
    assert request.encoded == UNENCODABLE
    job = BatchJob("tiny", batch_of(request))
    encoder.settle(job)
    assert job.settled and job.plan is None  # the engine runs it with runner.run, which refuses it as before
    with pytest.raises(InputError, match="'dimensions' must be"):
        embedder.run(["hello"], {"dimensions": 0})


def test_without_the_encoder_thread_the_inference_thread_encodes_and_plans_itself(embedder: TextRunner) -> None:
    encoder = Encoder({"tiny": embedder})  # never started
    assert encoder.serves("tiny") and not encoder.serves("tiny", "tokenize") and not encoder.serves("other")
    job = BatchJob("tiny", batch_of(pending(1, TEXTS[:2]), pending(2, TEXTS[2:])))
    got = run_job(embedder, encoder, job)
    same(got, embedder, TEXTS, {})


def test_the_profile_hook_sees_torch_calls() -> None:
    """The hook the tests above rely on does catch a thread that calls torch."""
    import torch

    calls = TorchCalls()
    threading.setprofile(calls)
    try:
        thread = threading.Thread(target=lambda: torch.ones(2).sum())
        thread.start()
    finally:
        threading.setprofile(None)
    thread.join()
    assert calls.seen
    assert sys.getprofile() is None


def test_encodings_pad_like_the_tokenizer(embedder: TextRunner, reranker: TextRunner, tmp_path: Path) -> None:
    """The planned padded arrays are exactly what the tokenizer pads, on either padding side."""
    embedder.set_length_grouping(False)  # on, the embedder packs instead (next test)
    try:
        for runner, inputs in ((embedder, TEXTS), (reranker, PAIRS)):
            tokenizer = runner._tokenizer
            for side in ("right", "left"):
                tokenizer.padding_side = side
                try:
                    plan = runner.plan(runner.encode(inputs, {}), {})
                    assert not plan.packed
                    texts = [tuple(each) if isinstance(each, list) else each for each in inputs]
                    for group, arrays in plan.groups:
                        want = tokenizer([texts[i] for i in group], padding=True, truncation=True,
                                         max_length=runner.max_length, return_tensors="np")
                        assert sorted(arrays) == sorted(want.keys())
                        for key, array in arrays.items():
                            assert np.array_equal(array, want[key]), (side, key)
                finally:
                    tokenizer.padding_side = "right"
    finally:
        embedder.set_length_grouping(True)


def test_packed_encodings_are_the_tokenizer_rows_end_to_end(embedder: TextRunner) -> None:
    """A packed plan holds each input's unpadded tokenizer rows, concatenated in batch order, and their lengths."""
    plan = embedder.plan(embedder.encode(TEXTS, {}), {})
    assert plan.packed
    ((group, arrays),) = plan.groups
    want = embedder._tokenizer([TEXTS[i] for i in group], truncation=True, max_length=embedder.max_length)
    assert sorted(arrays) == sorted([*(key for key in want if key != "attention_mask"), "lengths"])
    assert arrays["lengths"].tolist() == [len(row) for row in want["input_ids"]]
    for key in arrays.keys() - {"lengths"}:
        assert arrays[key].tolist() == [token for row in want[key] for token in row], key
