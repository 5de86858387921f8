"""The worker on CUDA, where a host has it: half precision by default, buckets warmed, CUDA graphs captured.

CI has no GPU, so this module runs on GPU hosts only (a lent H200 ran it for BENCHMARKS.md's GPU
section: ``python3 -m pytest tests/worker/test_gpu.py`` there); everything it relies on that a CPU
can check (the bucketed plan, the graphed pass's arithmetic, the dtype rule) is tested on the CPU in
tests/worker/test_shapes.py.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest
import torch

from scripts.benchmarks.common.texts import WORDS, shuffled
from worker.runners import ModelSpec, default_model_path, load_runner
from worker.runners.embeddings import EmbeddingRunner
from zbatch import testing
from zbatch.client import AsyncClient

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a GPU host)")

MODEL = os.environ.get("ZBATCH_MODEL_PATH") or default_model_path()
TEXTS = [*shuffled()[:63], " ".join(WORDS[:320])]  # the last one is over the model's 256 tokens
MIN_COSINE = 0.9999


def cosines(first: list[object], second: list[object]) -> np.ndarray:
    a = np.stack([np.asarray(x, np.float64) for x in first])
    b = np.stack([np.asarray(x, np.float64) for x in second])
    return np.asarray((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def reference() -> list[object]:
    return load_runner(ModelSpec("cpu", MODEL, device="cpu")).run(TEXTS, {})


@pytest.fixture(scope="module")
def on_cuda() -> EmbeddingRunner:
    runner = load_runner(ModelSpec("cuda", MODEL, device="cuda"))
    assert isinstance(runner, EmbeddingRunner)
    return runner


def test_auto_is_float16_on_cuda_and_its_vectors_are_float32s(on_cuda: EmbeddingRunner,
                                                            reference: list[object]) -> None:
    assert on_cuda.details.dtype == "float16" and on_cuda.spec.max_batch_size == 128
    assert cosines(on_cuda.run(TEXTS, {}), reference).min() >= MIN_COSINE


def test_every_batch_runs_in_a_warmed_bucket(on_cuda: EmbeddingRunner) -> None:
    assert on_cuda.buckets is not None
    shapes = set(on_cuda.buckets.shapes())
    for size in (1, 3, 17, 33, 100, 128):
        planned = on_cuda.plan(on_cuda.encode((TEXTS * 3)[:size], {}), {})
        for _, arrays in planned.groups:
            assert arrays["input_ids"].shape in shapes


def test_graphs_are_captured_for_every_bucket_and_answer_as_the_eager_pass(on_cuda: EmbeddingRunner,
                                                                           reference: list[object]) -> None:
    graphs = on_cuda._graphs
    assert graphs is not None and on_cuda.buckets is not None
    assert graphs.shapes == sorted(on_cuda.buckets.shapes())
    small = TEXTS[:8]
    graphed = on_cuda.run(small, {})
    saved, on_cuda._graphs = on_cuda._graphs, None
    try:
        eager = on_cuda.run(small, {})
    finally:
        on_cuda._graphs = saved
    assert cosines(graphed, eager).min() >= 0.99999
    assert cosines(graphed, reference[:8]).min() >= MIN_COSINE


def test_a_worker_on_cuda_serves_half_precision_vectors_equal_to_float32(tmp_path: Path,
                                                                         reference: list[object]) -> None:
    with testing.Daemons(tmp_path) as daemons:
        broker = daemons.add(testing.start_broker(tmp_path))
        daemons.add(testing.start_worker(broker, tmp_path, "gpu", model_path=MODEL, model_name="m", workers=1))
        stats = testing.broker_stats(broker.frontend)
        assert stats is not None
        (worker,) = stats["workers"]
        assert worker["device"].startswith("cuda")

        async def ask() -> list[object]:
            async with AsyncClient(broker.frontend) as client:
                answers = await asyncio.gather(*(client.infer("m", [text]) for text in TEXTS))
            return [answer[0] for answer in answers]

        assert cosines(asyncio.run(ask()), reference).min() >= MIN_COSINE
