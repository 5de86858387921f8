"""The preparation pool with real text runners (tiny BERTs): what it encodes and plans ahead is what the model
runs, the model gives the same outputs as a plain run, and the pool never calls torch."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from types import FrameType
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest

from tests.worker.tiny_models import make_tiny_bert
from worker.assembler import Counted
from worker.engine import run_isolated
from worker.requests import parameters_key
from worker.runners import InputError, ModelSpec, load_runner
from worker.runners.spec import RUN
from worker.runners.text import TextRunner
from worker.stages import BatchWork, Prepared, PrepPool, Settled, settle
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
def watched_pool() -> Iterator[tuple[PrepPool, TorchCalls]]:
    calls = TorchCalls()
    threading.setprofile(calls)
    try:
        pool = PrepPool(threads=2)
        pool.start()
    finally:
        threading.setprofile(None)
    yield pool, calls
    pool.stop(timeout_s=10)


def work_of(*requests: tuple[list[Any], Future[list[Any]] | None], parameters: dict[str, Any] | None = None
            ) -> BatchWork:
    """A batch of requests' inputs, each with the future of its encodings (None: not prepared)."""
    inputs = [each for request_inputs, _ in requests for each in request_inputs]
    prepared = [None if future is None else Prepared(future, index)
                for request_inputs, future in requests for index in range(len(request_inputs))]
    return BatchWork(1, "tiny", RUN, parameters or {}, tuple(inputs), tuple(prepared))


def run_settled(runner: TextRunner, settled: Settled | None, parameters: dict[str, Any]) -> list[Any]:
    """What the inference thread does with a settled batch (worker.engine)."""
    assert settled is not None

    def call(encodings: list[Any], parameters: dict[str, Any]) -> list[Any]:
        plan = settled.plan if encodings is settled.encodings else runner.plan(encodings, parameters)
        return runner.run_planned(plan)

    return run_isolated(call, settled.encodings, parameters)


def same(got: list[Any], runner: TextRunner, inputs: list[Any], parameters: dict[str, Any]) -> None:
    """``got`` (outcomes of a batch) are the outcomes of running ``inputs`` the plain way, to the bit."""
    want = run_isolated(runner.run, inputs, parameters)
    assert len(got) == len(want)
    for mine, theirs in zip(got, want, strict=True):
        if isinstance(theirs, Counted):
            assert isinstance(mine, Counted) and mine.tokens == theirs.tokens
            assert np.array_equal(np.asarray(mine.output), np.asarray(theirs.output))
        else:
            assert mine == theirs


def encoded(pool: PrepPool, runner: TextRunner, inputs: list[Any],
            parameters: dict[str, Any] | None = None) -> Future[list[Any]]:
    future = pool.encode(runner, inputs, parameters or {}, parameters_key(parameters or {}))
    wait_until(future.done, 30, "the pool to encode a request")
    return future


def test_requests_encoded_ahead_run_as_a_plain_batch_does(watched_pool: tuple[PrepPool, TorchCalls],
                                                         embedder: TextRunner) -> None:
    pool, calls = watched_pool
    futures = [encoded(pool, embedder, [text]) for text in TEXTS[:3]] + [encoded(pool, embedder, TEXTS[3:])]
    assert all(isinstance(future.result(), list) for future in futures)
    work = work_of(*zip([[t] for t in TEXTS[:3]] + [TEXTS[3:]], futures, strict=True))
    got = run_settled(embedder, settle(embedder, work), {})
    same(got, embedder, TEXTS, {})
    assert calls.seen == []


def test_a_batch_planned_ahead_is_what_the_model_runs(watched_pool: tuple[PrepPool, TorchCalls],
                                                      reranker: TextRunner) -> None:
    """Pairs too (token type ids), some encoded ahead and one not: the pool encodes the rest."""
    pool, calls = watched_pool
    parameters = {"raw_scores": True}
    early = encoded(pool, reranker, PAIRS[:2], parameters)
    work = work_of((PAIRS[:2], early), (PAIRS[2:], None), parameters=parameters)
    planned = pool.plan(reranker, work)
    wait_until(planned.done, 30, "the pool to plan a batch")
    settled = planned.result()
    assert settled is not None and len(settled.encodings) == len(PAIRS)
    got = run_settled(reranker, settled, parameters)
    same(got, reranker, PAIRS, parameters)
    assert calls.seen == []


def test_requests_queued_together_share_one_tokenizer_call(embedder: TextRunner) -> None:
    """A pool thread that finds several requests of one model and parameters waiting encodes them at once."""
    pool = PrepPool(threads=1)  # started after the requests queue: its first turn finds them all
    futures = [pool.encode(embedder, [text], {}, parameters_key({})) for text in TEXTS]
    calls: list[int] = []
    original = embedder.encode

    def counting(inputs: list[Any], parameters: dict[str, Any]) -> list[Any]:
        calls.append(len(inputs))
        return original(inputs, parameters)

    embedder.encode = counting  # type: ignore[method-assign]
    try:
        pool.start()
        wait_until(lambda: all(future.done() for future in futures), 30, "the pool to encode the requests")
    finally:
        del embedder.encode
        pool.stop(timeout_s=10)
    assert calls == [len(TEXTS)]
    assert [future.result()[0].length for future in futures] == [each.length for each in embedder.encode(TEXTS, {})]


def test_whoever_needs_work_not_started_does_it_itself(embedder: TextRunner) -> None:
    """Rule 3: a future the pool has not started is cancelled and done by the caller, who never waits for it."""
    pool = PrepPool(threads=1)  # never started: nothing it was given ever starts
    future = pool.encode(embedder, TEXTS[:2], {}, parameters_key({}))
    settled = settle(embedder, work_of((TEXTS[:2], future), (TEXTS[2:], None)))
    assert future.cancelled()
    same(run_settled(embedder, settled, {}), embedder, TEXTS, {})
    planned = pool.plan(embedder, work_of((TEXTS, None)))
    assert planned.cancel()  # the engine's move when the model frees before the pool got to the plan


def lengths(encodings: list[Any]) -> list[int]:
    return [encoding.length for encoding in encodings]


def test_token_ids_are_encoded_at_once_by_the_caller_and_texts_by_the_pool(embedder: TextRunner) -> None:
    """Rule 7: a request of ids only costs a few numpy calls, less than a hand-off; one with a text is the pool's."""
    pool = PrepPool(threads=1)  # never started: what it is given stays undone
    texts = TEXTS[:2]
    ids = [np.asarray(row, dtype=np.int32) for row in embedder._tokenizer(texts)["input_ids"]]  # as a sender makes
    done = pool.encode(embedder, ids, {}, parameters_key({}))
    assert done.done() and lengths(done.result()) == lengths(embedder.encode(texts, {}))
    mixed = pool.encode(embedder, [ids[0], texts[1]], {}, parameters_key({}))
    assert not mixed.done() and mixed.cancel()
    refused = pool.encode(embedder, [np.asarray([10**6], dtype=np.int32)], {"no_such_parameter": 1}, b"k")
    assert isinstance(refused.exception(timeout=0), InputError)  # the plain path reports it (rule 6)


def test_truncation_settings_are_kept_per_request(watched_pool: tuple[PrepPool, TorchCalls],
                                                  embedder: TextRunner) -> None:
    pool, _ = watched_pool
    for parameters in ({"truncate": False}, {"truncation_direction": "left"}):
        future = encoded(pool, embedder, TEXTS, parameters)
        got = run_settled(embedder, settle(embedder, work_of((TEXTS, future), parameters=parameters)), parameters)
        same(got, embedder, TEXTS, parameters)


def test_a_request_the_runner_refuses_is_left_to_the_plain_path(watched_pool: tuple[PrepPool, TorchCalls],
                                                               embedder: TextRunner) -> None:
    pool, _ = watched_pool
    future = encoded(pool, embedder, ["hello"], {"dimensions": 0})
    assert isinstance(future.exception(), InputError)
    assert settle(embedder, work_of((["hello"], future), parameters={"dimensions": 0})) is None
    with pytest.raises(InputError, match="'dimensions' must be"):  # what the engine's plain path answers
        embedder.run(["hello"], {"dimensions": 0})


def test_tokenizer_threads_encode_in_parallel_with_their_own_tokenizers(embedder: TextRunner) -> None:
    """Each thread encodes with a tokenizer of its own (a call mutates the tokenizer's truncation settings).  The
    tokenizers are kept, not their ids: a thread's own is freed when it ends, and another's may take its address."""
    seen: dict[str, Any] = {}

    def encode(name: str) -> None:
        embedder.encode(TEXTS, {"truncation_direction": "left" if name == "a" else "right"})
        seen[name] = embedder._own_tokenizer()

    threads = [threading.Thread(target=encode, args=(name,)) for name in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen["a"] is not seen["b"] and all(own is not embedder._tokenizer for own in seen.values())


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
